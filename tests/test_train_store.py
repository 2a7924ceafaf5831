"""Training through the store: snapshots, exact resume, branching, dirty-layer training."""

import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import assert_same

from trainer.config import GSPOConfig, PPOConfig
from trainer.dirty_layers import DirtyLayerConfig, DirtyLayerController
from trainer.envs.warehouse import WarehouseEnv
from trainer.store_hook import StoreHook
from trainer.train import Trainer
from vrl import Repo


def make_trainer(config_cls=PPOConfig, iterations=6, hooks=(), **kw):
    cfg = config_cls(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * iterations,
                     hidden_sizes=[16], num_minibatches=4, update_epochs=2, **kw)
    env = WarehouseEnv(2, num_agents=4, max_steps=24, layout_kwargs=dict(blocks_x=2,
                                                                          blocks_y=2))
    return Trainer(env, cfg, hooks=list(hooks))


def weights(trainer):
    return {k: v.clone() for k, v in trainer.agent.state_dict().items()}


@pytest.mark.parametrize("config_cls", [PPOConfig, GSPOConfig])
def test_resume_from_a_snapshot_is_bit_identical(repo, config_cls):
    straight = make_trainer(config_cls, iterations=6)
    straight.train()

    hook = StoreHook(repo, branch="run")
    first = make_trainer(config_cls, iterations=6, hooks=[hook])
    first.train(iterations=3)
    hook.close()
    assert len(repo.log("run")) == 3
    snapshot = repo.log("run")[0].id

    resumed = make_trainer(config_cls, iterations=6)
    resumed.load_state_dict(repo.load(snapshot))
    resumed.train()
    assert resumed.iteration == straight.iteration == 6
    assert_same(weights(straight), weights(resumed))
    assert_same(straight.optimizer.state_dict(), resumed.optimizer.state_dict())


def test_snapshot_contents_and_messages(repo):
    hook = StoreHook(repo, branch="run", every=2)
    trainer = make_trainer(iterations=5, hooks=[hook])
    trainer.train()
    log = repo.log("run")
    assert [e.commit.meta["iteration"] for e in log] == [5, 4, 2]  # every 2 + the last
    top = log[0].commit
    assert top.message.startswith("iter 5")
    assert top.hparams["num_steps"] == 16 and top.step == trainer.global_step
    assert "losses/value_loss" in top.metrics
    assert top.env["python"]
    state = repo.load(log[0].id)
    assert set(state) >= {"model", "algo", "rng", "env", "iteration", "config"}
    assert_same(weights(trainer), state["model"])


def test_branch_from_snapshot_keeps_lineage(repo):
    hook = StoreHook(repo, branch="base")
    trainer = make_trainer(iterations=4, hooks=[hook])
    trainer.train(iterations=2)
    hook.close()
    start = repo.resolve("base")
    repo.branch("tuned", start)
    hook2 = StoreHook(repo, branch="tuned")
    trainer2 = make_trainer(iterations=4, hooks=[hook2], learning_rate=1e-3)
    trainer2.load_state_dict(repo.load(start))
    trainer2.train(iterations=1)
    hook2.close()
    tip = repo.read_commit(repo.resolve("tuned"))
    assert tip.parents == (start,)
    assert tip.hparams["learning_rate"] == 1e-3
    assert repo.read_commit(start).hparams["learning_rate"] != 1e-3
    assert repo.diff("base", "tuned").material  # the layers moved


def tensor_objects(repo):
    return {o for o in repo.objects.ids() if repo.objects.kind_and_size(o)[0] == "tensor"}


def test_frozen_layers_have_no_gradients_unchanged_bytes_and_no_new_objects(repo):
    hook = StoreHook(repo, branch="run")
    trainer = make_trainer(iterations=4, hooks=[hook])
    trainer.train(iterations=1)
    hook.flush()
    frozen = ["actor.0", "critic.0"]
    trainer.freeze_layers(frozen)
    before = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    manifest_before = repo.read_manifest(repo.read_commit(hook.commits[-1]).manifest)
    trainer.train(iterations=1)
    hook.flush()
    for name, p in trainer.agent.named_parameters():
        layer = name.rsplit(".", 1)[0]
        if layer in frozen:
            assert p.grad is None and torch.equal(p, before[name]), name
        else:
            assert not torch.equal(p, before[name]), name
    manifest_after = repo.read_manifest(repo.read_commit(hook.commits[-1]).manifest)
    for name, entry in manifest_after.tensors.items():
        if name.startswith(("model/actor.0.", "model/critic.0.")):
            assert entry.id == manifest_before.tensors[name].id, name
    # optimizer moments of frozen parameters do not change either
    changed = {lc.layer for lc in repo.diff(hook.commits[-2], hook.commits[-1]).material}
    assert not changed & {"model/actor.0", "model/critic.0"}
    assert repo.read_commit(hook.commits[-1]).meta["frozen_layers"] == frozen
    hook.close()


def test_controller_freezes_clean_layers_and_refresh_brings_them_back(repo):
    hook = StoreHook(repo, branch="run")
    cfg = DirtyLayerConfig(threshold=0.0, window=1, refresh=4, warmup=1, sync=True)
    ctrl = DirtyLayerController(hook, cfg)
    trainer = make_trainer(iterations=12, hooks=[hook, ctrl])
    # threshold 0: every layer that moved is dirty, so nothing is frozen
    trainer.train(iterations=3)
    hook.flush()
    assert all(not frozen for _, frozen in ctrl.history)
    # an impossible threshold freezes everything but the min_active layer(s) ...
    ctrl.config.threshold = 1e9
    trainer.train(iterations=4)
    hook.flush()
    decided = dict(ctrl.history)
    layers = set(trainer.layer_names())
    frozen_iters = [it for it, frozen in decided.items() if len(frozen) == len(layers) - 1]
    assert frozen_iters, ctrl.history
    # ... except on refresh iterations, when everything trains once
    assert decided[8] == [] and 8 % cfg.refresh == 0
    assert len(decided[7]) == len(layers) - 1
    # frozen layers do not move, so only the refresh (iteration 8) lets them change again;
    # with a threshold they now exceed they stay unfrozen after it
    ctrl.config.threshold = 0.0
    trainer.train(iterations=1)  # the refresh iteration 8
    assert dict(ctrl.history)[9] == []
    hook.close()


def test_gspo_trains_with_a_fully_frozen_network():
    trainer = make_trainer(GSPOConfig, iterations=2, hessian_interval=1)
    trainer.freeze_layers(["actor.0", "actor.2"])
    before = weights(trainer)
    trainer.train(iterations=1)
    after = weights(trainer)
    assert torch.equal(before["actor.0.weight"], after["actor.0.weight"])
    assert not torch.equal(before["critic.0.weight"], after["critic.0.weight"])


def test_resume_from_a_mid_run_snapshot_is_bit_identical(repo):
    """A snapshot taken while the run went on (not its last) resumes exactly: what the
    Snapshotter committed is the state at the moment it was called."""
    hook = StoreHook(repo, branch="run")
    straight = make_trainer(GSPOConfig, iterations=6, hooks=[hook], hessian_interval=2)
    straight.train()
    hook.close()
    log = repo.log("run")
    assert [e.commit.meta["iteration"] for e in log] == [6, 5, 4, 3, 2, 1]
    middle = next(e.id for e in log if e.commit.meta["iteration"] == 3)
    resumed = make_trainer(GSPOConfig, iterations=6, hessian_interval=2)
    resumed.load_state_dict(repo.load(middle))
    assert resumed.iteration == 3
    resumed.train()
    assert_same(weights(straight), weights(resumed))
    assert_same(straight.optimizer.state_dict(), resumed.optimizer.state_dict())
    assert_same(repo.load("run")["model"], weights(resumed))


TRAIN_SCRIPT = textwrap.dedent("""
    import signal, sys
    import trainer.store_hook as store_hook
    from vrl.cli import main

    real = store_hook.StoreHook._snapshot
    def announce(self, trainer, iteration, metrics):
        real(self, trainer, iteration, metrics)
        print(f"queued {iteration}", flush=True)
    store_hook.StoreHook._snapshot = announce

    def mine(signum, frame):
        print("previous handler called", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, mine)
    code = main(["train", "--set", "num_envs=2", "--set", "num_steps=16",
                 "--set", "hidden_sizes=[16]", "--set", "num_minibatches=2",
                 "--set", "update_epochs=1", "--set", "env.num_agents=4",
                 "--set", "env.max_steps=8", "--no-progress", "--device", "cpu",
                 "--steps", "1000000", "--branch", "run"])
    print(f"restored {signal.getsignal(signal.SIGTERM) is mine}", flush=True)
    sys.exit(code)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_vrl_train_interrupted_commits_every_queued_snapshot(tmp_path, sig):
    """SIGTERM or Ctrl-C mid-run: every snapshot handed over is committed, and the signal
    handler that was there before the run is back (SIGTERM: it is then called)."""
    Repo.init(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", TRAIN_SCRIPT], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = []
    while not lines or lines[-1] != "queued 3":
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        lines.append(line.strip())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    lines += out.strip().splitlines()
    queued = [int(x.split()[1]) for x in lines if x.startswith("queued ")]
    if sig == signal.SIGTERM:
        assert proc.returncode == 7 and "previous handler called" in lines, err
    else:
        assert proc.returncode == 130 and "restored True" in lines, err
    repo = Repo(tmp_path)
    committed = [e.commit.meta["iteration"] for e in repo.log("run")]
    # every queued snapshot is in (one handed over just as the signal came may be too)
    assert committed[::-1] == list(range(1, len(committed) + 1))
    assert set(queued) <= set(committed) and len(committed) <= len(queued) + 1
    assert repo.fsck()["ok"]
