"""Dirty-layer training: prefix freezing that stops the backward pass, the plasticity
criterion from commit statistics, and the benchmark's smoke run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainer.agent import Agent, frozen_prefix_depth
from trainer.config import GSPOConfig, PPOConfig
from trainer.dirty_layers import (
    DirtyLayerConfig,
    DirtyLayerController,
    drift,
    input_side_prefixes,
    movement_history,
    plasticity,
)
from trainer.envs.warehouse import WarehouseEnv
from trainer.store_hook import StoreHook
from trainer.train import Trainer

ROOT = Path(__file__).resolve().parents[2]


def make_trainer(config_cls=PPOConfig, iterations=4, hooks=(), hidden=(16, 16), **kw):
    cfg = config_cls(num_envs=2, num_steps=16, total_steps=2 * 4 * 16 * iterations,
                     hidden_sizes=list(hidden), num_minibatches=4, update_epochs=2, **kw)
    env = WarehouseEnv(2, num_agents=4, max_steps=24,
                       layout_kwargs=dict(blocks_x=2, blocks_y=2))
    return Trainer(env, cfg, hooks=list(hooks))


class CallCounter:
    """Forward calls (with their batch sizes) and backward calls of chosen modules."""

    def __init__(self, trainer, names):
        self.forward = {n: [] for n in names}
        self.backward = {n: 0 for n in names}
        modules = dict(trainer.agent.named_modules())
        for name in names:
            modules[name].register_forward_hook(
                lambda m, i, o, n=name: self.forward[n].append(i[0].shape[0]))
            modules[name].register_full_backward_hook(
                lambda m, gi, go, n=name: self.backward.__setitem__(n, self.backward[n] + 1))


# ------------------------------------------------------------- prefix freezing
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
@pytest.mark.parametrize("config_cls", [PPOConfig, GSPOConfig])
def test_frozen_prefix_gets_no_backward_and_one_forward_per_update(config_cls):
    kw = {"hessian_interval": 1} if config_cls is GSPOConfig else {}
    trainer = make_trainer(config_cls, **kw)
    frozen = ["actor.0", "critic.0"]
    trainer.freeze_layers(frozen)
    counter = CallCounter(trainer, ["actor.0", "critic.0", "actor.2", "critic.2"])
    before = {k: v.clone() for k, v in trainer.agent.state_dict().items()}
    trainer.train(iterations=1)
    batch = trainer.steps_per_iteration
    mb = batch // trainer.config.num_minibatches
    for name in frozen:
        assert counter.backward[name] == 0, name
        # the update ran the frozen layer once over the whole rollout, never per minibatch
        assert counter.forward[name].count(batch) == 1 and mb not in counter.forward[name]
    # the trainable layers after the prefix still train through their minibatches (GSPO's
    # Hessian probes add backward passes of their own)
    steps = trainer.config.update_epochs * trainer.config.num_minibatches
    assert counter.backward["actor.2"] >= steps and counter.backward["critic.2"] >= steps
    for name, p in trainer.agent.named_parameters():
        if name.rsplit(".", 1)[0] in frozen:
            assert p.grad is None and torch.equal(p, before[name]), name
        else:
            assert not torch.equal(p, before[name]), name


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_a_frozen_middle_layer_still_passes_the_backward_through():
    """Only a prefix saves the backward pass: a frozen layer with trainable layers before
    it gets backward calls (its input gradient) but no parameter gradients."""
    trainer = make_trainer()
    trainer.freeze_layers(["actor.2"])
    counter = CallCounter(trainer, ["actor.0", "actor.2"])
    trainer.train(iterations=1)
    assert counter.backward["actor.2"] > 0 and counter.backward["actor.0"] > 0
    assert all(p.grad is None for p in trainer.agent.actor[2].parameters())


def test_prefix_features_give_the_same_outputs_as_the_full_network():
    torch.manual_seed(0)
    agent = Agent(10, 5, [32, 32])
    x = torch.randn(64, 10)
    actions = torch.randint(0, 5, (64,))
    full = agent.get_action_and_value(x, actions)
    for frozen in (["actor.0"], ["actor.0", "actor.2", "critic.0"],
                   ["actor.0", "actor.2", "actor.4", "critic.0", "critic.2", "critic.4"]):
        for name, p in agent.named_parameters():
            p.requires_grad_(name.rsplit(".", 1)[0] not in frozen)
        features = agent.encode_frozen_prefix(x)
        assert features is not None and not features.actor.requires_grad
        idx = torch.arange(10, 40)
        part = agent.get_action_and_value(None, actions[idx], features=features[idx])
        for a, b in zip(full[1:], part[1:], strict=True):
            torch.testing.assert_close(a[idx], b)


def test_frozen_prefix_depth_counts_activations_with_their_layer():
    agent = Agent(4, 3, [8, 8])
    assert frozen_prefix_depth(agent.actor) == 0
    agent.actor[0].weight.requires_grad_(False)
    assert frozen_prefix_depth(agent.actor) == 0  # its bias still trains
    agent.actor[0].bias.requires_grad_(False)
    assert frozen_prefix_depth(agent.actor) == 2
    agent.actor[4].requires_grad_(False)  # not contiguous with the prefix
    assert frozen_prefix_depth(agent.actor) == 2


def test_frozen_prefix_adds_no_tensor_objects_model_or_optimizer(repo):
    hook = StoreHook(repo, branch="run")
    trainer = make_trainer(iterations=4, hooks=[hook])
    trainer.train(iterations=2)
    hook.flush()
    trainer.freeze_layers(["actor.0", "critic.0"])
    ids_before = set(repo.objects.ids())
    first = repo.read_manifest(repo.read_commit(hook.commits[-1]).manifest).tensors
    trainer.train(iterations=1)
    hook.flush()
    second = repo.read_manifest(repo.read_commit(hook.commits[-1]).manifest).tensors
    frozen_params = {i for i, (name, _) in enumerate(trainer.agent.named_parameters())
                     if name.startswith(("actor.0.", "critic.0."))}
    assert frozen_params
    frozen_entries = [n for n in second if n.startswith(("model/actor.0.", "model/critic.0."))]
    # Adam's state of parameter i (moments and step) lives under algo/optimizer/state/<i>/
    optim_entries = [n for n in second if n.startswith("algo/optimizer/state/")
                     and int(n.split("/state/")[1].split("/")[0]) in frozen_params]
    assert len(frozen_entries) == 4 and optim_entries, sorted(second)
    new_ids = set(repo.objects.ids()) - ids_before
    for name in frozen_entries + optim_entries:
        assert second[name].id == first[name].id and second[name].id not in new_ids, name
    hook.close()


# --------------------------------------------------------- plasticity criterion
def commit(rel: dict[str, float | None], lr: float = 1.0, unchanged=()) -> dict:
    layers = {f"model/{k}": {"status": "modified", "rel": v} for k, v in rel.items()}
    layers.update({f"model/{k}": {"status": "unchanged", "rel": 0.0} for k in unchanged})
    layers["optimizer/state/0/exp_avg"] = {"status": "modified", "rel": 5.0}
    return {"stats": {"layers": layers}, "metrics": {"charts/learning_rate": lr}}


class FakeStore:
    """The two things the controller reads: commit ids and commits (stats, metrics)."""

    def __init__(self, commits: list[dict]) -> None:
        self.data = {f"c{i}": c for i, c in enumerate(commits)}
        self.commits = list(self.data)
        self.repo = SimpleNamespace(read_commit=self.read_commit, diff=self.no_diff)

    def read_commit(self, cid):
        return SimpleNamespace(parents=[], **self.data[cid])

    def no_diff(self, *a, **k):
        raise AssertionError("the plasticity criterion must not diff tensors")

    def flush(self):
        pass


def decide(commits, layers, **cfg):
    store = FakeStore(commits)
    ctrl = DirtyLayerController(store, DirtyLayerConfig(
        criterion="plasticity", window=2, reference=3, warmup=0, refresh=1000, **cfg))
    trainer = SimpleNamespace(layer_names=lambda: layers)
    return ctrl.decide(trainer, len(commits) + 1), ctrl


def test_plasticity_freezes_a_layer_that_stopped_relative_to_itself_not_a_slow_steady_one():
    # "fast" moved 0.2 per iteration and then nearly stopped (0.02); "slow" has always
    # moved 0.005: under the global threshold 0.01 it would be frozen, but it is steady
    history = [commit({"fast": 0.2, "slow": 0.005, "head": 0.1})] * 4 + \
              [commit({"fast": 0.02, "slow": 0.005, "head": 0.1})] * 2
    frozen, ctrl = decide(history, ["fast", "slow", "head"])
    assert frozen == {"fast"}
    assert ctrl.last_changes["fast"] == pytest.approx(0.02 / 0.2)
    assert ctrl.last_changes["slow"] == pytest.approx(1.0)
    assert plasticity([0.005] * 5, 2, 3) == pytest.approx(1.0)


def test_plasticity_divides_by_the_learning_rate_and_skips_frozen_iterations():
    # movement that falls only because the learning rate is annealed is not convergence
    lrs = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    annealed = [commit({"a": 0.1 * lr, "b": 0.1 * lr}, lr=lr) for lr in lrs]
    frozen, _ = decide(annealed, ["a", "b"])
    assert frozen == set()
    frozen, _ = decide(annealed, ["a", "b"], lr_normalise=False)
    assert frozen == set()  # 0.055/0.09 = 0.61 > 0.5: still above the default
    frozen, _ = decide(annealed, ["a", "b"], lr_normalise=False, plasticity=0.8)
    assert len(frozen) == 1  # both look converged; min_active keeps one training
    # iterations in which a layer was frozen (unchanged) are not movement history
    hist = movement_history([commit({"a": 0.1}), commit({}, unchanged=["a"]),
                             commit({"a": 0.3})])
    assert hist == {"a": [0.1, 0.3]}  # and optimizer entries are not layers


def test_plasticity_needs_enough_history_and_prefix_only_keeps_input_side_runs():
    assert plasticity([1.0] * 4, 2, 3) is None
    frozen, _ = decide([commit({"actor.0": 1.0})] * 4, ["actor.0", "critic.0"])
    assert frozen == set()
    layers = ["critic.0", "critic.2", "critic.4", "actor.0", "actor.2", "actor.4"]
    assert input_side_prefixes(layers, {"critic.0", "critic.4", "actor.2"}) == {"critic.0"}
    history = [commit({n: 1.0 for n in layers})] * 3 + \
              [commit({**{n: 1.0 for n in layers}, "actor.2": 0.01, "critic.0": 0.01})] * 2
    assert decide(history, layers)[0] == {"actor.2", "critic.0"}
    assert decide(history, layers, prefix_only=True)[0] == {"critic.0"}


# -------------------------------------------------------------- drift criterion
def walk(steps: dict[str, list], start_norm: float = 10.0, unchanged: dict | None = None):
    """Synthetic snapshots: per layer a position in R^1000 moved by the given steps (None:
    frozen in that commit). Returns commits (statistics as the store writes them) and a
    ``diff(a, b)`` that measures the net change between two of them from the positions."""
    gen = np.random.default_rng(0)
    pos = {n: [gen.standard_normal(1000) * start_norm / np.sqrt(1000)] for n in steps}
    commits = []
    for i in range(len(next(iter(steps.values())))):
        rels, frozen = {}, []
        for name, seq in steps.items():
            x = pos[name][-1]
            if seq[i] is None:
                frozen.append(name)
                pos[name].append(x)
            else:
                pos[name].append(x + seq[i])
                rels[name] = float(np.linalg.norm(seq[i]) / np.linalg.norm(x))
        commits.append(commit(rels, unchanged=frozen))

    def diff(a: str, b: str) -> SimpleNamespace:
        i, j = int(a[1:]) + 1, int(b[1:]) + 1  # pos[n][k + 1] is the position after c<k>
        return SimpleNamespace(layers=[SimpleNamespace(
            layer=f"model/{n}", rel=float(np.linalg.norm(p[j] - p[i]) / np.linalg.norm(p[i])))
            for n, p in pos.items()])

    return commits, diff


def decide_drift(commits, diff, layers, **cfg):
    store = FakeStore(commits)
    store.repo.diff = diff
    ctrl = DirtyLayerController(store, DirtyLayerConfig(
        criterion="drift", window=4, warmup=0, refresh=1000, **{"drift": 0.7, **cfg}))
    trainer = SimpleNamespace(layer_names=lambda: layers)
    return ctrl.decide(trainer, len(commits) + 1), ctrl


def test_drift_freezes_a_jittering_layer_and_keeps_one_that_still_travels():
    gen = np.random.default_rng(1)
    direction = gen.standard_normal(1000) / np.sqrt(1000)
    n = 8
    # "travel" moves the same way every iteration (with some noise), "jitter" moves as
    # far per iteration but in random directions (noise around the point it reached);
    # an annealed learning rate scales the travelling steps down without changing drift
    lr = [1 - k / n for k in range(n)]
    steps = {"travel": [0.05 * lr[k] * (direction + 0.3 * gen.standard_normal(1000)
                                        / np.sqrt(1000)) for k in range(n)],
             "jitter": [0.05 * gen.standard_normal(1000) / np.sqrt(1000) for _ in range(n)]}
    commits, diff = walk(steps)
    frozen, ctrl = decide_drift(commits, diff, ["travel", "jitter"])
    assert frozen == {"jitter"}
    assert ctrl.last_changes["travel"] > 0.9
    assert ctrl.last_changes["jitter"] == pytest.approx(0.5, abs=0.1)  # 1/sqrt(4)
    assert drift([0.1, 0.1], 0.2) == pytest.approx(1.0) and drift([0.0], 0.0) is None


def test_drift_measures_the_last_training_iterations_skipping_frozen_ones():
    gen = np.random.default_rng(2)
    jitter = [0.05 * gen.standard_normal(1000) / np.sqrt(1000) for _ in range(6)]
    travel = [0.05 * np.ones(1000) / np.sqrt(1000)] * 9
    # jitter was frozen for the last three commits: its drift is still that of its last
    # four training iterations (so it stays frozen until a refresh), not "no movement"
    commits, diff = walk({"jitter": jitter + [None] * 3, "travel": travel})
    frozen, ctrl = decide_drift(commits, diff, ["jitter", "travel"])
    assert frozen == {"jitter"} and ctrl.last_changes["jitter"] < 0.7
    # too little history: no measure, the layer trains
    commits, diff = walk({"jitter": jitter[:3], "travel": travel[:3]})
    assert decide_drift(commits, diff, ["jitter", "travel"])[0] == set()


def test_max_depth_freezes_front_to_back_at_most_that_many_layers_per_network():
    layers = ["critic.0", "critic.2", "critic.4", "actor.0", "actor.2", "actor.4"]
    every = set(layers) - {"actor.4"}
    assert input_side_prefixes(layers, every, 1) == {"critic.0", "actor.0"}
    assert input_side_prefixes(layers, every, 2) == every - {"critic.4"}
    assert input_side_prefixes(layers, {"actor.2"}, 1) == set()  # not input-side
    slowed = {n: 0.01 for n in layers} | {"actor.4": 1.0}  # all but the actor's head
    history = [commit({n: 1.0 for n in layers})] * 3 + [commit(slowed)] * 2
    assert decide(history, layers, prefix_only=True)[0] == every
    assert decide(history, layers, prefix_only=True, max_depth=1)[0] == {"critic.0", "actor.0"}
    with pytest.raises(ValueError, match="max_depth"):
        DirtyLayerConfig(max_depth=0)


def run_prefix_controller(repo, cfg, iterations):
    """Train with a controller whose bar nothing meets: once there is history it freezes
    all but min_active layers, and (prefix_only) only input-side runs of each network."""
    hook = StoreHook(repo, branch="run")
    ctrl = DirtyLayerController(hook, cfg)
    trainer = make_trainer(iterations=iterations, hooks=[hook, ctrl])
    trainer.train()
    hook.close()
    layers = trainer.layer_names()
    decided = [set(f) for _, f in ctrl.history]
    assert any("critic.0" in f for f in decided), ctrl.history
    assert all(f == input_side_prefixes(layers, f) and len(f) < len(layers)
               for f in decided), ctrl.history
    return ctrl, layers


def test_drift_controller_runs_with_a_real_store(repo):
    ctrl, _ = run_prefix_controller(repo, DirtyLayerConfig(
        criterion="drift", window=2, warmup=1, drift=1e9, prefix_only=True, sync=True), 6)
    # net change over path length: at most 1 (up to the norms' drift) for every layer
    measured = [v for _, m in ctrl.measures for v in m.values() if v is not None]
    assert measured and all(0 < v <= 1.05 for v in measured), ctrl.measures


def test_networks_limits_freezing_to_the_named_networks(repo):
    # the critic may freeze (two layers, input side); the actor keeps training throughout
    ctrl, _ = run_prefix_controller(repo, DirtyLayerConfig(
        criterion="drift", window=2, warmup=1, drift=1e9, prefix_only=True, max_depth=2,
        networks=("critic",), sync=True), 6)
    decided = [set(f) for _, f in ctrl.history]
    assert {"critic.0", "critic.2"} in decided, ctrl.history
    assert not any(name.startswith("actor") for f in decided for name in f), ctrl.history
    with pytest.raises(ValueError, match="networks must name at least one"):
        DirtyLayerConfig(networks=())


def test_unknown_criterion_is_rejected():
    with pytest.raises(ValueError, match="criterion 'x'.*threshold, plasticity, drift"):
        DirtyLayerConfig(criterion="x")


def test_plasticity_controller_runs_with_a_real_store(repo):
    ctrl, layers = run_prefix_controller(repo, DirtyLayerConfig(
        criterion="plasticity", window=1, reference=1, warmup=1, plasticity=1e9,
        prefix_only=True, sync=True), 5)
    assert set(ctrl.last_changes) == set(layers)


@pytest.mark.slow
def test_bench_quick_smoke(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "bench"
    subprocess.run([sys.executable, str(ROOT / "bench/dirty_layers_bench.py"), "--quick",
                    "--out", str(out)], check=True, env=env, timeout=300,
                   capture_output=True)
    text = out.with_suffix(".md").read_text()
    assert "| finetune | 16 | plasticity |" in text and "| scratch | 16 | full |" in text


def test_vrl_train_dirty_criterion_plasticity_prefix_only(ws, capsys):
    from vrl import Repo
    from vrl.cli import main

    assert main(["init"]) == 0
    small = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
             "--set", "num_minibatches=2", "--set", "update_epochs=1", "--set",
             "env.num_agents=4", "--set", "env.max_steps=8", "--no-progress"]
    code = main(["train", *small, "--steps", str(10 * 2 * 16 * 4), "--branch", "p",
                 "--dirty-layers", "--dirty-criterion", "plasticity", "--dirty-prefix-only",
                 "--dirty-window", "1"])
    assert code == 0, capsys.readouterr().err
    frozen = [set(e.commit.meta["frozen_layers"]) for e in Repo(ws).log("p")]
    layers = ["actor.0", "actor.2", "critic.0", "critic.2"]
    assert all(f == input_side_prefixes(layers, f) for f in frozen), frozen
    assert main(["train", *small, "--dirty-layers", "--dirty-criterion", "x"]) != 0


def test_vrl_train_dirty_drift_max_depth_and_warmup_flags(ws, capsys):
    """--dirty-criterion drift with a bound above any drift (<= 1) freezes whatever it may:
    after --dirty-warmup iterations, and with --dirty-max-depth 1 only each network's
    input layer."""
    from vrl import Repo
    from vrl.cli import main

    assert main(["init"]) == 0
    small = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16,16]",
             "--set", "num_minibatches=2", "--set", "update_epochs=1", "--set",
             "env.num_agents=4", "--set", "env.max_steps=8", "--no-progress"]
    code = main(["train", *small, "--steps", str(10 * 2 * 16 * 4), "--branch", "d",
                 "--dirty-layers", "--dirty-criterion", "drift", "--dirty-drift", "1.01",
                 "--dirty-prefix-only", "--dirty-max-depth", "1", "--dirty-warmup", "3",
                 "--dirty-window", "2", "--dirty-refresh", "100"])
    assert code == 0, capsys.readouterr().err
    frozen = [set(e.commit.meta["frozen_layers"]) for e in Repo(ws).log("d")][::-1]
    assert not any(frozen[:3]), frozen  # the warm-up
    assert set().union(*frozen) == {"actor.0", "critic.0"}, frozen
    assert main(["train", *small, "--dirty-layers", "--dirty-max-depth", "0"]) != 0
    assert "dirty.max_depth must be in [1, inf), got 0" in capsys.readouterr().err
    # --dirty-networks critic: only the critic's layers (its trunk, front to back) freeze
    code = main(["train", *small, "--steps", str(8 * 2 * 16 * 4), "--branch", "c",
                 "--dirty-layers", "--dirty-criterion", "drift", "--dirty-drift", "1.01",
                 "--dirty-prefix-only", "--dirty-max-depth", "2", "--dirty-warmup", "3",
                 "--dirty-window", "2", "--dirty-refresh", "100", "--dirty-networks", "critic"])
    assert code == 0, capsys.readouterr().err
    frozen = [set(e.commit.meta["frozen_layers"]) for e in Repo(ws).log("c")][::-1]
    assert set().union(*frozen) == {"critic.0", "critic.2"}, frozen
    heads = Repo(ws).branches()
    assert main(["train", *small, "--dirty-layers", "--dirty-networks", "critc"]) != 0
    assert "critc is not a network of the policy; choose from actor, critic" in \
        capsys.readouterr().err
    assert Repo(ws).branches() == heads  # refused before any run was started


def test_warmup_and_refresh_count_from_the_branch_point_not_the_snapshot_counter(repo):
    # a fork (`vrl train --from REV --branch NEW`) continues the snapshot's iteration
    # counter; the warm-up after branching must still hold, and refreshes follow the run
    hook = StoreHook(repo, branch="run")
    cfg = DirtyLayerConfig(criterion="threshold", threshold=1e9, window=1, warmup=3,
                           refresh=5, sync=True)
    ctrl = DirtyLayerController(hook, cfg)
    trainer = make_trainer(iterations=1010, hooks=[hook, ctrl])
    trainer.iteration = 1001  # as if resumed from a snapshot taken at iteration 1001
    trainer.train(iterations=7)
    hook.close()
    frozen = [len(f) for _, f in ctrl.history]  # decisions for this run's iterations 2..8
    n = len(trainer.layer_names())
    assert [it for it, _ in ctrl.history] == list(range(1003, 1010))
    # 2, 3: warm-up; 4: all but the most-moving layer frozen; 5: refresh; 6-8 frozen
    assert frozen == [0, 0, n - 1, 0, n - 1, n - 1, n - 1], ctrl.history


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dirty_layers", "dirty_layers_large"])
def test_dvc_stage_command_is_consistent_with_params_and_runs(stage, tmp_path):
    # `dvc repro <stage>` runs this command with params.yaml substituted: every ${...}
    # must resolve and the bench must accept every option (a --quick smoke budget here)
    from helpers import dvc_stage_argv

    argv = dvc_stage_argv(stage)
    assert argv[:2] == ["python", "bench/dirty_layers_bench.py"]
    out = tmp_path / "stage"
    argv[argv.index("--out") + 1] = str(out)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, *argv[1:], "--quick"], check=True, env=env, cwd=ROOT,
                   timeout=600, capture_output=True)
    assert "| full |" in out.with_suffix(".md").read_text()


def test_bench_arm_spec_sets_that_arms_max_depth():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from dirty_layers_bench import parse_arm
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert parse_arm("drift") == ("drift", None)
    assert parse_arm("drift:2") == ("drift", 2)
    for bad in ("drift:0", "drift:x", "nope", "nope:2"):
        with pytest.raises(ValueError, match="unknown arm"):
            parse_arm(bad)


@pytest.mark.slow
def test_bench_keeps_included_rows_and_records_commands(tmp_path):
    # a stage that overwrites its output must not lose the rows of other settings tried:
    # --include tabulates them (with their commands and note) next to the new rows
    import json

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bench = [sys.executable, str(ROOT / "bench/dirty_layers_bench.py"), "--quick",
             "--regime", "finetune"]
    first = tmp_path / "first"
    subprocess.run([*bench, "--arms", "full", "--out", str(first)], check=True, env=env,
                   timeout=300, capture_output=True)
    data = json.loads(first.with_suffix(".json").read_text())
    assert "--arms full" in data["command"]
    for r in data["runs"]:
        r["regime"] = "finetune, earlier"
    tried = tmp_path / "tried.json"
    tried.write_text(json.dumps({"note": "Measured elsewhere.", "runs": data["runs"],
                                 "invocations": [{"command": "python old --x"}]}))
    second = tmp_path / "second"
    subprocess.run([*bench, "--arms", "full,drift:1", "--drift", "1.01", "--out",
                    str(second), "--include", str(tried)], check=True, env=env,
                   timeout=300, capture_output=True)
    text = second.with_suffix(".md").read_text()
    assert "| finetune | 16 | drift:1 |" in text and "| finetune, earlier | 16 | full |" in text
    assert "Measured elsewhere." in text and "- `python old --x`" in text
    assert "--arms full,drift:1" in text
    assert len(json.loads(second.with_suffix(".json").read_text())["runs"]) == 2
    bad = subprocess.run([*bench, "--arms", "drift:0", "--out", str(tmp_path / "x")],
                         env=env, timeout=60, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown arm 'drift:0'" in bad.stderr
