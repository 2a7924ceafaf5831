"""Warehouse, 20 AGVs: PPO vs GSPO vs each GSPO mechanism alone, equal agent-step budget.

    nice -n 10 python bench/trainer_warehouse.py [--steps 2000000] [--seeds 1 2 3]

Every variant uses the same hyperparameters (GSPO's seed defaults except
``num_steps``, which is per env and would otherwise give 2048 x 160 samples per
update); "ppo" is GSPO with all three mechanisms off, which is exactly PPO with
clip 0.2. Results are appended to bench/out/trainer_warehouse.json after every run,
so a partial run still reports. Also measures the classical shortest-path baseline.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from trainer_common import OUT, plot_curves, run, save

from trainer.config import GSPOConfig
from trainer.envs.baseline import run_baseline
from trainer.envs.warehouse import WarehouseEnv

VARIANTS = {
    "ppo": dict(shaper=False, radius=False, replay=False),
    "gspo": dict(shaper=True, radius=True, replay=True),
    "shaper_only": dict(shaper=True, radius=False, replay=False),
    "radius_only": dict(shaper=False, radius=True, replay=False),
    "replay_only": dict(shaper=False, radius=False, replay=True),
}
WORLDS = 8
ENV = dict(num_agents=20, max_steps=256)


def config(seed: int, steps: int, flags: dict, extra: dict) -> GSPOConfig:
    return GSPOConfig(seed=seed, total_steps=steps, num_envs=WORLDS, num_steps=128,
                      hidden_sizes=[128, 128], eval_interval=10, eval_episodes=WORLDS,
                      **flags, **extra)


def _train_curve(run: dict, key: str = "charts/episodic_return") -> tuple[list, list]:
    pts = [(m["iteration"], m[key]) for m in run["iterations"] if key in m]
    return [p[0] for p in pts], [p[1] for p in pts]


def _smooth(ys: list[float], k: int = 3) -> list[float]:
    return [float(np.mean(ys[max(0, i - k + 1):i + 1])) for i in range(len(ys))]


def summarise(results: dict) -> dict:
    """Per variant (mean +- std over seeds): final training return and deliveries (last 5
    logged episodes), final evaluation return and deliveries (last evaluation), iterations
    until the smoothed training return first reaches 90% of PPO's improvement, within-run
    return std over the last 4 evaluations and over the last 10 logged training episodes
    ("policy stability"), and seconds per update."""
    def ms(xs):
        xs = [x for x in xs if x is not None]
        return [float(np.mean(xs)), float(np.std(xs))] if xs else None

    target = None
    if results.get("ppo"):
        starts = [_train_curve(r)[1][0] for r in results["ppo"]]
        ends = [float(np.mean(_train_curve(r)[1][-5:])) for r in results["ppo"]]
        target = float(np.mean(starts) + 0.9 * (np.mean(ends) - np.mean(starts)))
    table = {}
    for name, runs in results.items():
        reach = []
        for r in runs:
            its, ys = _train_curve(r)
            hit = [i for i, y in zip(its, _smooth(ys), strict=True)
                   if target is not None and y >= target]
            reach.append(hit[0] if hit else None)
        table[name] = {
            "seeds": len(runs),
            "train_final_return": ms([np.mean(_train_curve(r)[1][-5:]) for r in runs]),
            "train_final_deliveries": ms([np.mean(_train_curve(r, "env/deliveries")[1][-5:])
                                          for r in runs]),
            "eval_final_return": ms([r["evaluations"][-1]["eval/return"] for r in runs]),
            "eval_final_deliveries": ms([r["evaluations"][-1]["eval/deliveries"]
                                         for r in runs]),
            "eval_final_collisions": ms([r["evaluations"][-1]["eval/collisions"]
                                         for r in runs]),
            "iterations_to_90pct_of_ppo": reach,
            "iterations_to_90pct_mean": ms(reach),
            "return_std_last4_evals": ms([np.std([e["eval/return"]
                                                  for e in r["evaluations"][-4:]])
                                          for r in runs]),
            "return_std_last10_train": ms([np.std(_train_curve(r)[1][-10:]) for r in runs]),
            "update_s": float(np.mean([m["perf/update_s"] for r in runs
                                       for m in r["iterations"]])),
            "wall_s": float(np.mean([r["wall_s"] for r in runs])),
        }
    return {"ppo_90pct_target_train_return": target, "variants": table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--set", nargs="*", default=[], help="extra config key=value")
    ap.add_argument("--tag", default="", help="suffix of the output files")
    args = ap.parse_args()
    from trainer.config import parse_override

    extra = dict(parse_override(s) for s in args.set)
    env_kwargs = {**ENV, **{k[4:]: v for k, v in extra.items() if k.startswith("env.")}}
    extra = {k: v for k, v in extra.items() if not k.startswith("env.")}

    base_env = WarehouseEnv(WORLDS, **env_kwargs)
    classical = run_baseline(base_env, seed=0)
    baseline = {k: float(np.mean([ep[k] for ep in classical])) for k in classical[0]}
    print("baseline:", baseline, flush=True)

    tag = f"_{args.tag}" if args.tag else ""
    path = OUT / f"trainer_warehouse{tag}_runs.json"
    results: dict[str, list] = json.loads(path.read_text()) if path.exists() else {}
    for seed in args.seeds:
        for name in args.variants:
            if any(r["seed"] == seed for r in results.get(name, [])):
                continue  # resume a partial benchmark
            cfg = config(seed, args.steps, VARIANTS[name], extra)
            env = WarehouseEnv(WORLDS, seed=seed, gamma=cfg.gamma, **env_kwargs)
            eval_env = WarehouseEnv(WORLDS, seed=seed + 1, gamma=cfg.gamma, **env_kwargs)
            r = run(env, cfg, eval_env)
            r["seed"] = seed
            results.setdefault(name, []).append(r)
            last = r["evaluations"][-1]
            print(f"{name} seed {seed}: eval return {last['eval/return']:.2f} deliveries "
                  f"{last['eval/deliveries']:.1f} ({r['wall_s']:.0f} s)", flush=True)
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, default=float))
    summary = summarise(results)
    summary["baseline_shortest_path"] = baseline
    summary["steps_per_run"] = args.steps
    summary["env"] = env_kwargs
    summary["worlds"] = WORLDS
    save(f"trainer_warehouse{tag}.json", summary)
    per_iteration = WORLDS * env_kwargs["num_agents"] * 128
    for key, label in (("charts/episodic_return", "return"), ("env/deliveries", "deliveries")):
        series = {}
        for name, runs in results.items():
            series[name] = []
            for r in runs:
                its, ys = _train_curve(r, key)
                series[name].append(([i * per_iteration for i in its], _smooth(ys)))
        plot_curves(OUT / f"trainer_warehouse{tag}_{label}.png", series, "agent-steps",
                    f"training {label} per episode", f"Warehouse, 20 AGVs: {label}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
