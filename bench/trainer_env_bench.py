"""Warehouse stepping throughput (agent-steps/s), observations included.

    python bench/trainer_env_bench.py [--envs 64] [--agents 20] [--steps 2000] [--device cpu]

Writes bench/out/trainer_env_bench.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from trainer.envs.warehouse import WarehouseEnv


def measure(num_envs: int, num_agents: int, steps: int, device: str, threads: int) -> dict:
    torch.set_num_threads(threads)
    env = WarehouseEnv(num_envs, num_agents=num_agents, device=device)
    env.reset(seed=0)
    gen = torch.Generator(device=device).manual_seed(0)
    actions = [torch.randint(5, (env.num_envs,), generator=gen, device=device)
               for _ in range(64)]
    for i in range(200):  # warm-up, includes episode resets
        env.step(actions[i % 64])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        obs, *_ = env.step(actions[i % 64])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return {"num_envs": num_envs, "num_agents": num_agents, "steps": steps, "device": device,
            "threads": threads, "obs_dim": env.obs_dim,
            "agent_steps_per_s": steps * env.num_envs / dt, "ms_per_step": dt / steps * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--envs", type=int, default=64)
    ap.add_argument("--agents", type=int, default=20)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    results = []
    for threads in (1, 2):
        runs = [measure(args.envs, args.agents, args.steps, args.device, threads)
                for _ in range(args.repeats)]
        best = max(runs, key=lambda r: r["agent_steps_per_s"])
        best["all_agent_steps_per_s"] = [r["agent_steps_per_s"] for r in runs]
        results.append(best)
        print(f"threads={threads}: {best['agent_steps_per_s']:,.0f} agent-steps/s "
              f"({best['ms_per_step']:.3f} ms per step of {args.envs}x{args.agents})")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "trainer_env_bench.json").write_text(json.dumps(
        {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
         "results": results}, indent=2))


if __name__ == "__main__":
    main()
