import multiprocessing as mp
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py


@pytest.fixture(autouse=True)
def _restore_cwd():
    """Every test starts where the last one started: `vrl -C DIR` (run in-process by CLI
    tests) changes the process's directory, and a test that left it inside a mount it
    then unmounted would make every later test of the worker fail in os.getcwd()."""
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


@pytest.fixture
def repo(tmp_path):
    from vrl import Repo

    return Repo.init(tmp_path / "repo")


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """A scratch working directory for CLI tests."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VRL_AUTHOR", "tester")
    return tmp_path


@pytest.fixture(scope="module")
def ctx():
    """Processes forked from a server that has imported torch and vrl. It unpickles the
    test module's functions by name (`tests.<module>`), so the repository root must be on
    the path the server starts with, whatever the current directory is."""
    root = str(Path(__file__).resolve().parents[1])
    added = root not in sys.path
    if added:
        sys.path.append(root)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "vrl.repo", "vrl.tensors", "vrl.diff"])
    yield ctx
    if added:
        sys.path.remove(root)
