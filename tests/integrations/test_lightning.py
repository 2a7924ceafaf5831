"""The PyTorch Lightning integration, with the real `lightning` package on a tiny model."""

import sys

import pytest
import torch

from vrl.errors import VrlError

L = pytest.importorskip("lightning")


class Tiny(L.LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 8, act: type = torch.nn.Tanh):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), act(),
                                       torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        StepLR = torch.optim.lr_scheduler.StepLR
        # one stepped per epoch (Lightning steps it after the callbacks' epoch end), one per
        # batch, whose counter (not the optimizer's lr) says when it next decays
        return [opt], [StepLR(opt, step_size=1, gamma=0.5),
                       {"scheduler": StepLR(opt, step_size=3, gamma=0.9), "interval": "step"}]


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    # shuffled by the global torch RNG (no generator of its own), so the data order of an
    # epoch depends on the RNG state a resume restores
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16,
                                       shuffle=True)


def fit(module, epochs, callbacks):
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1,
                        enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, callbacks=callbacks)
    trainer.fit(module, data())
    return trainer


def module(seed):
    L.seed_everything(seed, verbose=False)
    return Tiny()


def tensor_ids(repo, rev, prefix):
    manifest = repo.read_manifest(repo.read_commit(repo.resolve(rev)).manifest)
    return {k: e.id for k, e in manifest.tensors.items() if k.startswith(prefix)}


def test_a_commit_per_epoch_with_epoch_step_metrics_and_hparams(repo):
    from vrl.integrations.lightning import SnapshotCallback

    model = module(0)
    trainer = fit(model, 3, [SnapshotCallback(repo, branch="run", committer="thread")])
    log = repo.log("run")
    assert [e.commit.step for e in log] == [12, 8, 4]  # the global step: 4 batches an epoch
    assert [e.commit.message.split(":")[0] for e in log] == \
        ["epoch 2 step 12", "epoch 1 step 8", "epoch 0 step 4"]
    last = log[0].commit
    assert last.metrics["train_loss"] == pytest.approx(
        float(trainer.callback_metrics["train_loss"]))
    assert last.hparams["lr"] == 0.05 and last.hparams["hidden"] == 8
    assert "Tanh" in last.hparams["act"]  # not JSON: kept as its repr
    state = repo.load("run")
    for name, value in model.state_dict().items():
        assert torch.equal(state["model"][name], value)
    assert state["lightning"]["epoch"] == 2 and state["lightning"]["global_step"] == 12
    # after the last epoch's scheduler step: halved 3 times, and 4 decays in 12 batches
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.05 / 8 * 0.9**4)
    assert repo.head() is None  # a branch of its own: HEAD's (main) never moved


def test_every_n_epochs_and_the_last_one(repo):
    from vrl.integrations.lightning import SnapshotCallback

    fit(module(0), 4, [SnapshotCallback(repo, every=3, committer="thread")])
    assert [e.commit.message.split(":")[0] for e in repo.log()] == \
        ["epoch 3 step 16", "epoch 2 step 12"]


def test_resume_from_an_epochs_snapshot_is_bit_identical_to_the_straight_run(repo):
    """2 epochs straight; then a fresh module, another seed, resumed from the epoch-0
    snapshot for the second epoch: the same weights, optimizer state and RNG to the bit."""
    from vrl.integrations.lightning import SnapshotCallback

    straight = module(0)
    fit(straight, 2, [SnapshotCallback(repo)])  # on HEAD's branch, process committer
    epoch0 = repo.resolve("HEAD~1")
    head, head_log = repo.head(), repo.refs.reflog("HEAD")

    resumed = module(123)  # other weights, other RNG: all must come from the snapshot
    callback = SnapshotCallback(repo, resume_from=epoch0, branch="resumed",
                                committer="thread")
    trainer = fit(resumed, 2, [callback])
    assert callback.restored["epoch"] == 0
    assert (trainer.current_epoch, trainer.global_step) == (2, 8)
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    # the content-addressed ids say the same of everything committed after the epoch
    assert tensor_ids(repo, "resumed", "") == tensor_ids(repo, "HEAD", "")
    ours, theirs = repo.load("resumed"), repo.load("HEAD")
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
    assert ours["lightning"] == theirs["lightning"]  # counters and scheduler states
    assert repo.read_commit(repo.resolve("resumed")).message.startswith("epoch 1 step 8")
    assert (repo.head(), repo.refs.reflog("HEAD")) == (head, head_log)  # HEAD unmoved


def test_the_resume_check_fails_without_the_rng(repo, monkeypatch):
    """The check above can fail: without the RNG state the second epoch draws another
    data order, and the weights differ."""
    import vrl.rng
    from vrl.integrations.lightning import SnapshotCallback

    straight = module(0)
    fit(straight, 2, [SnapshotCallback(repo, committer="thread")])
    monkeypatch.setattr(vrl.rng, "set_rng_state", lambda state: None)
    resumed = module(123)
    fit(resumed, 2, [SnapshotCallback(repo, resume_from="HEAD~1", branch="resumed",
                                      committer="thread")])
    assert not torch.equal(resumed.net[0].weight, straight.net[0].weight)


def test_restore_without_a_trainer_loads_weights_only_and_keeps_head(repo):
    from vrl.integrations.lightning import SnapshotCallback, restore

    fit(module(0), 1, [SnapshotCallback(repo, committer="thread")])
    head = repo.head()
    fresh = module(5)
    info = restore(repo.workdir, "HEAD", fresh)
    assert info["epoch"] == 0 and info["global_step"] == 4
    for name, value in repo.load("HEAD")["model"].items():
        assert torch.equal(fresh.state_dict()[name], value)
    assert repo.head() == head
    with pytest.raises(VrlError, match="holds no model state"):
        restore(repo, repo.commit({"w": torch.ones(2)}, env=False), fresh)


def test_the_old_names_build_the_same_callback(repo):
    import vrl
    import vrl.hooks
    from vrl.integrations.lightning import SnapshotCallback

    for factory in (vrl.lightning_callback, vrl.hooks.lightning_callback):
        callback = factory(repo, every=2, branch="x")
        assert isinstance(callback, SnapshotCallback) and isinstance(callback, L.Callback)
        assert callback.every == 2 and callback.snapshotter_args == {"branch": "x"}
    import pickle

    copy = pickle.loads(pickle.dumps(SnapshotCallback("runs", every=3)))  # (ddp_spawn)
    assert type(copy) is SnapshotCallback and copy.every == 3


def test_without_lightning_a_one_line_error_says_what_to_install(monkeypatch):
    import vrl.integrations.lightning as integration

    monkeypatch.setattr(integration, "_CALLBACK_CLASS", None)
    for name in ("lightning", "lightning.pytorch", "lightning.pytorch.callbacks",
                 "pytorch_lightning", "pytorch_lightning.callbacks"):
        monkeypatch.setitem(sys.modules, name, None)  # (None: the import fails)
    with pytest.raises(VrlError) as caught:
        integration.SnapshotCallback  # noqa: B018
    assert "pip install 'vrl[lightning]'" in str(caught.value)
    assert "\n" not in str(caught.value)
    import vrl.hooks

    with pytest.raises(VrlError, match="vrl\\[lightning\\]"):
        vrl.hooks.lightning_callback("no-repository-needed-to-say-so")


def test_hyperparameters_are_made_json_safe():
    import numpy as np

    from vrl.integrations.lightning import json_safe

    safe = json_safe({"a": (1, 2.5), "b": np.float32(0.5), "c": torch.tensor(3),
                      "d": float("inf"), "e": torch.zeros(1000), 4: None})
    assert safe["a"] == [1, 2.5] and safe["b"] == 0.5 and safe["c"] == 3
    assert safe["d"] == "inf" and safe["4"] is None
    assert safe["e"].startswith("tensor(") and len(safe["e"]) <= 200


class OddScheduler(torch.optim.lr_scheduler.StepLR):
    def __init__(self, optimizer):
        self.thing = object()  # in its state dict, and no JSON value
        super().__init__(optimizer, step_size=1)


class TinyOdd(Tiny):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [OddScheduler(opt)]


def test_a_scheduler_state_a_snapshot_cannot_hold_is_left_out(repo):
    from vrl.integrations.lightning import SnapshotCallback

    L.seed_everything(0, verbose=False)
    fit(TinyOdd(), 1, [SnapshotCallback(repo, committer="thread")])
    assert repo.load("HEAD")["lightning"]["schedulers"] == [None]
    L.seed_everything(0, verbose=False)
    trainer = fit(TinyOdd(), 2, [SnapshotCallback(repo, resume_from="HEAD",
                                                  committer="thread")])
    assert trainer.global_step == 8
