"""Background snapshots (Snapshotter) and retention (prune)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from helpers import assert_same, small_policy

from vrl import Repo
from vrl.errors import PrunedError, VrlError
from vrl.hooks import Snapshotter, rng_state, set_rng_state


def train_steps(model, opt, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        loss = model(torch.randn(16, 8, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_snapshots_hold_model_optimizer_rng_and_metadata(repo):
    model = small_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    expected = []
    with Snapshotter(repo, model, opt, every=2, branch="run", hparams={"lr": 1e-2}) as snap:
        for it in range(6):
            train_steps(model, opt, 1, seed=it)
            if snap.step(it, metrics={"return": float(it)}):
                expected.append(({k: v.clone() for k, v in model.state_dict().items()},
                                 torch.get_rng_state().clone()))
    log = repo.log("run")
    assert [e.commit.step for e in log] == [4, 2, 0]
    assert log[0].commit.message == "iter 4: return 4"
    assert log[0].commit.hparams == {"lr": 0.01}
    for entry, (weights, rng) in zip(reversed(log), expected, strict=True):
        state = repo.load(entry.id)
        assert_same(weights, state["model"])
        assert_same(rng, state["rng"]["torch"])
        assert set(state["optimizer"]) == {"state", "param_groups"}


def test_restoring_rng_state_reproduces_random_draws():
    import random

    import numpy as np

    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1)) == a


def test_unchanged_layers_are_not_copied_or_rehashed(repo, monkeypatch):
    model = small_policy()
    model[0].requires_grad_(False)  # a frozen layer
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    snap = Snapshotter(repo, model, opt, include_rng=False)
    snap.step(0)
    snap.flush()
    first = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    objects_before = set(repo.objects.ids())
    train_steps(model, opt, 1)
    snap.step(1)
    snap.close()
    second = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    assert second.tensors["model/0.weight"].id == first.tensors["model/0.weight"].id
    assert second.tensors["model/2.weight"].id != first.tensors["model/2.weight"].id
    new_tensors = [o for o in set(repo.objects.ids()) - objects_before
                   if repo.objects.kind_and_size(o)[0] == "tensor"]
    assert len(new_tensors) == 2  # layer 2's weight and bias only
    assert [lc.layer for lc in repo.diff("HEAD").material] == ["model/2"]


def test_snapshot_is_isolated_from_later_training(repo):
    model = small_policy()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    snap = Snapshotter(repo, model, opt, queue_size=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    snap.step(0)
    train_steps(model, opt, 3)  # may run while the commit is still queued
    snap.close()
    assert_same(before, repo.load("HEAD")["model"])


def test_background_error_surfaces_at_next_call(repo, monkeypatch):
    model = small_policy()
    snap = Snapshotter(repo, model)

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(repo, "commit", broken)
    snap.step(0)
    with pytest.raises(VrlError, match="background snapshot failed: disk on fire"):
        snap.flush()
    monkeypatch.undo()
    snap.step(1)
    snap.close()
    assert [e.commit.step for e in repo.log()] == [1]


def test_backpressure_blocks_instead_of_queueing_without_bound(repo, monkeypatch):
    model = small_policy()
    snap = Snapshotter(repo, model, queue_size=1, include_rng=False)
    real = repo.commit
    monkeypatch.setattr(repo, "commit", lambda *a, **k: (time.sleep(0.3), real(*a, **k))[1])
    start = time.perf_counter()
    for i in range(4):
        with torch.no_grad():
            model[0].bias.add_(1)
        snap.step(i)
    elapsed = time.perf_counter() - start
    snap.close()
    assert elapsed > 0.5  # the 3rd and 4th calls had to wait for the committer
    assert len(repo.log()) == 4


def test_best_snapshot_is_tagged_and_tag_moves(repo):
    model = small_policy()
    with Snapshotter(repo, model, best_metric="return") as snap:
        for it, ret in enumerate([1.0, 5.0, 3.0, 7.0, 2.0]):
            with torch.no_grad():
                model[0].bias.add_(1)
            snap.step(it, metrics={"return": ret})
    assert repo.read_commit(repo.resolve("best")).metrics["return"] == 7.0


SIGTERM_SCRIPT = textwrap.dedent("""
    import sys, time, torch
    from vrl import Repo
    from vrl.hooks import Snapshotter
    repo = Repo(sys.argv[1])
    model = torch.nn.Linear(64, 64)
    real = repo.commit
    def slow(*a, **k):
        time.sleep(0.5)
        return real(*a, **k)
    repo.commit = slow
    snap = Snapshotter(repo, model, queue_size=4)
    for i in range(3):
        with torch.no_grad():
            model.weight.add_(1)
        snap.step(i)
    print("queued", flush=True)
    time.sleep(60)
""")


def test_sigterm_flushes_pending_snapshots(tmp_path):
    Repo.init(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "queued"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    repo = Repo(tmp_path)
    assert [e.commit.step for e in repo.log()] == [2, 1, 0]
    assert repo.fsck()["ok"]


def test_prune_keeps_recent_tagged_best_and_gc_frees_the_rest(repo):
    ids = []
    for i in range(8):
        ids.append(repo.commit({"w": torch.full((1000,), float(i)), "fixed": torch.ones(500)},
                               message=f"c{i}", metrics={"r": i}, env=False))
    repo.tag("best", ids[2])
    pruned = repo.prune(keep_last=3)
    assert sorted(pruned) == sorted([ids[0], ids[1], ids[3], ids[4]])
    assert repo.prune(keep_last=3) == []  # idempotent
    assert repo.gc(grace=0)[0] == 4  # the unique tensor of each pruned commit
    # history, metrics and stats survive; kept snapshots restore; pruned ones say so
    log = repo.log()
    assert [e.commit.metrics["r"] for e in log] == list(range(7, -1, -1))
    assert repo.diff(ids[4]).layers
    for keep in (ids[2], ids[5], ids[6], ids[7]):
        assert repo.load(keep)["fixed"].sum() == 500  # shared tensor never dropped
    with pytest.raises(PrunedError, match="pruned by retention"):
        repo.load(ids[3])
    assert repo.fsck()["ok"]


def test_snapshotter_applies_retention(repo):
    model = torch.nn.Linear(4, 4)
    with Snapshotter(repo, model, keep_last=2, include_rng=False) as snap:
        for i in range(5):
            with torch.no_grad():
                model.bias.add_(1)
            snap.step(i)
    assert len(repo.pruned()) == 3


def test_prune_cli(tmp_path, monkeypatch, capsys):
    from vrl.cli import main

    repo = Repo.init(tmp_path)
    for i in range(4):
        repo.commit({"w": torch.full((3,), float(i))}, message=f"c{i}", env=False)
    monkeypatch.chdir(tmp_path)
    assert main(["prune", "--keep-last", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "2 snapshot(s) would be pruned; run `vrl gc` to free " \
                                   "their space"
    assert repo.pruned() == set()
    assert main(["prune", "--keep-last", "2"]) == 0
    assert len(repo.pruned()) == 2
    assert os.path.exists(tmp_path / ".vrl" / "pruned")


def test_pruned_snapshot_is_fetched_back_from_a_remote(tmp_path):
    from vrl.remote.config import add_remote, open_named
    from vrl.remote.transfer import push

    repo = Repo.init(tmp_path / "work")
    ids = [repo.commit({"w": torch.full((100,), float(i))}, env=False) for i in range(4)]
    add_remote(repo, "backup", str(tmp_path / "remote"), create=True)
    store = open_named(repo, "backup")
    push(repo, store, "backup", ["main"])
    store.close()
    assert repo.prune(keep_last=1) == ids[2::-1]
    repo.gc(grace=0)
    assert not repo.objects.has(repo.read_manifest(repo.read_commit(ids[0]).manifest)
                                .tensors["w"].id)
    assert repo.load(ids[0])["w"][0] == 0.0  # fetched back from the remote
    from vrl.remote.config import remove_remote

    remove_remote(repo, "backup")
    repo.gc(grace=0)
    with pytest.raises(PrunedError, match="add a remote that still has it"):
        repo.load(ids[1])
