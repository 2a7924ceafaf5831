"""`vrl status` and `vrl commit` compare a workspace checkpoint with HEAD by its tensors'
content, not by its container: the same weights as `.pt` or `.safetensors` are unchanged."""

import pytest
import torch
from helpers import small_policy, vrl

from vrl import Repo
from vrl.workspace import write_checkpoint

FORMATS = ["policy.safetensors", "policy.pt"]


@pytest.mark.parametrize("first, second", [FORMATS, FORMATS[::-1]])
def test_same_tensors_in_another_format_are_clean_and_commit_nothing(ws, capsys, first,
                                                                     second):
    assert vrl(capsys, "init", "--workspace", first)[0] == 0
    state = small_policy(0).state_dict()
    write_checkpoint(state, first)
    # the other file holds the same tensors, in another container and key order
    write_checkpoint(dict(reversed(list(state.items()))), second)
    assert vrl(capsys, "commit", "-m", "one", "--no-env")[0] == 0
    code, _, err = vrl(capsys, "commit", second, "-m", "two", "--no-env")
    assert code == 1 and err.startswith("error: nothing changed since HEAD") \
        and "--allow-empty" in err and err.count("\n") == 1
    assert len(Repo(ws).log()) == 1
    code, out, _ = vrl(capsys, "status")
    assert code == 0 and out == f"On branch main\n{first}: no changes since HEAD\n"
    # committed anyway, HEAD holds the other container: the workspace is still clean
    assert vrl(capsys, "commit", second, "-m", "two", "--no-env", "--allow-empty")[0] == 0
    code, out, _ = vrl(capsys, "status")
    assert out == f"On branch main\n{first}: no changes since HEAD\n"
    # a changed tensor is still a change, whatever the format
    state["2.bias"] = state["2.bias"] + 1.0
    write_checkpoint(state, second)
    assert vrl(capsys, "commit", second, "-m", "three", "--no-env")[0] == 0
    code, out, _ = vrl(capsys, "status")
    assert out.splitlines()[1] == f"{first}: modified since HEAD"


def test_same_tensors_other_dtype_or_structure_is_a_change(ws, capsys):
    vrl(capsys, "init")
    state = {"w": torch.arange(4.0)}
    write_checkpoint(state, "policy.safetensors")
    vrl(capsys, "commit", "-m", "one", "--no-env")
    torch.save({"model": state}, "nested.pt")  # the same tensor under another name
    assert vrl(capsys, "commit", "nested.pt", "-m", "two", "--no-env")[0] == 0
    torch.save({"w": torch.arange(4.0).double()}, "double.pt")
    assert vrl(capsys, "commit", "double.pt", "-m", "three", "--no-env")[0] == 0
