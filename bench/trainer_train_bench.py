"""End-to-end training throughput (rollout + update) on the warehouse, 20 AGVs x 64 envs.

    nice -n 10 python bench/trainer_train_bench.py [--iterations 2] [--device cpu]

Same hyperparameters for every variant (GSPO's seed defaults for epochs, minibatches
and clip; 64 steps per env per rollout); only the GSPO mechanisms change.
Writes bench/out/trainer_train_bench.json.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from trainer_common import save

from trainer.config import GSPOConfig
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import MetricsRecorder
from trainer.train import Trainer

VARIANTS = {
    "ppo": dict(shaper=False, radius=False, replay=False),
    "gspo": dict(shaper=True, radius=True, replay=True),
    "shaper_only": dict(shaper=True, radius=False, replay=False),
    "radius_only": dict(shaper=False, radius=True, replay=False),
    "replay_only": dict(shaper=False, radius=False, replay=True),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    for name, flags in VARIANTS.items():
        env = WarehouseEnv(args.envs, device=args.device)
        steps = args.iterations * env.num_envs * args.num_steps
        cfg = GSPOConfig(num_envs=args.envs, num_steps=args.num_steps, total_steps=steps,
                         hidden_sizes=[128, 128], **flags)
        rec = MetricsRecorder()
        Trainer(env, cfg, device=args.device, precision=args.precision, hooks=[rec]).train()
        its = rec.iterations
        rollout = float(np.mean([m["perf/rollout_s"] for m in its]))
        update = float(np.mean([m["perf/update_s"] for m in its]))
        batch = env.num_envs * args.num_steps
        rows[name] = {"rollout_s": rollout, "update_s": update,
                      "sps": batch / (rollout + update),
                      "update_ms_per_minibatch": update / (cfg.update_epochs
                                                           * cfg.num_minibatches) * 1e3,
                      "rollout_agent_steps_per_s": batch / rollout}
        print(f"{name:12s} rollout {rollout:6.2f} s  update {update:6.2f} s  "
              f"SPS {rows[name]['sps']:9,.0f}", flush=True)
    save("trainer_train_bench.json", {"device": args.device, "precision": args.precision,
                                      "threads": args.threads, "envs": args.envs,
                                      "agents": 20, "num_steps": args.num_steps,
                                      "batch": args.envs * 20 * args.num_steps,
                                      "update_epochs": 10, "num_minibatches": 32,
                                      "hidden": [128, 128], "results": rows})


if __name__ == "__main__":
    main()
