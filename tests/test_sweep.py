"""`vrl sweep` (trials as `vrl train` subprocesses, skip / resume, failures, Ctrl-C) and
`vrl compare --group-by` (mean and sample std per group) and branch patterns."""

import contextlib
import io
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_same, commands_added, vrl

from trainer.sweep import sweep as sweep_command
from vrl import Repo, groups
from vrl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=2",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--device", "cpu"]
PER_ITERATION = 2 * 16 * 4
STEPS = 3 * PER_ITERATION
GRID = ["sweep", "lr", "--grid", "learning_rate=1e-4,3e-4", "--seeds", "2", "--steps",
        str(STEPS), *SMALL]
BRANCHES = [f"sweep/lr/learning_rate={lr}-s{seed}" for lr in ("1e-4", "3e-4")
            for seed in (1, 2)]
# `vrl sweep` outside this process: the entry point may not be installed yet (an editable
# install lists entry points as they were at install time)
SCRIPT = ("import sys; from vrl.cli import cli, main; from trainer.sweep import sweep; "
          "cli.add_command(sweep); sys.exit(main(sys.argv[1:]))")


@pytest.fixture(autouse=True, scope="module")
def registered():
    with commands_added(sweep_command):
        yield


def test_sweep_is_registered_as_a_vrl_command():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vrl.commands"]["sweep"] == "trainer.sweep:sweep"


def run(*args):
    """`vrl ARGS` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def refs_of(repo):
    return dict(sorted(repo.refs.list("refs/").items()))


def iterations(repo, rev):
    return [e.commit.meta["iteration"] for e in repo.log(rev)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished 2 x 2 sweep (two learning rates x two seeds), two trials at a time."""
    where = tmp_path_factory.mktemp("sweep") / "store"
    where.mkdir()
    before = os.getcwd()
    os.chdir(where)
    try:
        os.environ.setdefault("VRL_AUTHOR", "tester")
        assert run("init")[0] == 0
        result = run(*GRID, "--workers", "2")
    finally:
        os.chdir(before)
    return where, result


@pytest.fixture
def copy(swept, tmp_path, monkeypatch):
    """The finished sweep's store, to change."""
    target = tmp_path / "store"
    shutil.copytree(swept[0], target)
    monkeypatch.chdir(target)
    return Repo(target)


def test_grid_makes_one_branch_per_trial_with_its_values_and_seed(swept):
    where, (code, out, err) = swept
    assert code == 0, out + err
    repo = Repo(where)
    assert sorted(b for b in repo.branches() if b.startswith("sweep/")) == BRANCHES
    for branch in BRANCHES:
        hp = repo.read_commit(repo.resolve(branch)).hparams
        assert hp["learning_rate"] == (1e-4 if "1e-4" in branch else 3e-4)
        assert hp["seed"] == int(branch[-1])
        # every trial's every snapshot arrived, though two trials committed at once
        assert iterations(repo, branch) == [3, 2, 1]
        assert repo.read_commit(repo.resolve(branch)).step == STEPS
    assert repo.current_branch() == "main"  # HEAD is back where it was
    assert out.count(" done ") == 4 and "4 done, 0 skipped (finished), 0 failed" in out
    state = json.loads((where / ".vrl/sweeps/lr/sweep.json").read_text())
    trials = state["trials"]
    assert sorted(t["branch"] for t in trials.values()) == BRANCHES
    assert {t["status"] for t in trials.values()} == {"finished"}
    for name in trials:
        log = (where / ".vrl/sweeps/lr" / f"{name}.log").read_text()
        assert "vrl train" in log and '"vrl/branch"' in log
    # --workers 2: the first two trials ran at the same time
    spans = sorted((t["started"], t["ended"]) for t in trials.values())
    assert spans[1][0] < spans[0][1]
    assert run("-C", str(where), "fsck")[0] == 0


def test_running_it_again_skips_the_finished_trials(swept, monkeypatch):
    where, _ = swept
    monkeypatch.chdir(where)
    repo = Repo(where)
    before = refs_of(repo)
    for args in (GRID, ["sweep", "lr", "--resume"]):
        code, out, err = run(*args)
        assert code == 0, out + err
        assert out.count(" skip ") == 4 and "0 done, 4 skipped" in out
        assert f"(finished: {STEPS} of {STEPS} steps)" in out
    assert refs_of(repo) == before
    # another definition under the same name is refused, nothing started
    code, _, err = run("sweep", "lr", "--grid", "learning_rate=1e-3", *SMALL)
    assert code == 1 and "another definition" in err and err.count("\n") == 1
    assert refs_of(repo) == before


def test_resume_continues_an_unfinished_trial_exactly(copy):
    repo = copy
    branch = BRANCHES[1]
    finished = repo.load(branch)
    others = {b: repo.resolve(b) for b in BRANCHES if b != branch}
    repo.branch(branch, f"{branch}~1", force=True)  # as if stopped after iteration 2
    cut = repo.resolve(branch)
    code, out, err = run("sweep", "lr", "--resume")
    assert code == 0, out + err
    assert f"resume  {branch}" in out and "1 done, 3 skipped" in out
    assert iterations(repo, branch) == [3, 2, 1] and repo.resolve(f"{branch}~1") == cut
    assert_same(repo.load(branch)["model"], finished["model"])  # bit for bit
    assert_same(repo.load(branch)["algo"], finished["algo"])
    assert {b: repo.resolve(b) for b in others} == others
    log = (repo.vrl_dir / "sweeps/lr" / f"{branch.rpartition('/')[2]}.log").read_text()
    assert f"--from {branch}" in log
    # a larger total continues every trial (here only checked, not run)
    code, out, _ = run(*GRID, "--steps", str(STEPS + PER_ITERATION), "--dry-run")
    assert code == 0 and out.count("--from sweep/lr/") == 4


def test_a_failing_trial_is_reported_and_the_others_finish(ws):
    Repo.init(ws)
    # 3 minibatches do not divide the 128-sample rollout: only the trainer can tell
    code, out, err = run("sweep", "mb", "--grid", "num_minibatches=3,2", "--steps",
                         str(PER_ITERATION), *SMALL[:6], *SMALL[8:])
    assert code == 1, out + err
    assert "FAILED  sweep/mb/num_minibatches=3-s1  rc 1" in out
    assert "num_minibatches 3 does not divide the rollout" in out
    assert "done    sweep/mb/num_minibatches=2-s1" in out and "1 done, 0 skipped" in out
    assert "sweep/mb/num_minibatches=3-s1" not in Repo(ws).branches()
    state = json.loads((ws / ".vrl/sweeps/mb/sweep.json").read_text())
    assert state["trials"]["num_minibatches=3-s1"]["status"] == "failed"


def test_one_sweep_name_runs_in_one_process_at_a_time(ws):
    import fcntl

    Repo.init(ws)
    where = ws / ".vrl/sweeps/busy"
    where.mkdir(parents=True)
    with open(where / "lock", "w") as held:
        held.write("4242\n")
        held.flush()
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        code, out, err = run("sweep", "busy", "--grid", "learning_rate=1e-4", *SMALL)
    assert code == 1 and "is running in another process (pid 4242)" in err
    assert not Repo(ws).branches()


def plan(*args):
    code, out, err = run("sweep", "rs", "--random", "learning_rate=loguniform:1e-5,1e-3",
                         "--random", "ent_coef=choice:0,0.01", "--trials", "5", "--dry-run",
                         *args)
    assert code == 0, err
    return out.splitlines()


def test_random_search_with_a_fixed_sampler_seed_is_reproducible(ws):
    Repo.init(ws)
    first = plan("--sampler-seed", "3")
    assert len(first) == 5 and first == plan("--sampler-seed", "3")
    assert first != plan("--sampler-seed", "4")
    rates = []
    for i, line in enumerate(first, 1):
        branch, _, command = line.partition(": ")
        assert branch.startswith(f"sweep/rs/t{i}-learning_rate=") and branch.endswith("-s1")
        value = command.split("--set learning_rate=")[1].split()[0]
        assert f"learning_rate={value}," in branch  # the name holds the value trained with
        rates.append(float(value))
        assert "--set ent_coef=0 " in command or "--set ent_coef=0.01 " in command
    assert all(1e-5 <= r <= 1e-3 for r in rates) and len(set(rates)) == 5
    assert not (ws / ".vrl/sweeps").exists()  # a dry run writes nothing


@pytest.mark.parametrize("args, message", [
    (["--grid", "learning_rate"], "--grid 'learning_rate': give KEY=V1,V2"),
    (["--grid", "learning_rate="], "--grid 'learning_rate=': give KEY=V1,V2"),
    (["--grid", "lr=1e-4,3e-4"], "unknown ppo config key 'lr'"),
    (["--grid", "learning_rate=1e-4,-1"], "learning_rate must be in (0, inf), got -1.0"),
    (["--random", "learning_rate=normal:0,1"], "DIST one of uniform"),
    (["--random", "learning_rate=loguniform:0,1"], "LOW > 0"),
    (["--grid", "learning_rate=1e-4", "--trials", "3"], "--trials counts --random draws"),
    (["--grid", "learning_rate=1e-4", "--seed", "3"], "--seed is set by the sweep"),
    (["--grid", "learning_rate=1e-4", "--bogus"], "No such option '--bogus'"),
    (["--grid", "learning_rate=1e-4", "--seeds", "0"], "--seeds '0'"),
    ([], "give at least one --grid"),
    # an env that no trial could make: one line, not a failure in every trial
    (["--grid", "learning_rate=1e-4", "--env", "CartPole-v1"], "unknown env 'CartPole-v1'"),
    (["--grid", "learning_rate=1e-4", "--env", "gym:NoSuchEnv-v0"],
     "gym:NoSuchEnv-v0: Environment `NoSuchEnv` doesn't exist"),
])
def test_bad_input_is_one_line_and_starts_nothing(ws, args, message):
    Repo.init(ws)
    code, out, err = run("sweep", "bad", *args, *SMALL)
    assert code != 0 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (ws / ".vrl/sweeps").exists() and not Repo(ws).branches()


def interrupt_sweep(ws, steps):
    """Start a 2-trial sweep in a process of its own and send it SIGINT once the first
    trial has committed a snapshot: (exit code, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]), "VRL_AUTHOR": "tester"}
    args = [sys.executable, "-c", SCRIPT, "sweep", "int", "--grid",
            "learning_rate=1e-4,3e-4", "--steps", str(steps), *SMALL]
    proc = subprocess.Popen(args, cwd=ws, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    repo = Repo(ws)
    deadline = time.monotonic() + 60
    while "sweep/int/learning_rate=1e-4-s1" not in repo.branches() and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_ctrl_c_stops_the_running_trial_with_a_snapshot_and_starts_no_other(ws):
    Repo.init(ws)
    steps = 100 * PER_ITERATION  # ~3 s of training: time to stop it half-way
    code, out, err = interrupt_sweep(ws, steps)
    first, second = (f"sweep/int/learning_rate={lr}-s1" for lr in ("1e-4", "3e-4"))
    assert code == 130, out + err
    assert f"stopped {first}" in out and "vrl sweep int --resume" in err
    repo = Repo(ws)
    assert second not in repo.branches()  # never started
    stopped_at = repo.read_commit(repo.resolve(first)).step
    assert stopped_at < steps
    state = json.loads((ws / ".vrl/sweeps/int/sweep.json").read_text())
    assert state["trials"]["learning_rate=1e-4-s1"]["status"] == "interrupted"
    # what --resume will do: continue the first in place, start the second
    code, out, _ = run("sweep", "int", "--resume", "--dry-run")
    assert code == 0 and f"{first}: vrl train --no-progress --json --from {first} --steps" in out
    assert f"--seed 1 --steps {steps} --device cpu --branch {second}" in out


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_to_the_end(ws):
    Repo.init(ws)
    steps = 100 * PER_ITERATION
    assert interrupt_sweep(ws, steps)[0] == 130
    code, out, err = run("sweep", "int", "--resume")
    assert code == 0, out + err
    assert "resume  sweep/int/learning_rate=1e-4-s1" in out and "2 done, 0 skipped" in out
    repo = Repo(ws)
    assert iterations(repo, "sweep/int/learning_rate=1e-4-s1") == list(range(100, 0, -1))
    assert iterations(repo, "sweep/int/learning_rate=3e-4-s1") == list(range(100, 0, -1))


# ---------------------------------------------------------------------------- compare


def test_group_by_on_a_sweep_matches_a_hand_computation(swept, monkeypatch):
    where, _ = swept
    monkeypatch.chdir(where)
    code, out, _ = run("compare", "sweep/lr/*", "--json")
    rows = json.loads(out)["rows"]
    assert code == 0 and [r["name"] for r in rows] == BRANCHES
    code, out, _ = run("compare", "sweep/lr/*", "--group-by", "learning_rate", "--json")
    data = json.loads(out)
    assert code == 0 and [g["key"] for g in data["groups"]] == [
        {"learning_rate": 1e-4}, {"learning_rate": 3e-4}]
    metric = "losses/value_loss"
    for group, members in zip(data["groups"], (rows[:2], rows[2:]), strict=True):
        assert group["n"] == 2 and group["runs"] == [r["name"] for r in members]
        for part in ("last", "best"):
            values = [r["metrics"][metric][part] for r in members]
            got = group["metrics"][metric][part]
            assert math.isclose(got["mean"], statistics.mean(values))
            assert math.isclose(got["std"], statistics.stdev(values))
        assert group["steps"]["mean"] == STEPS
    code, out, err = run("compare", "sweep/lr/*", "--group-by", "sweep",
                         "--metrics", metric)
    table = [line.split() for line in out.strip().splitlines()]
    assert code == 0 and table[0] == ["sweep", "runs", "steps", metric, f"{metric}:best"]
    assert [row[:3] for row in table[1:]] == [["lr/learning_rate=1e-4", "2", "384"],
                                             ["lr/learning_rate=3e-4", "2", "384"]]
    assert "+-" in out and "sample std" in err


def test_group_by_mean_and_std_by_hand(ws, capsys):
    import numpy as np

    repo = Repo.init(ws)
    returns = {("a", 0.1): [1.0, 2.0, 4.0], ("b", 0.2): [3.0, float("nan")], ("c", 0.3): [5.0]}
    for (tag, lr), values in returns.items():
        for seed, value in enumerate(values, 1):
            repo.commit({"w": np.full(2, seed, np.float32)}, env=False, step=10 * seed,
                        hparams={"lr": lr, "seed": seed, "net": {"depth": 2}},
                        metrics={"return": value, "loss": -value},
                        ref=f"refs/heads/sweep/{tag}/lr={lr}-s{seed}")
    repo.commit({"w": np.zeros(2, np.float32)}, env=False, hparams={"lr": 0.1, "seed": 9},
                metrics={"return": 7.0}, ref="refs/heads/other")
    data = groups.compare_groups(repo, ["lr"], ["sweep/*"])
    a, b, c = data["groups"]
    assert a["key"] == {"lr": 0.1} and a["n"] == 3
    last = a["metrics"]["return"]["last"]
    assert last["mean"] == pytest.approx(7 / 3) and last["n"] == 3
    assert last["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2
                                                   + (4 - 7 / 3) ** 2) / 2))
    assert a["steps"]["mean"] == 20
    # a non-finite value counts as a run but not in the statistics; one value has no std
    assert b["metrics"]["return"]["last"] == {"n": 1, "mean": 3.0, "std": None,
                                              "min": 3.0, "max": 3.0}
    assert c["metrics"]["return"]["last"]["std"] is None
    # every run, grouped by two keys: `other` joins lr 0.1 only where its seed is ignored
    assert [g["n"] for g in groups.compare_groups(repo, ["lr"])["groups"]] == [4, 2, 1]
    assert [g["key"]["sweep"] for g in groups.compare_groups(repo, ["sweep"])["groups"]] == [
        "a/lr=0.1", "b/lr=0.2", "c/lr=0.3", "other"]
    assert [g["n"] for g in groups.compare_groups(repo, ["lr", "net.depth"])["groups"]] == [
        3, 1, 2, 1]
    # sorted by a metric's mean: best first; lower is better for a loss
    order = groups.compare_groups(repo, ["lr"], ["sweep/*"], sort="return")["groups"]
    assert [g["key"]["lr"] for g in order] == [0.3, 0.2, 0.1]
    order = groups.compare_groups(repo, ["lr"], ["sweep/*"], sort="loss")["groups"]
    assert [g["key"]["lr"] for g in order] == [0.3, 0.2, 0.1]
    code, out, _ = vrl(capsys, "compare", "sweep/a/*", "--group-by", "lr", "--metrics",
                       "return")
    assert code == 0 and out.splitlines()[1].split() == ["0.1", "3", "20", "2.333", "+-",
                                                         "1.528", "2.333", "+-", "1.528"]
    code, out, _ = vrl(capsys, "compare", "--group-by", "lr", "--csv", "--metrics", "return")
    assert code == 0 and out.splitlines()[0] == ("lr,runs,steps,return:mean,return:std,"
                                                 "return:n,return:best:mean,return:best:std")
    for args, message in (
            (["--group-by", "learning_rate"], "cannot group by 'learning_rate'"),
            (["nope/*", "--group-by", "lr"], "no branch matches 'nope/*'"),
            (["--group-by", "lr", "--sort", "nope"], "cannot sort groups by 'nope'")):
        code, out, err = vrl(capsys, "compare", *args)
        assert code == 1 and out == "" and err.count("\n") == 1 and message in err, err


def test_group_by_and_planning_a_sweep_never_import_torch(ws, tmp_path):
    """`compare --group-by` is a history command and the sweep itself only starts `vrl
    train` processes: neither imports torch (here it cannot)."""
    import numpy as np

    repo = Repo.init(ws)
    for seed in (1, 2):
        repo.commit({"w": np.full(2, seed, np.float32)}, env=False, step=100,
                    hparams={"learning_rate": 0.1, "seed": seed, "total_steps": 100},
                    metrics={"return": seed},
                    ref=f"refs/heads/sweep/t/learning_rate=0.1-s{seed}")
    poison = tmp_path / "poison"
    (poison / "torch").mkdir(parents=True)
    (poison / "torch" / "__init__.py").write_text("raise ImportError('torch is poisoned')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)]),
           "VRL_AUTHOR": "tester"}
    for args in (["compare", "sweep/t/*", "--group-by", "sweep", "--json"],
                 ["sweep", "t", "--grid", "learning_rate=0.1,0.2", "--seeds", "2",
                  "--dry-run", *SMALL]):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, *args], cwd=ws, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert "learning_rate=0.1-s1: finished (" in proc.stdout
    assert "--branch sweep/t/learning_rate=0.2-s2" in proc.stdout
