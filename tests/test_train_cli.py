"""`vrl train`: snapshots while training, exact resume with --from, branches, tags."""

import json

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
    code = main(["train", *SMALL, *args])
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
