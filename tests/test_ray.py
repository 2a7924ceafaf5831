"""`vrl sweep --ray` / `vrl pbt --ray`: trials as Ray tasks on a local 2-worker cluster
(127.0.0.1), committing into the shared store or, with --remote, into clones that push to
a local S3 server (moto). Skipped without ray (`pip install 'vrl[ray]'`); the S3 and
Ctrl-C tests are slow (`-m slow`): ~70 s in all on 2 cores, the default ones ~12 s."""

import contextlib
import io
import os
import sys

import pytest
from helpers import commands_added

from vrl import Repo
from vrl.cli import main

SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=2",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--device", "cpu"]
PER_ITERATION = 2 * 16 * 4


def run(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True, scope="module")
def registered():
    from trainer.pbt import pbt
    from trainer.sweep import sweep

    with commands_added(pbt, sweep):
        yield


def test_without_ray_the_error_says_how_to_install_it(ws, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    Repo.init(ws)
    code, out, err = run("sweep", "r", "--grid", "learning_rate=1e-4", "--ray", "auto",
                         *SMALL)
    assert code == 1 and err == "Error: --ray needs Ray: pip install 'vrl[ray]'\n"
    code, out, err = run("pbt", "r", "--steps-per-round", "10", "--explore",
                         "learning_rate=factors:0.8", "--ray", "auto", *SMALL)
    assert code == 1 and "pip install 'vrl[ray]'" in err and err.count("\n") == 1
    assert not (ws / ".vrl/pbt").exists() and not (ws / ".vrl/sweeps").exists()


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # the fake credentials of the local S3 server reach the tasks' `vrl push` (the
    # runner forwards AWS_* variables)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def s3_remote():
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    from vrl.testing.remote_conformance import s3_case
    from vrl.testing.servers import s3_server

    server = s3_server()
    yield lambda: s3_case(server)
    server.kill()


def with_remote(ws, case):
    """A store whose remote `origin` is a fresh S3 bucket holding its main branch."""
    import numpy as np

    repo = Repo.init(ws)
    repo.commit({"w": np.zeros(2, np.float32)}, message="start", env=False)
    options = [w for k, v in case.options.items() for w in ("-o", f"{k}={v}")]
    assert run("remote", "add", "origin", case.url, *options)[0] == 0
    code, out, err = run("push", "--create", "origin", "main")
    assert code == 0, out + err
    return repo


def remote_log(tmp_path, case, branch):
    """`vrl log` of the branch in a fresh clone of the remote: (ids, steps)."""
    where = tmp_path / f"clone-{branch.replace('/', '_')}"
    options = [w for k, v in case.options.items() for w in ("-o", f"{k}={v}")]
    code, out, err = run("clone", case.url, str(where), "--no-checkout", "-q", *options)
    assert code == 0, out + err
    clone = Repo(where)
    tip = clone.refs.read(f"refs/remotes/origin/{branch}")
    assert tip is not None, f"{branch} is not on the remote"
    before = os.getcwd()
    try:
        code, out, err = run("-C", str(where), "log", "--oneline", tip)  # (changes cwd)
    finally:
        os.chdir(before)
    assert code == 0, err
    return [e.id for e in clone.log(tip)], [e.commit.step for e in clone.log(tip)], out


def test_sweep_on_ray_into_the_shared_store(ws, ray_cluster):
    Repo.init(ws)
    code, out, err = run("sweep", "lr", "--grid", "learning_rate=1e-4,3e-4", "--steps",
                         str(2 * PER_ITERATION), "--workers", "2", "--ray", "auto", *SMALL)
    assert code == 0, out + err
    assert out.count("(ray)") == 2 and "2 done, 0 skipped" in out
    repo = Repo(ws)
    for lr in ("1e-4", "3e-4"):
        branch = f"sweep/lr/learning_rate={lr}-s1"
        assert [e.commit.step for e in repo.log(branch)] == [256, 128]
        assert "ray task" in (ws / ".vrl/sweeps/lr" / f"learning_rate={lr}-s1.log").read_text()


def test_sweep_and_pbt_on_ray_push_every_trial_to_s3(ws, tmp_path, ray_cluster, s3_remote):
    case = s3_remote()
    repo = with_remote(ws, case)
    code, out, err = run("sweep", "lr", "--grid", "learning_rate=1e-4,3e-4", "--steps",
                         str(2 * PER_ITERATION), "--workers", "2", "--ray", "auto",
                         "--remote", "origin", *SMALL)
    assert code == 0, out + err
    for lr in ("1e-4", "3e-4"):
        branch = f"sweep/lr/learning_rate={lr}-s1"
        ids, steps, _ = remote_log(tmp_path, case, branch)
        assert steps == [256, 128]
        assert repo.resolve(branch) == ids[0]  # fetched back into the controller's store
    rounds = 2 * PER_ITERATION
    code, out, err = run("pbt", "p", "--population", "3", "--rounds", "2",
                         "--steps-per-round", str(rounds), "--explore",
                         "learning_rate=factors:0.8,1.2", "--seed", "1", "--workers", "2",
                         "--ray", "auto", "--remote", "origin", *SMALL)
    assert code == 0, out + err
    exploits = 0
    for i in range(3):
        branch = f"pbt/p/m{i}"
        ids, steps, text = remote_log(tmp_path, case, branch)
        assert steps[0] == 2 * rounds and repo.resolve(branch) == ids[0]
        clone = Repo(tmp_path / f"clone-{branch.replace('/', '_')}")
        assert clone.fsck()["ok"], branch  # every object the trials pushed, whole
        for oid in ids:
            record = clone.read_commit(oid).meta.get("pbt")
            if record:  # the exploit commit reached the remote, parent the source's
                exploits += 1
                assert clone.read_commit(oid).parents == (record["exploit"]["id"],)
    assert exploits == 1


@pytest.mark.slow
def test_ctrl_c_cancels_the_tasks_which_stop_with_a_snapshot(ws):
    """A sweep started in the background of a script (SIGINT ignored, inherited by the
    cluster it starts) still stops its tasks on SIGINT: each trial commits and exits."""
    import signal
    import subprocess
    import time
    from pathlib import Path

    pytest.importorskip("ray")
    root = Path(__file__).resolve().parents[1]
    Repo.init(ws)
    script = ("import signal, sys; from vrl.cli import cli, main; from trainer.sweep import "
              "sweep; cli.add_command(sweep); sys.exit(main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": str(root), "VRL_AUTHOR": "tester",
           "RAY_USAGE_STATS_ENABLED": "0"}
    steps = 400 * PER_ITERATION
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "sweep", "int", "--grid", "learning_rate=1e-4,3e-4",
         "--steps", str(steps), "--workers", "2", "--ray", "local", *SMALL], cwd=ws, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    repo = Repo(ws)
    deadline = time.monotonic() + 90
    while len(repo.branches()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, out + err
    assert out.count("stopped sweep/int/") == 2 and "2 not finished" in out
    for branch in repo.branches():
        assert repo.read_commit(repo.resolve(branch)).step < steps
