"""The documentation's examples run: every Python block of README.md and docs/*.md (per
file, in order, in one namespace, in a scratch directory), and the shell commands of
README's tour of the store. Markers in the Markdown skip a block or set one up
(`tests/docblocks.py`)."""

import os
import stat
import subprocess
import sys
import textwrap
import traceback

import pytest
from docblocks import ROOT, Block, blocks, doc_files

RUNNABLE = ("python", "setup")


@pytest.fixture
def torch_threads_kept():
    """An example may set torch's thread count (docs/loops.md does): restored after."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _python_files():
    return [p for p in doc_files() if any(b.lang == "python" and not b.skip
                                          for b in blocks(p))]


def _skipped():
    return [b for p in doc_files() for b in blocks(p) if b.lang == "python" and b.skip]


def _compiled(block: Block):
    # blank lines first: a traceback names the Markdown file and the line in it
    return compile("\n" * (block.line - 1) + block.code, str(block.path), "exec")


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(path, tmp_path, monkeypatch, torch_threads_kept):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VRL_AUTHOR", "docs-test")
    namespace = {"__name__": "__docs__"}
    ran = 0
    for block in blocks(path):
        if block.lang not in RUNNABLE:
            continue
        if block.skip:  # (reported, and compiled, by the next test)
            continue
        code = _compiled(block)
        failure = None
        try:
            exec(code, namespace)
        except Exception:
            failure = traceback.format_exc()
        if failure is not None:  # (out of the handler: the report shows one traceback)
            pytest.fail(f"the block at {block.where} failed:\n{failure}", pytrace=False)
        ran += 1
    assert ran


@pytest.mark.parametrize("block", _skipped(), ids=lambda b: b.where)
def test_skipped_blocks_say_why(block):
    _compiled(block)  # not run, but its syntax is checked
    pytest.skip(f"{block.where}: {block.skip}")


def test_a_failing_block_is_reported_with_its_place(tmp_path, monkeypatch):
    """The runner can fail: a broken example fails the test, naming file and line."""
    doc = tmp_path / "broken.md"
    doc.write_text("# T\n\n<!-- docs-test: setup\nx = 1\n-->\n\n```python\nassert x == 1\n"
                   "y = undefined_name\n```\n\n<!-- docs-test: skip (needs a GPU) -->\n"
                   "```python\nimport cuda_only\n```\n")
    found = blocks(doc)
    assert [(b.lang, b.line, b.skip) for b in found] == \
        [("setup", 4, None), ("python", 8, None), ("python", 14, "needs a GPU")]
    namespace: dict = {}
    exec(_compiled(found[0]), namespace)
    with pytest.raises(NameError) as caught:
        exec(_compiled(found[1]), namespace)
    where = traceback.extract_tb(caught.tb)[-1]
    assert (where.filename, where.lineno) == (str(doc), 9)
    doc.write_text("<!-- docs-test: skipped because -->\n```python\npass\n```\n")
    with pytest.raises(ValueError, match="broken.md:1: unknown docs-test marker"):
        blocks(doc)  # a misspelt marker is an error, not a block run by mistake


# ------------------------------------------------------------------ README's shell tour
# The tour's comments stand for training: each "# ... train ..." line becomes a command
# that saves a new policy.safetensors (numpy: no torch import, as the commands need none)
SAVE_POLICY = textwrap.dedent("""
    import pathlib, numpy as np
    from safetensors.numpy import save_file
    count = pathlib.Path(".saves")
    n = int(count.read_text()) + 1 if count.exists() else 0
    count.write_text(str(n))
    rng = np.random.default_rng(n)
    w = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    save_file({"actor.0.weight": w(64, 8), "actor.0.bias": w(64),
               "actor.2.weight": w(5, 64), "actor.2.bias": w(5)}, "policy.safetensors")
""")


def _tour_commands() -> list[Block]:
    return [b for b in blocks(ROOT / "README.md")
            if b.lang == "bash" and b.section == "### The store"][:2]


def test_readme_tour_of_the_store_runs(tmp_path):
    tour = _tour_commands()
    assert len(tour) == 2 and "vrl init" in tour[0].code and "vrl fsck" in tour[1].code
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vrl = bin_dir / "vrl"
    vrl.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m vrl "$@"\n')
    vrl.chmod(vrl.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "save_policy.py").write_text(SAVE_POLICY)
    work = tmp_path / "work"
    work.mkdir()
    script = ["set -euo pipefail"]
    for block in tour:
        for line in block.code.splitlines():
            if line.startswith("# ...") and "train" in line:
                line = f'"{sys.executable}" ../save_policy.py  {line}'
            script.append(line)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "VRL_AUTHOR": "docs-test"}
    run = subprocess.run(["bash", "-c", "\n".join(script)], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
    assert "layers changed materially" in run.stdout  # vrl diff HEAD~1 HEAD
    assert (work / "final.safetensors").is_file()  # vrl export
