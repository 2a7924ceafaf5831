"""The code blocks of the Markdown documentation, and the markers that tell
`tests/test_docs.py` how to run them.

Markers are HTML comments (invisible on GitHub), each on its own line:

* `<!-- docs-test: skip (REASON) -->` on the line before a fence: the block is not run (it
  needs a GPU, an S3 bucket, a training run of minutes...); the test reports it skipped
  with REASON, and still compiles it (a syntax error is caught all the same).
* `<!-- docs-test: setup` ... `-->`: the lines between are Python run in the file's
  namespace at that point, before the blocks that follow (the `model` an example assumes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((.+)\)\s*-->\s*$")
SETUP = re.compile(r"^<!--\s*docs-test:\s*setup\s*$")
MARKER = re.compile(r"^\s*<!--\s*docs-test:")


@dataclass
class Block:
    path: Path
    line: int  # the first line of the code (1-based), for tracebacks
    lang: str  # "python", "bash", "" ...; "setup" for a setup comment
    code: str
    section: str  # the last heading above it ("### The store")
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block and setup comment of `path`, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    section, skip, i = "", None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            section = line.strip()
        fence = FENCE.match(line)
        if SETUP.match(line):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->")
            found.append(Block(path, i + 2, "setup", "\n".join(lines[i + 1:end]) + "\n",
                               section))
            i = end + 1
            continue
        if fence:
            end = next(j for j in range(i + 1, len(lines))
                       if lines[j].rstrip() == fence.group(1))
            found.append(Block(path, i + 2, fence.group(2), "\n".join(lines[i + 1:end]) + "\n",
                               section, skip))
            skip, i = None, end + 1
            continue
        marked = SKIP.match(line)
        if marked:
            skip = marked.group(1)
        elif MARKER.match(line):  # (one in prose, inside backquotes, is no marker)
            raise ValueError(f"{path.name}:{i + 1}: unknown docs-test marker: {line}")
        elif line.strip():
            skip = None  # (a skip marker applies to the fence right after it only)
        i += 1
    return found
