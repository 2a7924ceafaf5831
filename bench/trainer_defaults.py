"""Do the default config (or a preset) learn the warehouse? Seeds x one budget.

    PYTHONPATH=.:bench nice -n 10 python bench/trainer_defaults.py --steps 2000000 \
        --seeds 1 2 3 [--preset NAME] [--set key=value ...] [--tag NAME] [--jobs 3]

Trains exactly what ``vrl train --env warehouse --steps N [--preset NAME]`` trains
(the config comes from ``trainer.config.load_config``, one torch thread per run, runs in
parallel processes), and reports per seed the first and last logged deliveries and
returns, the random policy's figures on the same env, and mean +- std over the seeds.
Writes bench/out/trainer_defaults[_TAG].json. ``--check`` exits 1 unless every seed ends
with >= 3x the deliveries of the first logged episode and a return above random's by
``--margin`` (the learning check of the default config; too slow for the test suite).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from trainer_common import save

from trainer.config import load_config
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import MetricsRecorder
from trainer.train import Trainer


def train_one(seed: int, steps: int, preset: str | None, overrides: list[str]) -> dict:
    torch.set_num_threads(1)
    cfg = load_config("ppo", preset=preset, overrides=overrides)
    cfg.total_steps, cfg.seed = steps, seed
    env_kwargs = {"gamma": cfg.gamma, **cfg.env}
    env = WarehouseEnv(cfg.num_envs, seed=seed, **env_kwargs)
    rec = MetricsRecorder()
    t0 = time.perf_counter()
    Trainer(env, cfg, hooks=[rec]).train()
    wall = time.perf_counter() - t0
    logged = [m for m in rec.iterations if "env/deliveries" in m]
    return {"seed": seed, "wall_s": wall, "iterations": len(rec.iterations),
            "first_deliveries": logged[0]["env/deliveries"],
            "first_return": logged[0]["charts/episodic_return"],
            "final_deliveries": logged[-1]["env/deliveries"],
            "final_return": logged[-1]["charts/episodic_return"],
            "final_return_last100": rec.iterations[-1]["charts/return_last100"],
            "curve": [(m["iteration"], m["charts/episodic_return"], m["env/deliveries"])
                      for m in logged]}


@torch.no_grad()
def random_policy(num_worlds: int, env_kwargs: dict, seed: int = 0) -> dict[str, float]:
    """One truncated episode per world with uniformly random actions."""
    env = WarehouseEnv(num_worlds, seed=seed, **env_kwargs)
    env.reset(seed=seed)
    gen = torch.Generator().manual_seed(seed)
    episodes: list[dict] = []
    while not episodes:
        _, _, _, _, info = env.step(torch.randint(env.num_actions, (env.num_envs,),
                                                  generator=gen))
        episodes = list(info.get("episodes", ()))
    return {k: float(np.mean([ep[k] for ep in episodes])) for k in ("return", "deliveries")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--preset", default=None)
    ap.add_argument("--set", nargs="*", default=[], help="config key=value")
    ap.add_argument("--jobs", type=int, default=3, help="runs in parallel (1 thread each)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--margin", type=float, default=2.0,
                    help="--check: final return must exceed random's by this much")
    args = ap.parse_args()
    cfg = load_config("ppo", preset=args.preset, overrides=args.set)
    env_kwargs = {"gamma": cfg.gamma, **cfg.env}
    rand = random_policy(cfg.num_envs, env_kwargs)
    print(f"random policy: return {rand['return']:.2f} deliveries {rand['deliveries']:.1f}",
          flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(train_one, s, args.steps, args.preset, args.set)
                   for s in args.seeds]
        runs = []
        for fut in futures:
            r = fut.result()
            runs.append(r)
            print(f"seed {r['seed']}: {r['iterations']} it., deliveries "
                  f"{r['first_deliveries']:.1f} -> {r['final_deliveries']:.1f}, return "
                  f"{r['first_return']:.2f} -> {r['final_return']:.2f} (last 100 "
                  f"{r['final_return_last100']:.2f}), {r['wall_s']:.0f} s", flush=True)

    def ms(key: str) -> list[float]:
        xs = [r[key] for r in runs]
        return [float(np.mean(xs)), float(np.std(xs))]

    summary = {"steps": args.steps, "preset": args.preset, "overrides": args.set,
               "random_policy": rand, "final_return": ms("final_return"),
               "final_return_last100": ms("final_return_last100"),
               "final_deliveries": ms("final_deliveries"), "wall_s": ms("wall_s"),
               "runs": runs}
    tag = f"_{args.tag}" if args.tag else ""
    save(f"trainer_defaults{tag}.json", summary)
    print(json.dumps({k: v for k, v in summary.items() if k != "runs"}))
    if args.check:
        bad = [r["seed"] for r in runs
               if r["final_deliveries"] < 3 * max(r["first_deliveries"], 1.0)
               or r["final_return"] < rand["return"] + args.margin]
        if bad:
            print(f"FAILED: seeds {bad} did not learn", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
