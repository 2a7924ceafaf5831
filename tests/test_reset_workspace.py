"""`vrl reset --hard` and uncommitted workspace edits: it refuses, as checkout does, to
overwrite content no snapshot holds, so the undo it prints restores everything (issue 28)."""

import numpy as np
from helpers import vrl
from safetensors.numpy import save_file

from vrl import Repo


def write(value: float) -> None:
    save_file({"w": np.full(4, value, np.float32)}, "policy.safetensors")


def two_commits(capsys) -> tuple[str, str]:
    vrl(capsys, "init")
    write(1.0)
    vrl(capsys, "commit", "-m", "one", "--no-env")
    write(2.0)
    vrl(capsys, "commit", "-m", "two", "--no-env")
    repo = Repo(".")
    return repo.resolve("HEAD~1"), repo.resolve("HEAD")


def test_reset_hard_refuses_to_discard_uncommitted_edits(ws, capsys):
    one, two = two_commits(capsys)
    write(3.0)
    edited = (ws / "policy.safetensors").read_bytes()
    code, out, err = vrl(capsys, "reset", "--hard", "HEAD~1")
    assert code == 1 and out == "" and err == (
        "error: policy.safetensors has uncommitted changes that reset --hard would discard; "
        "commit it (`vrl commit`), or use --force to discard it\n")
    assert Repo(ws).head() == two and (ws / "policy.safetensors").read_bytes() == edited
    # a soft reset leaves the file alone: allowed
    code, out, _ = vrl(capsys, "reset", "HEAD~1")
    assert code == 0 and (ws / "policy.safetensors").read_bytes() == edited
    vrl(capsys, "reset", two)
    code, out, err = vrl(capsys, "reset", "--hard", "--force", "HEAD~1")
    assert code == 0, err
    assert out == f"HEAD is now at {one[:12]} one\n(was {two[:12]}; `vrl reset --hard " \
                  f"{two[:12]}` undoes this)\n"
    code, out, _ = vrl(capsys, "status")
    assert out.endswith("policy.safetensors: no changes since HEAD\n")


def test_reset_hard_goes_on_where_nothing_is_lost(ws, capsys):
    one, two = two_commits(capsys)
    # the file already holds the target
    write(1.0)
    code, out, err = vrl(capsys, "reset", "--hard", one)
    assert code == 0, err
    # no file at all: nothing to lose
    (ws / "policy.safetensors").unlink()
    code, _, err = vrl(capsys, "reset", "--hard", two)
    assert code == 0, err
    assert (ws / "policy.safetensors").exists()
    # and the printed undo restores ref and file both
    vrl(capsys, "reset", "--hard", one)
    code, _, err = vrl(capsys, "reset", "--hard", two)
    assert code == 0, err
    code, out, _ = vrl(capsys, "status")
    assert out == "On branch main\npolicy.safetensors: no changes since HEAD\n"


def test_force_without_hard_is_a_usage_error(ws, capsys):
    two_commits(capsys)
    code, _, err = vrl(capsys, "reset", "--force", "HEAD~1")
    assert code == 2 and "--force only applies with --hard" in err
