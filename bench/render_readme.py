"""Splice the benchmark tables (bench/out/<name>.md) into README.md.

README marks each table with `<!-- table:<name> -->` ... `<!-- /table:<name> -->`; a
table whose .md file is missing is left as it is. Run by `dvc repro` after the benches.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"


def render(readme: str) -> tuple[str, list[str]]:
    updated = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        table = OUT / f"{name}.md"
        if not table.exists():
            return match.group(0)
        updated.append(name)
        return f"<!-- table:{name} -->\n{table.read_text().strip()}\n<!-- /table:{name} -->"

    text = re.sub(r"<!-- table:([\w-]+) -->\n.*?<!-- /table:\1 -->", replace, readme,
                  flags=re.S)
    return text, updated


def main() -> int:
    path = ROOT / "README.md"
    text, updated = render(path.read_text())
    path.write_text(text)
    print(f"updated tables: {', '.join(updated) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
