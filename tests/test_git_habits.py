"""Git habits on the command line (issue 28): `vrl remote` and `vrl remote -v` list the
remotes, `vrl branch -r` / `-a` the remote-tracking branches, names aligned."""

import json

import pytest
from helpers import vrl
from test_views import at, state

from vrl import Repo


@pytest.fixture
def repo(ws):
    repo = Repo.init(ws)
    first = repo.commit(state(0), env=False, time=at(0), message="first", author="t")
    repo.commit(state(1), env=False, time=at(1), message="second\n\nbody", author="t")
    repo.branch("a-long-branch", first)
    return repo


def test_remote_without_a_command_lists_the_names(repo, ws, capsys):
    assert vrl(capsys, "remote") == (0, "", "")
    vrl(capsys, "remote", "add", "origin", str(ws / "r.vrl"))
    vrl(capsys, "remote", "add", "lab", "s3://bucket/team", "-o", "profile=lab")
    code, out, err = vrl(capsys, "remote")
    assert (code, out, err) == (0, "lab\norigin\n", "")
    code, out, _ = vrl(capsys, "remote", "-v")
    assert (code, out) == (0, "lab\ts3://bucket/team (fetch)\nlab\ts3://bucket/team (push)\n"
                              f"origin\t{ws / 'r.vrl'} (fetch)\norigin\t{ws / 'r.vrl'} (push)\n")
    assert vrl(capsys, "remote", "--verbose")[1] == out


def test_remote_v_hides_a_password_written_into_the_config_by_hand(repo, ws, capsys):
    with open(ws / ".vrl" / "config", "a") as f:
        f.write('[remote "old"]\n\turl = ssh://me:hunter2@host/x?token=abc\n')
    code, out, _ = vrl(capsys, "remote", "-v")
    assert code == 0 and "hunter2" not in out and "abc" not in out
    assert out == ("old\tssh://me:***@host/x?token=*** (fetch)\n"
                   "old\tssh://me:***@host/x?token=*** (push)\n")


def test_remote_subcommands_still_work(repo, ws, capsys):
    assert vrl(capsys, "remote", "add", "origin", str(ws / "r.vrl"))[0] == 0
    assert vrl(capsys, "remote", "list")[1] == "origin\n"
    assert vrl(capsys, "remote", "rename", "origin", "up")[1] == "Renamed remote origin to up\n"
    assert vrl(capsys, "remote", "remove", "up")[1] == "Removed remote up\n"
    assert vrl(capsys, "remote")[1] == ""
    code, _, err = vrl(capsys, "remote", "lst")
    assert code == 2 and "Did you mean 'list'?" in err
    code, out, _ = vrl(capsys, "remote", "--help")
    assert code == 0 and "add" in out and "-v, --verbose" in out


def test_remote_outside_a_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = vrl(capsys, "remote")
    assert code == 1 and err.startswith("error: not a vrl repository")


def test_branch_lists_aligned_and_r_a_show_remote_tracking_branches(repo, capsys):
    ids = {name: oid[:12] for name, oid in repo.branches().items()}
    first, second = ids["a-long-branch"], ids["main"]
    code, out, _ = vrl(capsys, "branch")
    assert out == (f"  a-long-branch  {first} first\n"
                   f"* main           {second} second\n")
    assert vrl(capsys, "branch", "-r") == (0, "", "")
    repo.refs.update("refs/remotes/origin/main", repo.resolve("main"))
    repo.refs.update("refs/remotes/origin/exp", repo.resolve("a-long-branch"))
    code, out, _ = vrl(capsys, "branch", "-r")
    assert (code, out) == (0, f"  origin/exp   {first} first\n"
                              f"  origin/main  {second} second\n")
    code, out, _ = vrl(capsys, "branch", "-a")
    assert (code, out) == (0, f"  a-long-branch        {first} first\n"
                              f"* main                 {second} second\n"
                              f"  remotes/origin/exp   {first} first\n"
                              f"  remotes/origin/main  {second} second\n")
    assert vrl(capsys, "branch", "--all")[1] == out
    data = json.loads(vrl(capsys, "branch", "-a", "--json")[1])
    assert data == {"current": "main", "branches": repo.branches(),
                    "remotes": {"origin/exp": repo.resolve("a-long-branch"),
                                "origin/main": repo.resolve("main")}}
    assert json.loads(vrl(capsys, "branch", "-r", "--json")[1]) == {
        "current": "main", "remotes": data["remotes"]}
    code, _, err = vrl(capsys, "branch", "-a", "x")
    assert code == 2 and "take no NAME" in err


def test_branch_names_an_unborn_current_branch(ws, capsys):
    repo = Repo.init(ws)
    assert vrl(capsys, "branch")[1] == "* main  (no commits yet)\n"
    repo.refs.update("refs/remotes/origin/main", repo.commit(
        state(0), env=False, time=at(0), message="m", author="t", ref="refs/heads/other"))
    repo.checkout("other")
    repo.refs.update("refs/heads/other", None)  # HEAD on a branch with no commit again
    code, out, _ = vrl(capsys, "branch", "-a")
    assert out.splitlines()[0] == "* other                (no commits yet)"


def test_new_forms_print_no_control_characters(ws, capsys):
    """Messages, authors and a hand-written remote URL with escape sequences are shown
    escaped by every new form, as by the old ones."""
    evil = "\x1b]0;pwned\x07\x1b[31m"
    repo = Repo.init(ws)
    repo.commit(state(0), env=False, time=at(0), message=f"m{evil}\nline2{evil}",
                author=f"mallory{evil}")
    repo.refs.update("refs/remotes/origin/main", repo.head())
    with open(ws / ".vrl" / "config", "a") as f:
        f.write(f'[remote "origin"]\n\turl = /tmp/x{evil}\n')
    for args in (["log", "--graph"], ["log", "--graph", "--oneline", "--all"],
                 ["log", "--all"], ["branch", "-a"], ["branch", "-r"], ["remote"],
                 ["remote", "-v"]):
        code, out, err = vrl(capsys, *args)
        assert code == 0, (args, err)
        assert "\x1b" not in out + err and "\x07" not in out + err, args
    assert "\\x1b]0;pwned" in vrl(capsys, "log", "--graph")[1]
