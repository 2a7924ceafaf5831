"""The command line: exact output and exit codes (in-process through vrl.cli.main)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import small_policy, vrl

from vrl.workspace import write_checkpoint


def save_policy(seed=0, bump=0.0):
    sd = small_policy(seed).state_dict()
    sd["2.bias"] = sd["2.bias"] + bump
    write_checkpoint(sd, "policy.safetensors")


def test_full_session(ws, capsys):
    code, out, _ = vrl(capsys, "init")
    assert code == 0 and out == f"Initialized empty vrl repository in {ws / '.vrl'}\n"
    save_policy()
    code, out, _ = vrl(capsys, "status")
    assert out == ("On branch main\nNo commits yet\n"
                   "policy.safetensors: not committed yet (vrl commit)\n")
    code, out, _ = vrl(capsys, "commit", "-m", "first", "--step", "1", "--set", "lr=0.001",
                       "--metric", "return=2.5", "--no-env")
    assert code == 0
    first = out.split()[2].rstrip("]")
    assert out == f"[main (root-commit) {first}] first\n 2 of 2 layers changed materially; " \
                  "1.7 kB of 1.7 kB new\n"
    code, out, _ = vrl(capsys, "status")
    assert out == "On branch main\npolicy.safetensors: no changes since HEAD\n"
    save_policy(bump=1.0)
    code, out, _ = vrl(capsys, "status")
    assert out.splitlines()[1] == "policy.safetensors: modified since HEAD"
    assert out.splitlines()[2].split() == ["layer", "shape", "status", "rel", "change", "max",
                                           "abs", "material"]
    assert out.splitlines()[3].split()[:4] == ["2", "4x32,", "4", "changed"]
    code, out, err = vrl(capsys, "checkout", "HEAD")
    assert code == 1 and out == "" and err == (
        "error: policy.safetensors has uncommitted changes; commit them, or use --force "
        "to discard them\n")
    code, out, _ = vrl(capsys, "commit", "-m", "second", "--step", "2", "--metric", "return=3",
                       "--no-env")
    second = out.split()[1].rstrip("]")
    assert out.endswith(" 1 of 2 layers changed materially; 16 B of 1.7 kB new\n")
    code, out, _ = vrl(capsys, "log", "--oneline")
    assert out == f"{second} (HEAD -> main) second\n{first} first\n"
    code, out, _ = vrl(capsys, "log", "--metrics", "return")
    assert out.splitlines() == [
        "commit        step  return  message", f"{second}  2     3       second",
        f"{first}  1     2.5     first"]
    code, out, _ = vrl(capsys, "log", "--json")
    data = json.loads(out)
    assert [d["message"] for d in data] == ["second", "first"]
    assert data[0]["metrics"] == {"return": 3}
    code, out, _ = vrl(capsys, "diff", "HEAD~1", "HEAD")
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["2", "4x32,", "4", "changed"] and lines[1].endswith("yes")
    assert lines[-1] == "1 of 2 layers changed materially; 16 B of 1.7 kB new"
    code, out, _ = vrl(capsys, "diff", "HEAD~1", "HEAD", "--threshold", "100")
    assert out.splitlines()[-1].startswith("0 of 2 layers changed materially")
    code, out, _ = vrl(capsys, "show", "HEAD~1")
    assert "Hyperparameters:\n  lr: 0.001" in out and "Metrics:\n  return: 2.5" in out
    code, out, _ = vrl(capsys, "show", "--json")
    assert json.loads(out)["id"].startswith(second)
    code, out, _ = vrl(capsys, "tag", "best", "HEAD~1")
    assert out == f"Tagged {first} as best\n"
    code, out, _ = vrl(capsys, "reset", "--hard", "best")
    assert out == f"HEAD is now at {first} first\n(was {second}; `vrl reset --hard {second}` " \
                  "undoes this)\n"
    code, out, _ = vrl(capsys, "status")
    assert out == "On branch main\npolicy.safetensors: no changes since HEAD\n"
    code, out, _ = vrl(capsys, "reflog")
    assert out.splitlines() == [f"{first} HEAD@{{0}}: reset: moving to best",
                                f"{second} HEAD@{{1}}: commit: second",
                                f"{first} HEAD@{{2}}: commit: first"]
    code, out, _ = vrl(capsys, "checkout", "-b", "exp", second)
    assert out == "Switched to a new branch 'exp'\nWrote policy.safetensors\n"
    code, out, _ = vrl(capsys, "branch")
    assert out == f"* exp  {second} second\n  main  {first} first\n"
    code, out, _ = vrl(capsys, "branch", "--json")
    assert json.loads(out) == {"current": "exp", "branches": {
        "exp": json.loads(vrl(capsys, "log", "-n", "1", "--json")[1])[0]["id"],
        "main": json.loads(vrl(capsys, "log", "main", "-n", "1", "--json")[1])[0]["id"]}}
    code, out, _ = vrl(capsys, "export", "main", "out.pt")
    assert out == f"Exported {first} to out.pt (4 tensors, 1.7 kB)\n"
    loaded = torch.load("out.pt", weights_only=True)
    assert torch.equal(loaded["2.bias"], small_policy().state_dict()["2.bias"])
    code, out, _ = vrl(capsys, "fsck")
    assert code == 0 and out == "checked 9 objects: ok\n"
    code, out, _ = vrl(capsys, "gc", "--grace", "0")
    assert code == 0 and out == "Removed 0 unreachable objects (0 B)\n"


@pytest.mark.parametrize("args, message", [
    (["log"], "error: not a vrl repository"),
    (["commit", "-m", "x"], "error: not a vrl repository"),
])
def test_not_a_repository(ws, capsys, args, message):
    code, out, err = vrl(capsys, *args)
    assert code == 1 and err.startswith(message) and err.count("\n") == 1


def test_errors_are_one_line_with_exit_code_1(ws, capsys):
    vrl(capsys, "init")
    cases = {
        ("show", "nope"): "error: unknown revision 'nope': not a branch, tag or commit id",
        ("commit",): "error: ",
        ("commit", "missing.safetensors"): "error: missing.safetensors: no such checkpoint",
        ("branch", "a..b"): "error: invalid branch name 'a..b'",
        ("tag", "-d", "nope"): "error: ",
    }
    for args, prefix in cases.items():
        code, out, err = vrl(capsys, *args)
        assert code == 1, args
        assert err.startswith(prefix) and err.count("\n") == 1, (args, err)
    save_policy()
    vrl(capsys, "commit", "-m", "a", "--no-env")
    code, out, err = vrl(capsys, "commit", "-m", "b", "--no-env")
    assert code == 1 and err.startswith("error: nothing changed since HEAD")
    code, out, err = vrl(capsys, "commit", "-m", "b", "--no-env", "--allow-empty")
    assert code == 0
    for bad in ["..", "/a", "a/", "x\x07", "refs/../x"]:
        code, out, err = vrl(capsys, "branch", bad)
        assert code == 1 and "invalid branch name" in err
    assert sorted(p.name for p in (ws / ".vrl" / "refs" / "heads").iterdir()) == ["main"]


def test_pickle_checkpoint_refused_and_nothing_written(ws, capsys):
    vrl(capsys, "init")
    torch.save({"w": torch.ones(2), "f": print}, "evil.pt")
    before = sorted(p for p in (ws / ".vrl").rglob("*"))
    code, out, err = vrl(capsys, "commit", "evil.pt", "-m", "x")
    assert code == 1 and "never unpickles" in err and err.count("\n") == 1
    assert sorted(p for p in (ws / ".vrl").rglob("*")) == before


def test_help_lists_commands(ws, capsys):
    code, out, _ = vrl(capsys, "--help")
    for name in ["init", "commit", "checkout", "export", "log", "show", "diff", "status",
                 "branch", "tag", "reset", "reflog", "gc", "fsck", "train"]:
        assert f"  {name} " in out


def test_a_plugin_naming_a_missing_object_does_not_break_the_cli(tmp_path):
    """A stale install's entry point (module imports, attribute gone): `vrl --help` still
    works and the command itself is a one-line error."""
    info = tmp_path / "vrl_stale_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vrl-stale-plugin\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text("[vrl.commands]\nstale = vrl.cli:no_such_command\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")]), *sys.path]))
    run = [sys.executable, "-c", "import sys, vrl.cli; sys.exit(vrl.cli.main())"]
    helped = subprocess.run([*run, "--help"], env=env, capture_output=True, text=True,
                            cwd=tmp_path)
    assert helped.returncode == 0 and "stale" in helped.stdout, helped.stderr
    failed = subprocess.run([*run, "stale"], env=env, capture_output=True, text=True,
                            cwd=tmp_path)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "vrl.cli, which failed to import" in failed.stderr


def test_every_builtin_command_is_listed_where_it_loads_from():
    """Command modules load lazily from vrl.cli.BUILTINS: it names exactly the commands
    each module defines."""
    import importlib

    from vrl.cli import BUILTINS

    for module in set(BUILTINS.values()):
        defined = {c.name for c in importlib.import_module(f"vrl.cli.{module}").COMMANDS}
        assert defined == {n for n, m in BUILTINS.items() if m == module}, module


def test_help_lists_every_command_and_a_typo_gets_a_suggestion(ws, capsys):
    from vrl.cli import BUILTINS

    code, out, _ = vrl(capsys, "--help")
    assert code == 0
    listed = [line.split()[0] for line in out.split("Commands:\n")[1].splitlines()]
    assert set(BUILTINS) <= set(listed) and "train" in listed
    code, out, err = vrl(capsys, "checkot")
    assert code == 2 and "No such command 'checkot'. Did you mean 'checkout'?" in err
    code, out, err = vrl(capsys, "init")
    code, out, err = vrl(capsys, "remote", "lst")
    assert code == 2 and "Did you mean 'list'?" in err


def test_log_shows_every_commit_with_its_refs_and_a_detached_head(ws, capsys):
    """The full log: one block per commit, refs named after the commit they point at
    (HEAD's branch first, tags, other branches, a detached HEAD)."""
    from vrl import Repo

    vrl(capsys, "init")
    save_policy()
    vrl(capsys, "commit", "-m", "first\n\nthe body", "--step", "1", "--metric", "return=2.5",
        "--no-env")
    save_policy(bump=1.0)
    vrl(capsys, "commit", "-m", "second", "--no-env")
    repo = Repo(ws)
    second = repo.resolve("HEAD")
    first = repo.resolve("HEAD~1")
    vrl(capsys, "tag", "best", first)
    vrl(capsys, "branch", "side", first)
    time1, time2 = repo.read_commit(first).time, repo.read_commit(second).time
    code, out, _ = vrl(capsys, "log")
    assert code == 0 and out == (
        f"commit {second} (HEAD -> main)\nAuthor: tester\nDate:   {time2}\n\n    second\n\n"
        f"commit {first} (side, tag: best)\nAuthor: tester\nDate:   {time1}\nStep:   1\n"
        "Metrics: return=2.5\n\n    first\n    \n    the body\n\n")
    repo.checkout(first)  # detached
    code, out, _ = vrl(capsys, "log", "--oneline", "main")
    assert out == f"{second[:12]} (main) second\n{first[:12]} (HEAD, side, tag: best) first\n"


def test_checkout_says_when_the_commit_came_from_another_file(ws, capsys):
    """`vrl commit model.safetensors` then `vrl checkout HEAD~1`: the workspace checkpoint
    (policy.safetensors) is written, and one line on stderr says that model.safetensors
    was not, and how to make checkout write it."""
    from vrl import Repo

    assert vrl(capsys, "init")[0] == 0
    versions = []
    for bump in (0.0, 1.0):
        sd = small_policy().state_dict()
        sd["2.bias"] = sd["2.bias"] + bump
        write_checkpoint(sd, "model.safetensors")
        versions.append((ws / "model.safetensors").read_bytes())
        assert vrl(capsys, "commit", "model.safetensors", "-m", f"v{bump}", "--no-env")[0] == 0
    repo = Repo(ws)
    v1, v2 = repo.resolve("HEAD~1"), repo.resolve("HEAD")
    assert repo.read_commit(v1).meta == {"source_file": "model.safetensors"}

    def note(oid):
        return (f"note: wrote policy.safetensors (the workspace checkpoint), not "
                f"model.safetensors, which {oid[:12]} was committed from; to make checkout "
                f"write model.safetensors: vrl config set core.workspace model.safetensors\n")

    code, out, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 0 and out.endswith("Wrote policy.safetensors\n") and err == note(v1)
    assert (ws / "policy.safetensors").read_bytes() == versions[0]
    assert (ws / "model.safetensors").read_bytes() == versions[1]  # not touched
    code, _, err = vrl(capsys, "checkout", "main")
    assert code == 0 and err == note(v2)
    code, _, err = vrl(capsys, "reset", "--hard", "HEAD~1")
    assert code == 0 and err == note(v1)
    assert (ws / "policy.safetensors").read_bytes() == versions[0]
    assert vrl(capsys, "reset", "--hard", v2)[0] == 0  # main back where it was
    code, _, err = vrl(capsys, "checkout", "HEAD", "--no-workspace")
    assert code == 0 and err == ""  # nothing written, nothing to say
    # what the note says to do: checkout then writes model.safetensors, and says nothing
    assert vrl(capsys, "config", "set", "core.workspace", "model.safetensors")[0] == 0
    code, out, err = vrl(capsys, "checkout", "main", "--force")
    assert code == 0 and out.endswith("Wrote model.safetensors\n") and err == ""
    code, out, err = vrl(capsys, "checkout", "HEAD~1")
    assert code == 0 and err == "" and (ws / "model.safetensors").read_bytes() == versions[0]
    # the workspace file itself records nothing (its commits keep the ids they had), nor
    # does a file outside the work tree
    assert vrl(capsys, "checkout", "main")[0] == 0
    save_policy(bump=2.0)
    assert vrl(capsys, "commit", "-m", "ws", "--no-env", "--allow-empty")[0] == 0
    assert vrl(capsys, "commit", "policy.safetensors", "-m", "p", "--no-env",
               "--allow-empty")[0] == 0
    assert repo.read_commit(repo.resolve("HEAD")).meta == {"source_file": "policy.safetensors"}
    assert vrl(capsys, "commit", "model.safetensors", "-m", "m", "--no-env",
               "--allow-empty")[0] == 0
    assert repo.read_commit(repo.resolve("HEAD")).meta == {}
    outside = ws.parent / f"{ws.name}-outside.safetensors"
    write_checkpoint(small_policy(5).state_dict(), outside)
    assert vrl(capsys, "commit", str(outside), "-m", "o", "--no-env")[0] == 0
    assert repo.read_commit(repo.resolve("HEAD")).meta == {}
