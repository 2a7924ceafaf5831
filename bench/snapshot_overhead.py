"""Snapshot overhead: training wall time with a snapshot every iteration vs none.

    python bench/snapshot_overhead.py [--runs 3] [--iterations 8]

Two policies on the warehouse (20 AGVs): the default warehouse policy and a ~100 MB one
(wide hidden layers, Adam: ~300 MB of state per snapshot). Runs alternate between "off"
and "every iteration" and the median wall time of each is compared (goal: <= 3.5%
overhead, CheckFreq's published bound). Writes bench/out/snapshot_overhead.json.
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

from trainer.config import PPOConfig
from trainer.envs.warehouse import WarehouseEnv
from trainer.store_hook import StoreHook
from trainer.train import Trainer
from vrl import Repo

OUT = Path(__file__).parent / "out"

CASES = {
    # name: (hidden sizes, num_envs, num_steps, minibatches, epochs)
    "warehouse policy": ([64, 64], 16, 64, 4, 4),
    "~100 MB policy": ([2560, 2560, 2560], 4, 32, 2, 1),
}


def run_once(hidden: list[int], num_envs: int, num_steps: int, minibatches: int,
             epochs: int, iterations: int, repo_dir: Path | None) -> tuple[float, int]:
    cfg = PPOConfig(num_envs=num_envs, num_steps=num_steps, hidden_sizes=hidden,
                    num_minibatches=minibatches, update_epochs=epochs,
                    total_steps=num_envs * 20 * num_steps * iterations)
    env = WarehouseEnv(num_envs, num_agents=20)
    hooks = []
    if repo_dir is not None:
        shutil.rmtree(repo_dir, ignore_errors=True)
        hooks.append(StoreHook(Repo.init(repo_dir), branch="bench", best_metric=None))
    trainer = Trainer(env, cfg, hooks=hooks)
    params = sum(p.numel() for p in trainer.agent.parameters())
    start = time.perf_counter()
    trainer.train()  # on_end flushes every pending snapshot: the cost is all included
    return time.perf_counter() - start, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="vrl-snap-"))
    results = {}
    try:
        for name, (hidden, envs, steps, mbs, epochs) in CASES.items():
            off, on = [], []
            run_once(hidden, envs, steps, mbs, epochs, 1, None)  # warm up
            for _ in range(args.runs):
                t, params = run_once(hidden, envs, steps, mbs, epochs, args.iterations, None)
                off.append(t)
                t, _ = run_once(hidden, envs, steps, mbs, epochs, args.iterations,
                                work / "repo")
                on.append(t)
            repo = Repo(work / "repo")
            size = sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*")
                       if p.is_file())
            results[name] = {
                "params": params, "model_mb": params * 4 / 1e6,
                "iterations": args.iterations, "off_s": off, "every_iteration_s": on,
                "overhead_pct": 100 * (statistics.median(on) / statistics.median(off) - 1),
                "store_mb": size / 1e6, "commits": len(repo.log("bench")),
            }
            print(f"{name}: {results[name]['overhead_pct']:+.1f}% "
                  f"({statistics.median(off):.2f}s -> {statistics.median(on):.2f}s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "snapshot_overhead.json").write_text(json.dumps(results, indent=1))
    lines = ["| policy | parameters | iterations | no snapshots | snapshot every iteration "
             "| overhead | goal |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['params'] / 1e6:.2f} M ({r['model_mb']:.0f} MB) | "
                     f"{r['iterations']} | {statistics.median(r['off_s']):.2f} s | "
                     f"{statistics.median(r['every_iteration_s']):.2f} s | "
                     f"{r['overhead_pct']:+.1f}% | <= 3.5% |")
    (OUT / "snapshot_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
