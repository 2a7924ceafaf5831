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


def summarise(results: dict) -> dict:
    """Per variant: final return/deliveries (mean +- std over seeds), iterations to reach
    90% of PPO's improvement, stability (std of the last 5 evaluation returns), update time."""
    def final(run, key):
        evals = [e[key] for e in run["evaluations"]]
        return float(np.mean(evals[-3:]))

    ppo_runs = results.get("ppo", [])
    target = None
    if ppo_runs:
        start = np.mean([r["evaluations"][0]["eval/return"] for r in ppo_runs])
        end = np.mean([final(r, "eval/return") for r in ppo_runs])
        target = float(start + 0.9 * (end - start))
    table = {}
    for name, runs in results.items():
        rets = [final(r, "eval/return") for r in runs]
        dels = [final(r, "eval/deliveries") for r in runs]
        stab = [float(np.std([e["eval/return"] for e in r["evaluations"][-5:]])) for r in runs]
        upd = [float(np.mean([m["perf/update_s"] for m in r["iterations"]])) for r in runs]
        reach = []
        for r in runs:
            hit = [e["iteration"] for e in r["evaluations"]
                   if target is not None and e["eval/return"] >= target]
            reach.append(hit[0] if hit else None)
        table[name] = {
            "seeds": len(runs),
            "final_return": [float(np.mean(rets)), float(np.std(rets))],
            "final_deliveries": [float(np.mean(dels)), float(np.std(dels))],
            "iterations_to_90pct_of_ppo": reach,
            "return_std_last5_evals": [float(np.mean(stab)), float(np.std(stab))],
            "update_s": float(np.mean(upd)),
            "wall_s": float(np.mean([r["wall_s"] for r in runs])),
        }
    return {"ppo_90pct_target_return": target, "variants": table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--set", nargs="*", default=[], help="extra config key=value")
    args = ap.parse_args()
    from trainer.config import parse_override

    extra = dict(parse_override(s) for s in args.set)
    env_kwargs = {**ENV, **{k[4:]: v for k, v in extra.items() if k.startswith("env.")}}
    extra = {k: v for k, v in extra.items() if not k.startswith("env.")}

    base_env = WarehouseEnv(WORLDS, **env_kwargs)
    classical = run_baseline(base_env, seed=0)
    baseline = {k: float(np.mean([ep[k] for ep in classical])) for k in classical[0]}
    print("baseline:", baseline, flush=True)

    path = OUT / "trainer_warehouse_runs.json"
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
    save("trainer_warehouse.json", summary)
    for key, label in (("eval/return", "return"), ("eval/deliveries", "deliveries")):
        series = {name: [([e["charts/global_step"] if "charts/global_step" in e else
                           e["iteration"] * WORLDS * 20 * 128 for e in r["evaluations"]],
                          [e[key] for e in r["evaluations"]]) for r in runs]
                  for name, runs in results.items()}
        plot_curves(OUT / f"trainer_warehouse_{label}.png", series, "agent-steps",
                    f"evaluation {label}", f"Warehouse, 20 AGVs: {label}")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
