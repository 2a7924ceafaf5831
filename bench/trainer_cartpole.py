"""PPO on CartPole-v1: mean return over the last 100 training episodes after 500k steps.

    nice -n 10 python bench/trainer_cartpole.py [--steps 500000] [--seeds 1 2 3]

Target: >= 475 for 3 of 3 seeds. Writes bench/out/trainer_cartpole.json and .png.
"""

from __future__ import annotations

import argparse

import numpy as np
from trainer_common import OUT, plot_curves, run, save

from trainer.config import load_config
from trainer.envs.gym_adapter import GymVecEnv


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=500_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    args = ap.parse_args()
    results, curves = [], []
    for seed in args.seeds:
        # CleanRL's defaults: vrl train --env gym:CartPole-v1 --preset cleanrl --seed SEED
        cfg = load_config("ppo", preset="cleanrl")
        cfg.seed, cfg.total_steps = seed, args.steps
        r = run(GymVecEnv("CartPole-v1", cfg.num_envs), cfg)
        last100 = r["iterations"][-1]["charts/return_last100"]
        results.append({"seed": seed, "return_last100": last100, "wall_s": r["wall_s"],
                        "sps": r["global_step"] / r["wall_s"]})
        print(f"seed {seed}: mean return over last 100 episodes {last100:.1f} "
              f"({r['wall_s']:.0f} s)", flush=True)
        curves.append(([m["charts/global_step"] for m in r["iterations"]],
                       [m.get("charts/return_last100", np.nan) for m in r["iterations"]]))
    finals = [x["return_last100"] for x in results]
    summary = {"steps": args.steps, "runs": results, "mean": float(np.mean(finals)),
               "min": float(np.min(finals)),
               "seeds_reaching_475": int(sum(f >= 475 for f in finals))}
    save("trainer_cartpole.json", summary)
    plot_curves(OUT / "trainer_cartpole.png", {"PPO": curves}, "environment steps",
                "mean return (last 100 episodes)", "CartPole-v1, PPO, 3 seeds")
    print(summary)


if __name__ == "__main__":
    main()
