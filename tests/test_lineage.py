"""Lineage on the command line: `log` and `show` name the run a branch forked from and the
hyperparameters a snapshot changed; `diff A B` lists hyperparameter and environment
differences after the layers (issue 28)."""

import json

import numpy as np
import pytest
from helpers import vrl
from test_views import at, make_history, state

from vrl import Repo


@pytest.fixture
def hist(ws):
    repo = Repo.init(ws)
    return repo, make_history(repo)


def test_log_oneline_names_forks_and_hparam_changes(hist, capsys):
    _, ids = hist
    main2, exp0, exp1, exp2 = ids["main"][2], ids["exp"][0], ids["exp"][1], ids["exp2"][0]
    code, out, err = vrl(capsys, "log", "--oneline", "exp2")
    assert code == 0, err
    assert out.splitlines() == [
        f"{exp2[:12]} (exp2) exp2 0 [forked from exp at step 40 ({exp1[:12]}); "
        "extra (unset) -> True]",
        f"{exp1[:12]} exp 1",
        f"{exp0[:12]} exp 0 [forked from main at step 20 ({main2[:12]}); lr 0.1 -> 0.3, "
        "net.depth 2 -> 3]",
        f"{main2[:12]} main 2",
        f"{ids['main'][1][:12]} main 1",
        f"{ids['main'][0][:12]} main 0"]
    # the trunk's own line: nothing forked there
    code, out, _ = vrl(capsys, "log", "--oneline", "main")
    assert "[" not in out


def test_full_log_and_json_carry_the_fork_and_the_changes(hist, capsys):
    _, ids = hist
    exp0, main2 = ids["exp"][0], ids["main"][2]
    code, out, _ = vrl(capsys, "log", "-n", "1", "exp~2")
    assert code == 0 and out == (
        f"commit {exp0}\nForked from main at step 20 ({main2[:12]})\nAuthor: tester\n"
        f"Date:   {at(10)}\nStep:   30\nHparams: lr 0.1 -> 0.3, net.depth 2 -> 3\n"
        "Metrics: eval/score=7 return=10\n\n    exp 0\n\n")
    code, out, _ = vrl(capsys, "log", "--json", "exp")
    data = {d["id"]: d for d in json.loads(out)}
    assert data[exp0]["forked_from"] == {"run": "main", "id": main2, "step": 20}
    assert data[exp0]["hparam_changes"] == [
        {"key": "lr", "old": 0.1, "value": 0.3, "status": "changed"},
        {"key": "net.depth", "old": 2, "value": 3, "status": "changed"}]
    assert data[ids["exp"][1]]["forked_from"] is None
    assert data[ids["exp"][1]]["hparam_changes"] == []


def test_show_names_the_fork_and_lists_the_changed_hparams_first(hist, capsys):
    _, ids = hist
    exp0, main2 = ids["exp"][0], ids["main"][2]
    code, out, _ = vrl(capsys, "show", "exp~2")
    assert code == 0
    assert out.startswith(
        f"commit {exp0}\nParent: {main2}\nForked from main at step 20 ({main2[:12]})\n"
        f"Author: tester\nDate:   {at(10)}\nStep:   30\n\n    exp 0\n\n"
        f"Hyperparameters changed against the parent ({main2[:12]}):\n"
        "  lr: 0.1 -> 0.3\n  net.depth: 2 -> 3\n\nHyperparameters:\n  lr: 0.3\n")
    code, out, _ = vrl(capsys, "show", "--json", "exp~2")
    data = json.loads(out)
    assert data["forked_from"] == {"run": "main", "id": main2, "step": 20}
    assert [c["key"] for c in data["hparam_changes"]] == ["lr", "net.depth"]
    # a snapshot in the middle of a run: neither
    code, out, _ = vrl(capsys, "show", "exp~1")
    assert "Forked" not in out and "changed against" not in out


def test_diff_lists_hparam_and_env_differences_after_the_layers(ws, capsys):
    repo = Repo.init(ws)
    a = repo.commit(state(0), env={"python": "3.11", "cuda": "12.1"},
                    hparams={"learning_rate": 2.5e-4, "clip": 0.2}, step=0, message="a")
    b = repo.commit(state(1), env={"python": "3.12", "cuda": "12.1", "host": "gpu1"},
                    hparams={"learning_rate": 1e-4, "clip": 0.2, "ent": 0.01}, step=1,
                    message="b")
    code, out, _ = vrl(capsys, "diff", a, b)
    assert code == 0
    layers, _, settings = out.partition("\n\nHyperparameters:\n")
    assert layers.splitlines()[-1].endswith("new")  # the summary line ends the layers
    assert settings == ("  ent: (unset) -> 0.01\n  learning_rate: 0.00025 -> 0.0001\n\n"
                        "Environment:\n  host: (unset) -> gpu1\n  python: 3.11 -> 3.12\n")
    # one revision: against its parent, as the layers are
    code, out2, _ = vrl(capsys, "diff", "HEAD")
    assert out2 == out
    code, out, _ = vrl(capsys, "diff", "--json", b, a)
    data = json.loads(out)
    assert data["hparams"] == [
        {"key": "ent", "old": 0.01, "value": None, "status": "removed"},
        {"key": "learning_rate", "old": 1e-4, "value": 2.5e-4, "status": "changed"}]
    assert [e["key"] for e in data["env"]] == ["host", "python"] and "layers" in data
    # the same settings: nothing after the layers
    code, out, _ = vrl(capsys, "diff", a, a)
    assert "Hyperparameters" not in out and "Environment" not in out


def test_unrecorded_settings_are_no_change(ws, capsys):
    """A commit made without hyperparameters (or environment) leaves them unknown: no
    `lr: 0.1 -> (unset)` on every manual commit after the first."""
    repo = Repo.init(ws)
    repo.commit(state(0), env={"python": "3.11"}, hparams={"lr": 0.1}, message="a")
    repo.commit(state(1), env=False, message="b")
    code, out, _ = vrl(capsys, "log", "--oneline")
    assert "[" not in out
    code, out, _ = vrl(capsys, "diff", "HEAD~1", "HEAD")
    assert "Hyperparameters" not in out and "Environment" not in out


def test_a_run_that_went_on_past_a_branch_did_not_fork_from_it(ws, capsys):
    """A fork from another run's last snapshot, and a run going on past a branch made at
    its snapshot (a bookmark), have the same graph: the runs' reflogs tell them apart."""
    repo = Repo.init(ws)
    ids = [repo.commit({"w": np.full(2, i, np.float32)}, env=False, hparams={"lr": 0.1},
                       step=i, message=f"main {i}") for i in range(2)]
    repo.branch("older", ids[0])  # made after main 1, at main 0
    repo.branch("bookmark", ids[1])  # made at main's head, then main goes on
    ids.append(repo.commit({"w": np.full(2, 2, np.float32)}, env=False,
                           hparams={"lr": 0.1}, step=2, message="main 2"))
    code, out, _ = vrl(capsys, "log", "--oneline")
    assert "forked" not in out
    # a fork at a run's last snapshot
    repo.branch("lr-low", ids[2])
    fork = repo.commit({"w": np.full(2, 9, np.float32)}, env=False, hparams={"lr": 0.01},
                       step=3, message="fork", ref="refs/heads/lr-low")
    code, out, _ = vrl(capsys, "log", "--oneline", "-n", "1", "lr-low")
    assert out == (f"{fork[:12]} (lr-low) fork [forked from main at step 2 "
                   f"({ids[2][:12]}); lr 0.1 -> 0.01]\n")


def test_oneline_counts_the_changes_past_three(ws, capsys):
    repo = Repo.init(ws)
    repo.commit(state(0), env=False, hparams={k: 1 for k in "abcde"}, message="a")
    repo.commit(state(1), env=False, hparams={k: 2 for k in "abcde"}, message="b")
    code, out, _ = vrl(capsys, "log", "--oneline", "-n", "1")
    assert out.endswith(" b [a 1 -> 2, b 1 -> 2, c 1 -> 2, +2 more]\n")


def test_a_fork_made_by_train_from_shows_in_log_show_and_diff(ws, capsys):
    """The user's path: `vrl train --from small~1 --branch lr-low --set learning_rate=...`."""
    from test_train_cli import STEPS_PER_ITERATION, train

    vrl(capsys, "init")
    steps = str(3 * STEPS_PER_ITERATION)
    train(capsys, "--steps", steps, "--branch", "small")
    train(capsys, "--steps", steps, "--from", "small~1", "--branch", "lr-low",
          "--set", "learning_rate=1e-4")
    repo = Repo(ws)
    point = repo.resolve("small~1")
    first = repo.resolve("lr-low")
    assert repo.read_commit(first).parents == (point,)
    fork = f"forked from small at step {2 * STEPS_PER_ITERATION} ({point[:12]})"
    code, out, _ = vrl(capsys, "log", "--oneline", "lr-low")
    line = out.splitlines()[0]  # (the message holds the return)
    assert line.startswith(f"{first[:12]} (HEAD -> lr-low, tag: best/lr-low) iter 3") and \
        line.endswith(f" [{fork}; learning_rate 0.00025 -> 0.0001]")
    code, out, _ = vrl(capsys, "log", "--oneline", "small")
    assert "forked" not in out  # the run lr-low forked from
    code, out, _ = vrl(capsys, "show", "lr-low")
    assert f"\nF{fork[1:]}\n" in out and "\n  learning_rate: 0.00025 -> 0.0001\n" in out
    code, out, _ = vrl(capsys, "diff", "small", "lr-low")
    assert f"\nsmall and lr-low share history up to {point[:12]} (step " in out
    assert "\nHyperparameters:\n  learning_rate: 0.00025 -> 0.0001\n" in out


def test_diff_of_two_runs_says_where_they_part(hist, capsys):
    _, ids = hist
    code, out, _ = vrl(capsys, "diff", "main", "exp2")
    assert code == 0
    assert (f"new\n\nmain and exp2 share history up to {ids['main'][2][:12]} (step 20)\n\n"
            "Hyperparameters:\n  extra: (unset) -> True\n  lr: 0.1 -> 0.3\n") in out
    code, out, _ = vrl(capsys, "diff", "--json", "main", "exp2")
    assert json.loads(out)["common_ancestor"] == ids["main"][2]
    # one run's line: nothing to say
    code, out, _ = vrl(capsys, "diff", "main~3", "main")
    assert "share history" not in out
    code, out, _ = vrl(capsys, "diff", "--json", "main~3", "main")
    assert json.loads(out)["common_ancestor"] == ids["main"][1]


def test_a_value_of_another_type_is_a_change(ws, capsys):
    """1, 1.0 and True are equal in Python but not in a config: compared as stored."""
    repo = Repo.init(ws)
    repo.commit(state(0), env=False, hparams={"a": 1, "b": [1, {"c": True}]}, message="x")
    repo.commit(state(1), env=False, hparams={"a": 1.0, "b": [1, {"c": 1}]}, message="y")
    repo.commit(state(2), env=False, hparams={"a": 1.0, "b": [1, {"c": 1}]}, message="z")
    code, out, _ = vrl(capsys, "log", "--oneline")
    assert out.splitlines()[0].endswith(" z")
    assert out.splitlines()[1].endswith(' y [a 1 -> 1.0, b [1, {"c": true}] -> [1, {"c": 1}]]')


def test_a_clone_names_the_forks_of_its_remote(ws, capsys):
    """A clone makes its branches (and remote-tracking ones) after every snapshot: no
    reflog of it can say a run was made later than the one forked from it."""
    import os

    (ws / "a").mkdir()
    os.chdir(ws / "a")
    repo = Repo.init(".")
    ids = [repo.commit({"w": np.full(2, i, np.float32)}, env=False, hparams={"lr": 0.1},
                       step=i, message=f"main {i}") for i in range(2)]
    repo.branch("lr-low", ids[1])  # forked at main's last snapshot
    fork = repo.commit({"w": np.full(2, 9, np.float32)}, env=False, hparams={"lr": 0.01},
                       step=2, message="fork", ref="refs/heads/lr-low")
    vrl(capsys, "remote", "add", "origin", str(ws / "shared.vrl"))
    assert vrl(capsys, "push", "-q", "--create", "--all")[0] == 0
    os.chdir(ws)
    assert vrl(capsys, "clone", str(ws / "shared.vrl"), "b", "-q")[0] == 0
    os.chdir(ws / "b")
    code, out, err = vrl(capsys, "log", "--oneline", "-n", "1", "origin/lr-low")
    assert code == 0, err
    # (the clone checked out the newest branch, lr-low; main is origin's)
    assert out == (f"{fork[:12]} (HEAD -> lr-low, origin/lr-low) fork [forked from "
                   f"origin/main at step 1 ({ids[1][:12]}); lr 0.1 -> 0.01]\n")
    vrl(capsys, "checkout", "-b", "main", "origin/main")  # made now, at the fork point
    code, out, err = vrl(capsys, "log", "--oneline", "-n", "1", "lr-low")
    assert out == (f"{fork[:12]} (lr-low, origin/lr-low) fork [forked from main at step 1 "
                   f"({ids[1][:12]}); lr 0.1 -> 0.01]\n"), err


def test_the_trunk_that_went_on_after_a_branch_was_made_is_no_fork(ws, capsys):
    """git's everyday branching: `checkout -b lr-low` at main's snapshot, commit there
    first, then main goes on. The reflogs say which ref was there: lr-low forked from main,
    whatever the times of their next commits say."""
    repo = Repo.init(ws)
    base = repo.commit(state(0), env=False, step=0, time=at(0), message="base")
    repo.checkout("main", create_branch="lr-low")
    low = repo.commit(state(1), env=False, step=1, time=at(1), message="low")
    repo.checkout("main")
    repo.commit(state(2), env=False, step=1, time=at(2), message="main 1")
    code, out, err = vrl(capsys, "log", "--oneline", "main")
    assert code == 0 and "[" not in out, out
    code, out, _ = vrl(capsys, "log", "--oneline", "lr-low")
    assert out.splitlines()[0] == (f"{low[:12]} (lr-low) low [forked from main at step 0 "
                                   f"({base[:12]})]")


def test_a_run_moved_onto_another_line_forked_where_it_arrived(ws, capsys):
    """A PBT exploit (or `reset --hard` to another run) moves a branch onto another run's
    line, then commits there. That run did not fork from it, even where the exploit's
    commit is older than the source's next snapshot: the reflog says who arrived where."""
    repo = Repo.init(ws)
    repo.commit(state(0), env=False, step=0, time=at(0), message="m0 a",
                ref="refs/heads/m0")
    source = repo.commit(state(1), env=False, step=1, time=at(1), message="m0 b",
                         ref="refs/heads/m0")
    repo.refs.update("refs/heads/m1", repo.resolve("m0~1"), expected=None,
                     reason="branch: Created from m0~1")
    repo.commit(state(2), env=False, step=1, time=at(2), message="m1 own",
                ref="refs/heads/m1")
    repo.refs.update("refs/heads/m1", source, reason="pbt: exploit m1 <- m0 round 1")
    copied = repo.commit(state(3), env=False, step=2, time=at(3), message="m1 exploits m0",
                         ref="refs/heads/m1")
    repo.commit(state(4), env=False, step=2, time=at(4), message="m0 c", ref="refs/heads/m0")
    code, out, err = vrl(capsys, "log", "--oneline", "m0")
    assert code == 0 and "[" not in out, out
    code, out, _ = vrl(capsys, "log", "--oneline", "m1")
    assert out.splitlines()[0] == (f"{copied[:12]} (m1) m1 exploits m0 [forked from m0 at "
                                   f"step 1 ({source[:12]})]")
