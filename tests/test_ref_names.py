"""Branch, tag and remote names follow Git's rules (git check-ref-format, and `git branch`'s
refusal of a leading '-'): a name that would be read as an option is never created."""

import pytest
import torch
from helpers import vrl

from vrl import Repo
from vrl.errors import InvalidRefNameError
from vrl.refs import check_ref_name
from vrl.remote import add_remote
from vrl.workspace import write_checkpoint

DASHED = ["-x", "-", "--force", "-d", "-x/y"]


@pytest.mark.parametrize("name", DASHED)
def test_short_names_starting_with_a_dash_are_refused(repo, name):
    repo.commit({"w": torch.ones(3)}, message="c0")
    for make, what in ((repo.branch, "branch"), (repo.tag, "tag")):
        with pytest.raises(InvalidRefNameError, match=f"invalid {what} name .*starts with '-'"):
            make(name)
    with pytest.raises(InvalidRefNameError, match="invalid remote name .*starts with '-'"):
        add_remote(repo, name, "/tmp/elsewhere")
    assert list(repo.branches()) == ["main"] and repo.tags() == {}
    assert "remote" not in repo.config.path.read_text()
    with pytest.raises(InvalidRefNameError):
        Repo.init(repo.workdir.parent / "other", branch=name)


@pytest.mark.parametrize("name", ["a-", "x-y", "feature/-x", "v1.0-rc1"])
def test_a_dash_elsewhere_is_fine(repo, name):
    assert check_ref_name(name, "branch") == name
    repo.commit({"w": torch.ones(3)}, message="c0")
    repo.branch(name)
    repo.tag(name)
    assert name in repo.branches() and name in repo.tags()


def test_full_ref_names_follow_git(tmp_path):
    # git check-ref-format accepts refs/heads/-x (only `git branch` refuses the short name)
    assert check_ref_name("refs/heads/-x") == "refs/heads/-x"
    for bad in ("refs/heads/a..b", "refs/heads/x.lock", "refs/heads/.x", "refs/heads/x/",
                "refs/heads/a@{1}", "refs/heads/a b", "refs/heads/a\x7f", "refs/heads/a:b"):
        with pytest.raises(InvalidRefNameError):
            check_ref_name(bad)


@pytest.mark.parametrize("args, what", [
    (["branch", "--", "-x"], "branch"),
    (["tag", "--", "-x"], "tag"),
    (["checkout", "-b", "-x"], "branch"),
    (["remote", "add", "--", "-x", "elsewhere"], "remote"),
    (["init", "-b", "-x", "sub"], "branch"),
])
def test_cli_refuses_a_leading_dash_in_one_line(ws, capsys, args, what):
    vrl(capsys, "init")
    torch.manual_seed(0)
    write_checkpoint(torch.nn.Linear(2, 2).state_dict(), "policy.safetensors")
    assert vrl(capsys, "commit", "-m", "c0", "--no-env")[0] == 0
    code, out, err = vrl(capsys, *args)
    assert code != 0 and out == "", (args, out)
    assert err.count("\n") == 1 and "'-x'" in err and "starts with '-'" in err, err
    assert f"invalid {what} name" in err
    assert sorted(p.name for p in (ws / ".vrl" / "refs" / "heads").iterdir()) == ["main"]
    assert not (ws / ".vrl" / "refs" / "tags").exists() or \
        not any((ws / ".vrl" / "refs" / "tags").iterdir())
    assert "remote" not in (ws / ".vrl" / "config").read_text()
    assert not (ws / "sub").exists()
