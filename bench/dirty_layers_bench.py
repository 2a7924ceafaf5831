"""Dirty-layer training vs full training on the warehouse with GSPO, equal step budget.

    python bench/dirty_layers_bench.py [--seeds 3] [--iterations 40] [--threshold 0.02]

Both arms snapshot every iteration into their own store (so store growth compares too);
the dirty arm adds the DirtyLayerController, which reads layer changes back from the
store. Reported per arm (mean +/- std over seeds): update wall time, the fraction of
parameter-updates actually computed (a backward-FLOPs proxy: trainable parameters summed
over iterations), final return (mean of the last 5 iterations' 100-episode return), and
store growth. Writes bench/out/dirty_layers.json and .md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer.agent import layer_params
from trainer.config import GSPOConfig
from trainer.dirty_layers import DirtyLayerConfig, DirtyLayerController
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import Hook, MetricsRecorder
from trainer.store_hook import StoreHook
from trainer.train import Trainer
from vrl import Repo

OUT = Path(__file__).parent / "out"


class TrainedParams(Hook):
    """Counts the parameters that trained in each iteration."""

    def __init__(self, trainer: Trainer) -> None:
        self.sizes = {name: sum(p.numel() for p in ps)
                      for name, ps in layer_params(trainer.agent).items()}
        self.total = sum(self.sizes.values())
        self.trained: list[int] = []

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict) -> None:
        self.trained.append(self.total - sum(self.sizes[n] for n in trainer.frozen_layers))

    def fraction(self) -> float:
        return sum(self.trained) / (self.total * max(1, len(self.trained)))


def run(seed: int, dirty: bool, args: argparse.Namespace, work: Path) -> dict:
    cfg = GSPOConfig(seed=seed, num_envs=args.envs, num_steps=args.steps,
                     num_minibatches=args.minibatches, update_epochs=args.epochs,
                     hidden_sizes=[args.hidden, args.hidden],
                     total_steps=args.envs * 20 * args.steps * args.iterations)
    env = WarehouseEnv(args.envs, num_agents=20)
    repo_dir = work / f"{'dirty' if dirty else 'full'}-{seed}"
    shutil.rmtree(repo_dir, ignore_errors=True)
    repo = Repo.init(repo_dir)
    store = StoreHook(repo, branch="run", best_metric=None)
    rec = MetricsRecorder()
    hooks = [store, rec]
    ctrl = None
    if dirty:
        ctrl = DirtyLayerController(store, DirtyLayerConfig(
            threshold=args.threshold, window=args.window, refresh=args.refresh,
            warmup=args.warmup))
        hooks.insert(1, ctrl)
    trainer = Trainer(env, cfg, hooks=hooks)
    counter = TrainedParams(trainer)
    trainer.hooks.insert(0, counter)  # before the controller changes the frozen set
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    its = rec.iterations
    returns = [m.get("charts/return_last100") for m in its if "charts/return_last100" in m]
    size = sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*") if p.is_file())
    return {
        "seed": seed, "dirty": dirty, "wall_s": wall,
        "update_s": sum(m["perf/update_s"] for m in its),
        "rollout_s": sum(m["perf/rollout_s"] for m in its),
        "param_update_fraction": counter.fraction(),
        "final_return": statistics.mean(returns[-5:]) if returns else float("nan"),
        "deliveries": statistics.mean([m["env/deliveries"] for m in its[-5:]
                                       if "env/deliveries" in m] or [float("nan")]),
        "store_mb": size / 1e6,
        "frozen_per_iteration": [f for _, f in ctrl.history] if ctrl else [],
    }


def summary(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3g} +/- {std:.2g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--minibatches", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--threshold", type=float, default=0.02)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--refresh", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="vrl-dirty-"))
    rows = []
    try:
        for seed in range(1, args.seeds + 1):
            for dirty in (False, True):
                rows.append(run(seed, dirty, args, work))
                r = rows[-1]
                print(f"seed {seed} {'dirty' if dirty else 'full '}: update {r['update_s']:.1f}s"
                      f" params {r['param_update_fraction']:.2f} return {r['final_return']:.3f}"
                      f" store {r['store_mb']:.1f} MB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    full = [r for r in rows if not r["dirty"]]
    dirty_rows = [r for r in rows if r["dirty"]]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dirty_layers.json").write_text(json.dumps({"args": vars(args), "runs": rows},
                                                      indent=1))
    lines = ["| arm | update time (s) | parameter updates computed | final return | "
             "deliveries / episode | store growth (MB) |", "|---|---|---|---|---|---|"]
    for name, group in (("full training", full), ("dirty-layer", dirty_rows)):
        lines.append(f"| {name} | {summary(group, 'update_s')} | "
                     f"{summary(group, 'param_update_fraction')} | "
                     f"{summary(group, 'final_return')} | {summary(group, 'deliveries')} | "
                     f"{summary(group, 'store_mb')} |")
    saved = 1 - statistics.mean(r["update_s"] for r in dirty_rows) / statistics.mean(
        r["update_s"] for r in full)
    lines.append(f"\nUpdate time saved: {100 * saved:.1f}% ({args.seeds} seeds, "
                 f"{args.iterations} iterations, threshold {args.threshold}, window "
                 f"{args.window}, refresh {args.refresh}).")
    (OUT / "dirty_layers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
