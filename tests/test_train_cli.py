"""`vrl train`: snapshots while training, exact resume with --from, branches, tags."""

import json

import pytest
import torch
from helpers import assert_same

from vrl import Repo
from vrl.cli import main

SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=2",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--no-progress",
         "--device", "cpu"]
STEPS_PER_ITERATION = 2 * 16 * 4


def train(capsys, *args):
    code = main(["train", *SMALL, "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1]), err


def test_train_commits_snapshots_on_a_new_branch(ws, capsys):
    main(["init"])
    summary, err = train(capsys, "--steps", str(3 * STEPS_PER_ITERATION), "--branch", "exp1")
    assert "committing snapshots to branch exp1" in err
    repo = Repo(ws)
    assert repo.current_branch() == "exp1"
    log = repo.log()
    assert [e.commit.meta["iteration"] for e in log] == [3, 2, 1]
    assert summary["vrl/snapshots"] == 3 and log[0].id.startswith(summary["vrl/head"])
    assert repo.tags().get("best/exp1") in {e.id for e in log}
    assert log[0].commit.hparams["num_steps"] == 16
    # a second run with the same branch name is refused; a fresh one gets its own branch
    assert main(["train", *SMALL, "--steps", "128", "--branch", "exp1"]) == 1
    assert "already exists" in capsys.readouterr().err
    summary, _ = train(capsys, "--steps", str(STEPS_PER_ITERATION))
    assert summary["vrl/branch"].startswith("ppo-") and len(repo.branches()) == 2


def test_resume_from_snapshot_is_bit_identical_to_a_straight_run(ws, capsys):
    main(["init"])
    total = str(6 * STEPS_PER_ITERATION)
    train(capsys, "--steps", total, "--branch", "straight", "--algo", "gspo",
          "--set", "hessian_interval=2")
    train(capsys, "--steps", total, "--iterations", "3", "--branch", "first-half",
          "--algo", "gspo", "--set", "hessian_interval=2")
    train(capsys, "--steps", total, "--from", "first-half", "--branch", "second-half")
    repo = Repo(ws)
    straight, resumed = repo.load("straight"), repo.load("second-half")
    assert resumed["iteration"] == straight["iteration"] == 6
    assert_same(straight["model"], resumed["model"])
    assert_same(straight["algo"], resumed["algo"])
    # lineage: the resumed branch continues from the snapshot it started from
    chain = [e.commit.meta["iteration"] for e in repo.log("second-half")]
    assert chain == [6, 5, 4, 3, 2, 1]
    assert repo.resolve("second-half~3") == repo.resolve("first-half")


def test_from_with_changed_hyperparameters_shows_in_the_lineage(ws, capsys):
    main(["init"])
    train(capsys, "--steps", str(2 * STEPS_PER_ITERATION), "--branch", "base")
    train(capsys, "--steps", str(4 * STEPS_PER_ITERATION), "--from", "base",
          "--branch", "lr", "--set", "learning_rate=0.001")
    repo = Repo(ws)
    assert repo.read_commit(repo.resolve("lr")).hparams["learning_rate"] == 0.001
    assert repo.read_commit(repo.resolve("base")).hparams["learning_rate"] != 0.001
    assert main(["show", "lr"]) == 0
    assert "learning_rate: 0.001" in capsys.readouterr().out


def test_without_a_repository_training_runs_but_keeps_no_snapshots(ws, capsys):
    summary, err = train(capsys, "--steps", str(STEPS_PER_ITERATION))
    assert "not in a vrl repository" in err and "vrl/branch" not in summary
    assert main(["train", *SMALL, "--steps", "128", "--store"]) == 1
    assert "not a vrl repository" in capsys.readouterr().err


def test_dirty_layers_option_records_frozen_layers(ws, capsys):
    main(["init"])
    train(capsys, "--steps", str(8 * STEPS_PER_ITERATION), "--branch", "d",
          "--dirty-layers", "--dirty-threshold", "1e9", "--dirty-window", "1")
    repo = Repo(ws)
    frozen = [e.commit.meta["frozen_layers"] for e in repo.log("d")]
    assert any(frozen) and torch.is_tensor(repo.load("d")["model"]["actor.0.weight"])


# ------------------------------------------------------------ runs you can continue
def iterations_of(repo, rev):
    return [e.commit.meta["iteration"] for e in repo.log(rev)]


def test_from_a_branch_continues_it_in_place(ws, capsys):
    """Two `vrl train --from main` calls make one linear branch with increasing steps,
    one best tag, and the same weights as a run that was never interrupted."""
    main(["init"])
    total = str(6 * STEPS_PER_ITERATION)
    train(capsys, "--steps", total, "--branch", "straight")
    train(capsys, "--steps", total, "--iterations", "2", "--branch", "main")
    _, err = train(capsys, "--from", "main", "--iterations", "2")
    assert "committing snapshots to branch main (continuing at iteration 2" in err
    summary, _ = train(capsys, "--from", "main")  # runs to the stored total_steps
    assert summary["vrl/branch"] == "main" and summary["charts/global_step"] == 6 * 128
    repo = Repo(ws)
    log = repo.log("main")
    assert [e.commit.meta["iteration"] for e in log] == [6, 5, 4, 3, 2, 1]
    steps = [e.commit.step for e in log][::-1]
    assert steps == sorted(steps) and steps[-1] == 6 * STEPS_PER_ITERATION
    assert all(len(e.commit.parents) == 1 for e in log[:-1])  # linear
    assert set(repo.branches()) == {"main", "straight"}
    assert sorted(t for t in repo.tags() if t.startswith("best/")) == ["best/main",
                                                                         "best/straight"]
    assert repo.tags()["best/main"] in {e.id for e in log}
    assert_same(repo.load("straight")["model"], repo.load("main")["model"])
    # a finished run says how to go on, and commits nothing
    assert main(["train", *SMALL, "--from", "main"]) == 0
    err = capsys.readouterr().err
    assert "has finished its run" in err and "--from main" in err and "--steps" in err
    assert len(repo.log("main")) == 6
    # a larger total continues the same branch (HEAD is on it, so --from HEAD does too)
    train(capsys, "--from", "HEAD", "--steps", str(7 * STEPS_PER_ITERATION))
    assert set(repo.branches()) == {"main", "straight"}
    assert iterations_of(repo, "main")[:2] == [7, 6]


def test_from_a_revision_forks_and_existing_branches_are_protected(ws, capsys):
    main(["init"])
    train(capsys, "--steps", str(3 * STEPS_PER_ITERATION), "--branch", "base")
    repo = Repo(ws)
    _, err = train(capsys, "--from", "base~1", "--branch", "fork")
    assert "forked from base~1" in err
    assert iterations_of(repo, "fork") == [3, 2, 1] and iterations_of(repo, "base") == [3, 2, 1]
    assert repo.resolve("fork~1") == repo.resolve("base~1") != repo.resolve("base~0")
    assert "best/fork" in repo.tags()
    # a fresh run may not reuse a branch; a fork may not land on another run's branch
    assert main(["train", *SMALL, "--branch", "base"]) == 1
    err = capsys.readouterr().err.strip()
    assert "already exists" in err and "--from base" in err and "\n" not in err
    assert main(["train", *SMALL, "--from", "base~2", "--branch", "fork"]) == 1
    assert "already exists" in capsys.readouterr().err
    # --from a tag (not a branch) forks to a new branch of its own
    summary, _ = train(capsys, "--from", "best/base", "--steps", str(4 * STEPS_PER_ITERATION))
    assert summary["vrl/branch"] not in ("base", "fork")


def test_snapshots_store_env_spec_algo_and_config(ws, capsys):
    main(["init"])
    train(capsys, "--steps", str(STEPS_PER_ITERATION), "--branch", "w", "--algo", "gspo",
          "--set", "learning_rate=3e-4")
    repo = Repo(ws)
    c = repo.read_commit(repo.resolve("w"))
    assert c.hparams["env_spec"] == "warehouse" and c.hparams["algo"] == "gspo"
    assert c.hparams["learning_rate"] == 3e-4 and c.hparams["env"]["num_agents"] == 4
    assert c.meta["trainer"]["obs_dim"] == 150 and c.meta["trainer"]["num_actions"] == 5
    assert main(["show", "w"]) == 0
    out = capsys.readouterr().out
    assert "env_spec: warehouse" in out and "algo: gspo" in out


def test_from_without_env_restores_a_gym_run(ws, capsys):
    main(["init"])
    gym = ["--env", "gym:CartPole-v1", "--set", "num_envs=2", "--set", "num_steps=16",
           "--set", "hidden_sizes=[8]", "--no-progress", "--device", "cpu"]
    assert main(["train", *gym, "--steps", "64", "--branch", "cp"]) == 0
    capsys.readouterr()
    # no --env, no --set: all of it comes from the snapshot
    assert main(["train", "--from", "cp", "--steps", "128", "--no-progress",
                 "--device", "cpu"]) == 0
    capsys.readouterr()
    repo = Repo(ws)
    top = repo.read_commit(repo.resolve("cp"))
    assert top.hparams["env_spec"] == "gym:CartPole-v1" and top.hparams["num_envs"] == 2
    assert iterations_of(repo, "cp") == [4, 3, 2, 1] and top.meta["trainer"]["obs_dim"] == 4


@pytest.mark.parametrize("args,expected", [
    (["--env", "gym:CartPole-v1"], "trained on observations of 150 floats, but "
                                   "gym:CartPole-v1 has observations of 4 floats"),
    (["--algo", "gspo"], "holds ppo state without radius, shaper"),
    (["--set", "hidden_sizes=[8]"], "network does not fit"),
])
def test_from_a_snapshot_that_does_not_fit_is_a_one_line_error(ws, capsys, args, expected):
    main(["init"])
    train(capsys, "--steps", str(STEPS_PER_ITERATION), "--branch", "w")
    code = main(["train", "--from", "w", "--steps", "512", "--no-progress", "--device", "cpu",
                 *args])
    err = capsys.readouterr().err.strip()
    assert code == 1 and expected in err and "\n" not in err, err


def test_from_a_commit_that_is_not_a_training_snapshot(ws, capsys):
    main(["init"])
    Repo(ws).commit({"w": torch.zeros(3)}, message="plain")
    assert main(["train", *SMALL, "--from", "main"]) == 1
    err = capsys.readouterr().err.strip()
    assert "is not a training snapshot" in err and "\n" not in err


def test_one_return_metric_in_console_commit_message_log_and_best_tag(ws, capsys):
    main(["init"])
    capsys.readouterr()
    # episodes of 24 steps, iterations of 16: none ends in iterations 1 and 4
    code = main(["train", *SMALL, "--set", "env.max_steps=24", "--steps",
                 str(4 * STEPS_PER_ITERATION), "--branch", "m", "--log-every", "1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    repo = Repo(ws)
    log = repo.log("m")[::-1]
    lines = [line for line in err.splitlines() if line.startswith("iter ")]
    stored = [e.commit.metrics.get("charts/episodic_return") for e in log]
    assert [e.commit.metrics["charts/episodes"] for e in log] == [0, 2, 2, 0]
    assert stored[0] is None and stored[3] is None and None not in stored[1:3]
    assert all("charts/return" not in e.commit.metrics for e in log)
    assert len(lines) == 4
    for line, value, entry in zip(lines, stored, log, strict=True):
        iteration = entry.commit.meta["iteration"]
        assert line.startswith(f"iter {iteration}/4  step {iteration * STEPS_PER_ITERATION}  ")
        if value is None:
            assert "  no episode ended  fps " in line
            assert entry.commit.message == f"iter {iteration}: no episode ended"
        else:
            shown = float(line.split("  return ")[1].split()[0])
            assert shown == pytest.approx(value, rel=1e-3)
            assert "  deliveries " in line
            assert entry.commit.message == f"iter {iteration}: return {value:.4g}"
    best = max(log[1:3], key=lambda e: e.commit.metrics["charts/episodic_return"])
    assert repo.tags()["best/m"] == best.id
    # the closing lines are sentences; the JSON summary only with --json
    assert out.startswith("trained to iteration 4 (512 agent-steps); mean return of the 4 "
                          "episodes so far ")
    assert "4 snapshots on branch m" in out and "{" not in out
    # log: `-` where no episode ended, and a footnote that says so
    assert main(["log", "m", "--metrics", "charts/episodic_return,env/deliveries"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[-1] == "-: no episode ended in that iteration"
    assert rows[1].split()[2:4] == ["-", "-"] and rows[4].split()[2:4] == ["-", "-"]
    assert rows[2].split()[2] != "-"


def test_metric_lines_from_the_first_iteration_then_about_forty_a_run():
    import io
    from types import SimpleNamespace

    from trainer.hooks import ProgressHook

    stream = io.StringIO()
    hook = ProgressHook(bar=False, stream=stream)
    fake = SimpleNamespace(iteration=0, global_step=0, num_iterations=100)
    hook.on_start(fake)
    for i in range(1, 101):
        fake.iteration, fake.global_step = i, i * 1000
        hook.on_iteration_end(fake, i, {"charts/episodes": 1.0 * (i % 2),
                                        "charts/episodic_return": float(i)})
    hook.on_end(fake, {})
    lines = stream.getvalue().splitlines()
    assert 20 <= len(lines) <= 40
    assert lines[0].startswith("iter 1/100  step 1,000  return 1  fps ")
    assert lines[1].startswith("iter 4/100  step 4,000  return 3  fps ")  # 2-4: one ended
    assert lines[-1].startswith("iter 100/100  step 100,000  ")


# ------------------------------------------------------------------------ vrl eval
@pytest.fixture
def eval_plugin(tmp_path_factory, monkeypatch):
    """`vrl eval` is an entry point (pyproject.toml): an install made before it was added
    (an older editable install) does not list it yet, so the test adds it. Returns a
    PYTHONPATH entry that does the same for subprocesses."""
    from importlib.metadata import entry_points

    root = tmp_path_factory.mktemp("eval-plugin")
    info = root / "vrl_eval_test_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vrl-eval-test-plugin\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text("[vrl.commands]\neval = trainer.cli:eval_command\n")
    if not any(ep.name == "eval" for ep in entry_points(group="vrl.commands")):
        monkeypatch.syspath_prepend(str(root))
    return str(root)


def test_eval_is_registered_as_a_vrl_command():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    from trainer.cli import eval_command

    meta = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["vrl.commands"]["eval"] == \
        "trainer.cli:eval_command"
    assert eval_command.name == "eval"


def test_eval_json_and_gif_of_a_warehouse_snapshot(ws, capsys, eval_plugin):
    from PIL import Image

    main(["init"])
    train(capsys, "--steps", str(2 * STEPS_PER_ITERATION), "--branch", "w")
    assert main(["eval", "best/w", "--episodes", "3", "--json", "--gif", "w.gif"]) == 0
    result = json.loads(capsys.readouterr().out)
    repo = Repo(ws)
    assert result["commit"] == repo.resolve("best/w") and result["env_spec"] == "warehouse"
    assert result["episodes"] == 3 and len(result["per_episode"]) == 3
    assert result["policy"]["length"] == 8  # env.max_steps, from the stored config
    assert {"return", "deliveries", "collisions"} <= set(result["policy"])
    assert set(result["baseline"]) == set(result["policy"])
    with Image.open(ws / "w.gif") as gif:
        assert gif.format == "GIF" and gif.n_frames > 1  # pillow merges equal frames
    # greedy is deterministic; the human table lists policy next to the baseline
    assert main(["eval", "w", "--episodes", "2", "--greedy"]) == 0
    first = capsys.readouterr().out
    assert main(["eval", "w", "--episodes", "2", "--greedy"]) == 0
    assert capsys.readouterr().out == first
    assert "metric" in first and "baseline" in first and "deliveries" in first


def test_eval_gif_without_a_file_goes_where_the_ui_shows_it(ws, capsys, eval_plugin):
    from vrl.ui.api import Api

    main(["init"])
    train(capsys, "--steps", str(2 * STEPS_PER_ITERATION), "--branch", "w")
    repo = Repo(ws)
    assert Api(repo).get("commit", {"rev": ["best/w"]})["gif"] is False
    assert main(["eval", "best/w", "--episodes", "1", "--gif"]) == 0
    path = ws / ".vrl" / "eval" / f"{repo.resolve('best/w')[:12]}.gif"
    assert f"wrote {path}" in capsys.readouterr().out
    assert path.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
    assert Api(Repo(ws)).get("commit", {"rev": ["best/w"]})["gif"] is True


def test_eval_gif_of_a_gymnasium_env(ws, capsys, eval_plugin):
    from PIL import Image

    main(["init"])
    spec = "gym:rgb_corridor:VrlCorridor-v0"
    assert main(["train", "--env", spec, "--set", "num_envs=2", "--set", "num_steps=8",
                 "--set", "hidden_sizes=[8]", "--set", "num_minibatches=2",
                 "--steps", "16", "--branch", "c",
                 "--no-progress", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["eval", "c", "--episodes", "2", "--gif", "c.gif", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env_spec"] == spec and result["baseline"] is None
    with Image.open(ws / "c.gif") as gif:
        # the 32x8 frames, centred under a title and a step counter as wide as they need
        assert gif.format == "GIF" and gif.size[0] > 32 and gif.size[1] > 8 + 30 \
            and gif.n_frames >= 1


def test_eval_errors_are_one_line(ws, capsys, eval_plugin):
    main(["init"])
    Repo(ws).commit({"w": torch.zeros(3)}, message="plain")
    assert main(["eval", "main"]) == 1
    err = capsys.readouterr().err.strip()
    assert "is not a training snapshot" in err and "\n" not in err
    assert main(["eval", "nope"]) == 1
    assert "unknown revision" in capsys.readouterr().err


def test_changed_learning_rate_applies_on_resume_and_iterations_stop_at_the_total(ws, capsys):
    main(["init"])
    train(capsys, "--steps", str(2 * STEPS_PER_ITERATION), "--branch", "base",
          "--set", "anneal_lr=false", "--iterations", "5")
    repo = Repo(ws)
    assert iterations_of(repo, "base") == [2, 1]  # --iterations never runs past --steps
    train(capsys, "--from", "base", "--branch", "lr", "--set", "learning_rate=0.001",
          "--steps", str(3 * STEPS_PER_ITERATION))
    top = repo.read_commit(repo.resolve("lr"))
    # the config's learning rate wins over the one saved with the optimizer state
    assert top.metrics["charts/learning_rate"] == 0.001
    assert repo.load("lr")["algo"]["optimizer"]["param_groups"][0]["lr"] == 0.001


def test_from_a_python_api_snapshot_without_env_spec(ws, capsys):
    """StoreHook used from Python without an env spec: --from assumes the warehouse and
    says so; a wrong guess would be caught by the size checks."""
    from trainer.config import PPOConfig
    from trainer.envs.warehouse import WarehouseEnv
    from trainer.store_hook import StoreHook
    from trainer.train import Trainer

    repo = Repo.init(ws)
    cfg = PPOConfig(num_envs=2, num_steps=16, hidden_sizes=[16], num_minibatches=2,
                    update_epochs=2, total_steps=2 * STEPS_PER_ITERATION,
                    env={"num_agents": 4, "max_steps": 8})
    hook = StoreHook(repo, branch="api")
    Trainer(WarehouseEnv(2, num_agents=4, max_steps=8), cfg, hooks=[hook]).train()
    hook.close()
    assert repo.read_commit(repo.resolve("api")).hparams["env_spec"] is None
    _, err = train(capsys, "--from", "api", "--steps", str(3 * STEPS_PER_ITERATION))
    assert "does not say which env it was trained on; assuming --env warehouse" in err
    assert iterations_of(repo, "api") == [3, 2, 1]


@pytest.mark.parametrize("mask", ["obs", "info"])
def test_eval_honours_the_envs_action_mask(ws, capsys, eval_plugin, monkeypatch, mask):
    """MALine raises on an illegal action: an untrained policy that ignored the mask
    would hit one within a few steps, so eval finishing proves the mask was applied."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "trainer"))
    main(["init"])
    assert main(["train", "--env", "gym:ma_gym_env:MALine-v0", "--set", "num_envs=2",
                 "--set", "num_steps=8", "--set", "hidden_sizes=[8]", "--set",
                 "num_minibatches=2", "--set", f"env.mask={mask}", "--steps", "32",
                 "--branch", "m", "--no-progress", "--device", "cpu"]) == 0
    capsys.readouterr()
    for greedy in ([], ["--greedy"]):
        assert main(["eval", "m", "--episodes", "6", "--json", *greedy]) == 0
        assert json.loads(capsys.readouterr().out)["episodes"] == 6


def test_steps_round_up_and_a_resumed_run_ends_where_a_straight_one_does(ws, capsys):
    main(["init"])
    steps = str(2 * STEPS_PER_ITERATION - 50)  # 1.6 iterations: 2 are trained
    note = "vrl: --steps 206 is 1.6 iterations of 128 steps: training 2 iterations (256 steps)"
    summary, err = train(capsys, "--steps", steps, "--branch", "straight")
    assert note in err.splitlines() and summary["charts/global_step"] == 256
    train(capsys, "--steps", steps, "--iterations", "1", "--branch", "main")
    summary, err = train(capsys, "--from", "main")  # the stored total_steps, rounded alike
    assert note.replace("--steps", "total_steps") in err.splitlines()
    assert summary["charts/global_step"] == 256
    repo = Repo(ws)
    assert iterations_of(repo, "main") == [2, 1]
    assert_same(repo.load("straight")["model"], repo.load("main")["model"])
    assert main(["train", *SMALL, "--from", "main"]) == 0  # finished: nothing more to do
    assert "has finished its run (256 of 206 agent-steps)" in capsys.readouterr().err
