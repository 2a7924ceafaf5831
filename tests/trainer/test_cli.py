import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from trainer.cli import train


def test_train_warehouse_writes_jsonl(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(train, [
        "--env", "warehouse", "--algo", "ppo", "--steps", "1024", "--seed", "3",
        "--device", "cpu", "--set", "num_envs=2", "--set", "num_steps=16",
        "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--set", "hidden_sizes=[16]",
        "--set", "num_minibatches=2", "--set", "update_epochs=2",
        "--out", str(out), "--no-progress", "--log-every", "1", "--no-store"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["iteration"] for x in lines] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert lines[-1]["charts/global_step"] == 1024
    assert "losses/approx_kl" in lines[0] and "env/deliveries" in lines[0]
    assert "iter 8 | step 1024" in result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["charts/global_step"] == 1024
    assert "num_agents: 4" in (out / "config.yaml").read_text()


def test_bad_override_is_a_short_error():
    result = CliRunner().invoke(train, ["--set", "nope=1", "--device", "cpu"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: unknown ppo config key 'nope'"


def test_bad_env_is_a_short_error():
    result = CliRunner().invoke(train, ["--env", "atari", "--device", "cpu"])
    assert result.exit_code == 1 and "unknown env 'atari'" in result.output


def test_unknown_env_option_is_a_short_error():
    result = CliRunner().invoke(train, ["--set", "env.speed=3", "--device", "cpu"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: unknown warehouse option(s) ['speed']")


# ------------------------------------------------ every error path: one line, no traceback


ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
        "--set", "num_minibatches=2", "--set", "update_epochs=1", "--set", "env.num_agents=4",
        "--set", "env.max_steps=8", "--no-progress", "--device", "cpu"]


def run_trainer(args, cwd, **kw):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    env.pop("VRL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, **kw)


def test_python_m_trainer_help(tmp_path):
    result = run_trainer(["-h"], tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("Usage: python -m trainer")
    assert "--from" in result.stdout


ERRORS = [  # (args, files to write, what the one line says, also run as a real process)
    (["--env", "gym:NoSuchEnv-v9"], {},
     "gym:NoSuchEnv-v9: Environment `NoSuchEnv` doesn't exist", True),
    (["--set", "num_envs=0"], {}, "num_envs must be in [1, inf), got 0", False),
    (["--config", "bad.yaml"], {"bad.yaml": "learning_rate: [3e-4\n"}, "bad.yaml: not valid",
     True),
    (["--config", "list.yaml"], {"list.yaml": "- 1\n"}, "expected a mapping", False),
    (["--store"], {}, "--store needs a vrl repository", True),
    (["--from", "main"], {}, "--from needs a vrl repository", False),
    (["--steps", "0"], {}, "--steps must be a positive number of agent-steps, got 0", True),
    (["--steps", "-5"], {}, "--steps must be a positive number of agent-steps, got -5", False),
    (["--steps", "100"], {}, "total_steps 100 is less than one iteration (128 agent-steps",
     False),
    (["--set", "num_minibatches=3"], {}, "num_minibatches 3 does not divide the rollout of "
                                         "128 samples", False),
    (["--set", "env.num_agents=x"], {}, "cannot create env 'warehouse'", False),
    (["--device", "tpu"], {}, "unknown device 'tpu'", False),
    (["--iterations", "0"], {}, "--iterations must be at least 1", False),
]


def _error_args(args):
    return [*TINY, *args] if {"--store", "--from"} & set(args) else [*TINY, "--no-store", *args]


@pytest.mark.parametrize("args,files,expected,_", ERRORS)
def test_error_paths_are_one_line(tmp_path, monkeypatch, args, files, expected, _):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VRL_DEBUG", raising=False)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = CliRunner().invoke(train, _error_args(args), prog_name="python -m trainer")
    lines = result.output.strip().splitlines()
    assert isinstance(result.exception, SystemExit), result.exception  # not a crash
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].startswith("Error: ") and expected in lines[0], result.output


@pytest.mark.parametrize("args,files,expected", [e[:3] for e in ERRORS if e[3]])
def test_error_paths_are_one_line_in_a_real_process(tmp_path, args, files, expected):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = run_trainer(_error_args(args), tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr


def test_config_file_numbers_are_yaml_1_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("learning_rate: 3e-4\nalgo: ppo\n")
    result = CliRunner().invoke(train, [*TINY, "--no-store", "--config", "c.yaml",
                                        "--steps", "128", "--out", "out"])
    assert result.exit_code == 0, result.output
    assert "learning_rate: 0.0003" in (tmp_path / "out" / "config.yaml").read_text()


def _wait_for_branch(path, name, proc, timeout=120):
    from vrl import Repo

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if name in Repo(path).branches():
            return
        time.sleep(0.2)
    raise AssertionError(f"no commit on {name} in {timeout} s")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_prints_the_command_that_resumes(tmp_path, sig, code):
    from vrl import Repo

    Repo.init(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # SIGINT back to its default in the child: a suite started in the background of a
    # non-interactive shell (as CI may be) passes Ctrl-C on ignored, and Python keeps it so
    proc = subprocess.Popen([sys.executable, "-m", "trainer", *TINY, "--steps", "10000000",
                             "--branch", "run", "--snapshot-every", "2"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        _wait_for_branch(tmp_path, "run", proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err
    hint = [line for line in err.splitlines() if "resume with:" in line]
    assert hint, err
    command = hint[0].split("resume with: ")[1]
    assert command.startswith("python -m trainer --from run")
    assert "--snapshot-every 2" in command and "--device cpu" in command
    repo = Repo(tmp_path)
    tip = repo.read_commit(repo.resolve("run")).meta["iteration"]
    assert f"last snapshot {repo.resolve('run')[:12]} is committed on branch run" in err
    if sig == signal.SIGTERM:
        return
    # the printed command continues the branch (here for one iteration more)
    words = command.split()[3:] + ["--iterations", "1"]
    result = run_trainer(words, tmp_path)
    assert result.returncode == 0, result.stderr
    assert repo.read_commit(repo.resolve("run")).meta["iteration"] == tip + 1
    assert repo.resolve("run~1") == repo.log("run")[1].id


def test_out_config_yaml_is_a_valid_config_file(tmp_path, monkeypatch):
    """--out writes config.yaml (with algo and env_spec); --config reads it back as is."""
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(train, [*TINY, "--no-store", "--steps", "128", "--algo",
                                       "gspo", "--set", "learning_rate=3e-4", "--out", "a"])
    assert first.exit_code == 0, first.output
    again = CliRunner().invoke(train, ["--no-progress", "--device", "cpu", "--no-store",
                                       "--config", "a/config.yaml", "--out", "b"])
    assert again.exit_code == 0, again.output
    text = (tmp_path / "a" / "config.yaml").read_text()
    assert "env_spec: warehouse" in text and "algo: gspo" in text
    assert (tmp_path / "b" / "config.yaml").read_text() == text


def test_eval_gif_without_pillow_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    from trainer import eval as trainer_eval
    from trainer.cli import eval_command

    real = importlib.util.find_spec
    monkeypatch.setattr(trainer_eval.importlib.util, "find_spec",
                        lambda name, *a: None if name == "PIL" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(eval_command, ["HEAD", "--gif", "x.gif"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --gif needs pillow: pip install 'vrl[plots]'"


@pytest.mark.parametrize("entry", [["-m", "trainer"], ["-m", "vrl", "train"]])
@pytest.mark.parametrize("delay", [0.0, 0.3, 0.9])
def test_ctrl_c_while_importing_exits_130(tmp_path, entry, delay):
    """A Ctrl-C that lands while `python -m trainer` or `vrl train` imports click, the
    store or torch is neither swallowed (the run would train on) nor a traceback: one
    line, exit code 130. Timed from the moment the latch's module is imported (shown by
    -X importtime): before that is the interpreter's own start-up, where no Python
    program can do better than its default."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *entry, *TINY, "--no-store",
                             "--steps", "10000000"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    latch = threading.Event()

    def read() -> None:  # -X importtime writes far more than a pipe holds
        for line in proc.stderr:
            lines.append(line)
            if line.rstrip().endswith("| vrl.interrupt"):
                latch.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert latch.wait(60), "".join(lines)
        time.sleep(0.05 + delay)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        reader.join(10)
    finally:
        proc.kill()
    err = "".join(line for line in lines if not line.startswith("import time:"))
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err


def _env_kwargs_of(monkeypatch, tmp_path, args):
    """The keyword arguments `vrl train ARGS` hands to the env factory."""
    import trainer.envs

    seen = []

    def make_env(spec, num_envs, **kw):
        seen.append(kw["env_kwargs"])
        raise RuntimeError("stop here")

    monkeypatch.setattr(trainer.envs, "make_env", make_env)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(train, [*args, "--no-store", "--device", "cpu"])
    assert result.exit_code == 1 and "stop here" in result.output, result.output
    return seen[0]


def test_a_nested_set_reaches_the_env_factory_as_the_same_yaml_does(tmp_path, monkeypatch):
    (tmp_path / "run.yaml").write_text("env:\n  grid_config:\n    num_agents: 8\n"
                                       "    width: 5\n")
    by_set = _env_kwargs_of(monkeypatch, tmp_path, ["--set", "env.grid_config.num_agents=8",
                                                    "--set", "env.grid_config.width=5"])
    by_yaml = _env_kwargs_of(monkeypatch, tmp_path, ["--config", "run.yaml"])
    assert by_set == by_yaml
    assert by_set["grid_config"] == {"num_agents": 8, "width": 5}
    both = _env_kwargs_of(monkeypatch, tmp_path, ["--config", "run.yaml",
                                                  "--set", "env.grid_config.num_agents=2"])
    assert both["grid_config"] == {"num_agents": 2, "width": 5}


def test_a_typo_in_a_nested_set_is_one_line():
    result = CliRunner().invoke(train, ["--set", "evn.grid_config.num_agents=8",
                                        "--device", "cpu", "--no-store"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: unknown ppo config key 'evn' in --set "
                                     "evn.grid_config.num_agents=8; did you mean 'env'?")


def _planned(total, per, iteration=0, global_step=0):
    """A stand-in for a Trainer as `vrl train` sets it up (fresh, or resumed)."""
    from types import SimpleNamespace

    from trainer.train import whole_iterations

    remaining = max(0, total - global_step)
    return SimpleNamespace(config=SimpleNamespace(total_steps=total), steps_per_iteration=per,
                           iteration=iteration, global_step=global_step,
                           num_iterations=iteration + whole_iterations(remaining, per))


def test_steps_round_up_to_whole_iterations_and_say_so():
    from trainer.cli import rounding_note

    assert rounding_note(_planned(200_000, 4096)) == (
        "--steps 200000 is 48.8 iterations of 4,096 steps: training 49 iterations "
        "(200,704 steps)")
    # README's first command: 819,200 steps of 8 worlds x 20 AGVs x 128 steps, exactly 40
    assert _planned(819_200, 8 * 20 * 128).num_iterations == 40
    assert rounding_note(_planned(819_200, 8 * 20 * 128)) is None
    assert rounding_note(_planned(4095 * 3, 4096), "total_steps") == (
        "total_steps 12285 is 2.999 iterations of 4,096 steps: training 3 iterations "
        "(12,288 steps)")
    # resumed at iteration 10: the same total, the same rounding
    assert rounding_note(_planned(200_000, 4096, 10, 40_960)) == (
        "--steps 200000 is 48.8 iterations of 4,096 steps: training 49 iterations "
        "(200,704 steps)")


def test_train_steps_that_are_not_whole_iterations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(train, [*TINY, "--no-store", "--steps", "200"])
    assert result.exit_code == 0, result.output
    assert "vrl: --steps 200 is 1.6 iterations of 128 steps: training 2 iterations " \
           "(256 steps)\n" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["charts/global_step"] == 256
    result = CliRunner().invoke(train, [*TINY, "--no-store", "--steps", "256"])
    assert result.exit_code == 0 and "iterations of" not in result.stderr, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["charts/global_step"] == 256
