"""Snapshot overhead: training wall time with a snapshot every iteration vs none.

    python bench/snapshot_overhead.py [--runs 3] [--iterations 8] [--committer process]

Two policies on the warehouse (20 AGVs): the default warehouse policy and a ~100 MB one
(wide hidden layers, Adam: ~300 MB of state per snapshot). Runs alternate between "off"
and "every iteration" and the median wall time of each is compared (goal: <= 3.5%
overhead, CheckFreq's published bound). Also reported: the training time lost per
snapshot (ms), the time the loop spends inside the snapshot call itself (the hand-over:
copying changed tensors, plus any backpressure wait) and the final flush, and two CPU-time
counts that load on the machine barely moves: the training thread's CPU time per snapshot
beyond a run without snapshots, and the committer process's CPU time (user + sys, its
start-up included) per snapshot. Writes bench/out/snapshot_overhead.json.

Every run's wall time is split in two: the iterations themselves (rollout + update, as the
trainer times them) and the rest, which is where the loop spends its time in the
Snapshotter (its start, each hand-over, the final flush). The second part is measured
directly in each run, and its difference between the two kinds of run is the time the
loop spends in snapshot calls. The first part is where a shared VM's speed drift shows (the
same iteration takes 600-930 ms on one of them): its difference between runs is mostly
that drift, and what snapshots do to it (the committer working on another core while the
loop trains) is measured better by `--in-run N`: one run of N iterations with a snapshot
after every other one, where each iteration that follows a snapshot is timed against the
mean of the iterations just before and just after it (which follow none): the same few
seconds of the machine. Overheads come with a 95% bootstrap interval of their median.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from trainer.config import PPOConfig
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import Hook
from trainer.store_hook import StoreHook
from trainer.train import Trainer
from vrl import Repo

OUT = Path(__file__).parent / "out"

CASES = {
    # name: (hidden sizes, num_envs, num_steps, minibatches, epochs)
    "warehouse policy": ([64, 64], 16, 64, 4, 4),
    "~100 MB policy": ([2560, 2560, 2560], 4, 32, 2, 1),
}


class TimedStoreHook(StoreHook):
    """Measures the time the training loop spends in the snapshot call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.handover: list[float] = []
        self.final_flush = 0.0

    def _snapshot(self, *args, **kwargs) -> None:
        start = time.perf_counter()
        super()._snapshot(*args, **kwargs)
        self.handover.append(time.perf_counter() - start)

    def on_end(self, trainer, metrics) -> None:
        start = time.perf_counter()
        super().on_end(trainer, metrics)
        self.final_flush = time.perf_counter() - start


def config(hidden: list[int], num_envs: int, num_steps: int, minibatches: int, epochs: int,
           iterations: int) -> PPOConfig:
    """A case's PPO config for `iterations` iterations on the 20-AGV warehouse."""
    return PPOConfig(num_envs=num_envs, num_steps=num_steps, hidden_sizes=hidden,
                     num_minibatches=minibatches, update_epochs=epochs,
                     total_steps=num_envs * 20 * num_steps * iterations)


def median_ci(values: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of `values` (seeded: a rerun on the same
    numbers gives the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _ci(r: dict, key: str, fmt: str = "{:+.1f}") -> str:
    """A figure's 95% interval as "[low, high]" ("" where the results predate it)."""
    interval = r.get(key + "_ci95")
    return "[" + ", ".join(fmt.format(v) for v in interval) + "]" if interval else ""


class IterationTimes(Hook):
    """Each iteration's wall time (rollout + update; no hook inside it)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_iteration_end(self, trainer, iteration, metrics) -> None:
        self.times.append(metrics["perf/rollout_s"] + metrics["perf/update_s"])


def in_run(hidden: list[int], num_envs: int, num_steps: int, minibatches: int, epochs: int,
           iterations: int, repo_dir: Path) -> dict:
    """A snapshot after every other iteration; iteration i+1 (after a snapshot) against
    iteration i (after none)."""
    cfg = config(hidden, num_envs, num_steps, minibatches, epochs, iterations)
    shutil.rmtree(repo_dir, ignore_errors=True)
    hook = TimedStoreHook(Repo.init(repo_dir), branch="bench", best_metric=None, every=2)
    times = IterationTimes()
    Trainer(WarehouseEnv(num_envs, num_agents=20), cfg, hooks=[hook, times]).train()
    t = times.times  # t[k]: iteration k + 1; snapshots after the even iterations
    # an iteration after a snapshot against the mean of its neighbours, which follow none
    extras = [t[k] - (t[k - 1] + t[k + 1]) / 2 for k in range(2, len(t) - 1, 2)]
    extra, iteration = statistics.median(extras), statistics.median(t)
    low, high = median_ci(extras)
    handover = statistics.median(hook.handover)
    return {"iterations": iterations, "pairs": len(extras),
            "iteration_ms_median": 1e3 * iteration,
            "extra_after_snapshot_ms": 1e3 * extra,
            "extra_after_snapshot_ms_ci95": [1e3 * low, 1e3 * high],
            "extra_after_snapshot_pct": 100 * extra / iteration,
            "extra_after_snapshot_pct_ci95": [100 * low / iteration, 100 * high / iteration],
            "handover_ms_median": 1e3 * handover,
            "steady_overhead_pct": 100 * (handover + extra) / iteration,
            "final_flush_s": hook.final_flush}


def run_once(hidden: list[int], num_envs: int, num_steps: int, minibatches: int,
             epochs: int, iterations: int, repo_dir: Path | None,
             committer: str | None = None
             ) -> tuple[float, float, int, TimedStoreHook | None, float, float]:
    """(wall s, of it the iterations' own s, parameters, hook, training thread CPU s,
    committer process CPU s)."""
    cfg = config(hidden, num_envs, num_steps, minibatches, epochs, iterations)
    env = WarehouseEnv(num_envs, num_agents=20)
    hook = None
    if repo_dir is not None:
        shutil.rmtree(repo_dir, ignore_errors=True)
        # (no `committer` option before the committer process: pass it only when asked)
        options = {"committer": committer} if committer else {}
        hook = TimedStoreHook(Repo.init(repo_dir), branch="bench", best_metric=None,
                              **options)
    times = IterationTimes()
    trainer = Trainer(env, cfg, hooks=[times] + ([hook] if hook else []))
    params = sum(p.numel() for p in trainer.agent.parameters())
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, cpu = time.perf_counter(), time.thread_time()
    trainer.train()  # on_end flushes every pending snapshot: the cost is all included
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the committer, reaped at close
    child = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    return wall, sum(times.times), params, hook, cpu, child


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--committer", choices=["process", "thread"], default=None,
                        help="the Snapshotter's committer [its default]")
    parser.add_argument("--label", default="", help="a note stored with the results")
    parser.add_argument("--in-run", type=int, default=0, metavar="N",
                        help="also one run of N iterations, a snapshot after every other one "
                        "(see above)")
    parser.add_argument("--only", default="", help="run only the policies whose name "
                        "contains this (e.g. warehouse); the other policies' rows are kept "
                        "from the last run's bench/out/snapshot_overhead.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="vrl-snap-"))
    last = OUT / "snapshot_overhead.json"
    kept = json.loads(last.read_text()) if args.only and last.exists() else {}
    results = {}
    try:
        for name, (hidden, envs, steps, mbs, epochs) in CASES.items():
            if args.only not in name:
                if name in kept:
                    results[name] = kept[name]
                continue
            off, on, its_off, its_on, handover, flush = [], [], [], [], [], []
            cpu_off, cpu_on, committer_cpu = [], [], []
            run_once(hidden, envs, steps, mbs, epochs, 1, None)  # warm up
            for _ in range(args.runs):
                t, its, params, _, cpu, _ = run_once(hidden, envs, steps, mbs, epochs,
                                                     args.iterations, None)
                off.append(t)
                its_off.append(its)
                cpu_off.append(cpu)
                t, its, _, hook, cpu, child = run_once(hidden, envs, steps, mbs, epochs,
                                                       args.iterations, work / "repo",
                                                       args.committer)
                on.append(t)
                its_on.append(its)
                cpu_on.append(cpu)
                committer_cpu.append(child)
                handover += hook.handover
                flush.append(hook.final_flush)
            repo = Repo(work / "repo")
            size = sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*")
                       if p.is_file())
            snapshots = len(repo.log("bench"))
            lost = statistics.median(on) - statistics.median(off)
            base = statistics.median(off)
            # each "every iteration" run against the "off" run just before it (a drift
            # of the machine's speed between rounds cancels out)
            paired = [100 * (b / a - 1) for a, b in zip(off, on, strict=True)]
            # the loop's time outside its iterations (in snapshot calls, with snapshots)
            calls = [(b - bi) - (a - ai) for a, ai, b, bi in
                     zip(off, its_off, on, its_on, strict=True)]
            iterations_change = [100 * (bi / ai - 1) for ai, bi in
                                 zip(its_off, its_on, strict=True)]
            results[name] = {
                "params": params, "model_mb": params * 4 / 1e6,
                "iterations": args.iterations, "off_s": off, "every_iteration_s": on,
                "iterations_off_s": its_off, "iterations_every_iteration_s": its_on,
                "overhead_pct": 100 * (statistics.median(on) / base - 1),
                "paired_overhead_pct": statistics.median(paired),
                "paired_overhead_pct_ci95": list(median_ci(paired)),
                "in_snapshot_calls_ms_per_snapshot": 1e3 * statistics.median(calls) / snapshots,
                "in_snapshot_calls_pct": 100 * statistics.median(calls) / base,
                "in_snapshot_calls_pct_ci95": [100 * c / base for c in median_ci(calls)],
                "iterations_change_pct": statistics.median(iterations_change),
                "iterations_change_pct_ci95": list(median_ci(iterations_change)),
                "lost_ms_per_snapshot": 1e3 * lost / snapshots,
                "handover_ms_median": 1e3 * statistics.median(handover),
                "final_flush_s_median": statistics.median(flush),
                "loop_cpu_off_s": cpu_off, "loop_cpu_on_s": cpu_on,
                "loop_cpu_lost_ms_per_snapshot":
                    1e3 * (statistics.median(cpu_on) - statistics.median(cpu_off)) / snapshots,
                "committer_cpu_ms_per_snapshot":
                    1e3 * statistics.median(committer_cpu) / snapshots,
                "store_mb": size / 1e6, "commits": snapshots,
                "committer": args.committer or "default", "label": args.label,
            }
            r = results[name]
            if args.in_run:
                i = r["in_run"] = in_run(hidden, envs, steps, mbs, epochs, args.in_run,
                                         work / "repo")
                # the run-level overhead from its two parts' steadier measures (a snapshot
                # is never counted as speeding the next iteration up)
                r["decomposed_overhead_pct"] = r["in_snapshot_calls_pct"] + \
                    max(0.0, i["extra_after_snapshot_pct"])
                r["decomposed_overhead_pct_ci95"] = [
                    a + max(0.0, b) for a, b in zip(r["in_snapshot_calls_pct_ci95"],
                                                    i["extra_after_snapshot_pct_ci95"],
                                                    strict=True)]
            if "in_run" in r:
                i = r["in_run"]
                print(f"{name}, in-run ({i['pairs']} pairs): an iteration after a snapshot "
                      f"{i['extra_after_snapshot_ms']:+.1f} ms {_ci(i, 'extra_after_snapshot_ms')}"
                      f" against its neighbours ({i['iteration_ms_median']:.0f} ms), hand-over "
                      f"{i['handover_ms_median']:.1f} ms: {i['steady_overhead_pct']:+.1f}% in "
                      "steady state", flush=True)
            print(f"{name}: {r['overhead_pct']:+.1f}% (paired {r['paired_overhead_pct']:+.1f}% "
                  f"{_ci(r, 'paired_overhead_pct')}; {statistics.median(off):.2f}s -> "
                  f"{statistics.median(on):.2f}s), in snapshot calls "
                  f"{r['in_snapshot_calls_pct']:+.2f}% "
                  f"({r['in_snapshot_calls_ms_per_snapshot']:.1f} ms per snapshot), the "
                  f"iterations' own time {r['iterations_change_pct']:+.1f}% "
                  f"{_ci(r, 'iterations_change_pct')}, {r['lost_ms_per_snapshot']:.1f} ms "
                  f"lost per snapshot, hand-over {r['handover_ms_median']:.1f} ms, final flush "
                  f"{r['final_flush_s_median']:.2f} s; CPU per snapshot: training thread "
                  f"{r['loop_cpu_lost_ms_per_snapshot']:+.1f} ms, committer "
                  f"{r['committer_cpu_ms_per_snapshot']:.0f} ms", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "snapshot_overhead.json").write_text(json.dumps(results, indent=1))
    lines = ["| policy | parameters | runs x iterations | no snapshots | snapshot every "
             "iteration | overhead: medians / paired (95% interval) | in snapshot calls "
             "(per snapshot) | the iterations' own time, paired | hand-over | training CPU / "
             "committer CPU per snapshot | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        calls = (f"{r['in_snapshot_calls_pct']:+.2f}% "
                 f"({r['in_snapshot_calls_ms_per_snapshot']:.1f} ms)"
                 if "in_snapshot_calls_pct" in r else "-")
        change = (f"{r['iterations_change_pct']:+.1f}% {_ci(r, 'iterations_change_pct')}"
                  if "iterations_change_pct" in r else "-")
        lines.append(f"| {name} | {r['params'] / 1e6:.2f} M ({r['model_mb']:.0f} MB) | "
                     f"{len(r['off_s'])} x {r['iterations']} | "
                     f"{statistics.median(r['off_s']):.2f} s | "
                     f"{statistics.median(r['every_iteration_s']):.2f} s | "
                     f"{r['overhead_pct']:+.1f}% / {r['paired_overhead_pct']:+.1f}% "
                     f"{_ci(r, 'paired_overhead_pct')} | {calls} | {change} | "
                     f"{r['handover_ms_median']:.1f} ms | "
                     f"{r['loop_cpu_lost_ms_per_snapshot']:+.0f} ms / "
                     f"{r['committer_cpu_ms_per_snapshot']:.0f} ms | <= 3.5% |")
    steady = [(name, r) for name, r in results.items() if "in_run" in r]
    if steady:
        lines += ["", "| policy | in-run: iterations (pairs) | iteration | an iteration after "
                  "a snapshot vs its neighbours (95% interval) | hand-over | steady-state "
                  "overhead | overhead = in snapshot calls + the iteration after (95% "
                  "interval) |", "|---|---|---|---|---|---|---|"]
        for name, r in steady:
            i = r["in_run"]
            decomposed = (f"**{r['decomposed_overhead_pct']:+.1f}%** "
                          f"{_ci(r, 'decomposed_overhead_pct')}"
                          if "decomposed_overhead_pct" in r else "-")
            lines.append(f"| {name} | {i['iterations']} ({i['pairs']}) | "
                         f"{i['iteration_ms_median']:.0f} ms | "
                         f"{i['extra_after_snapshot_ms']:+.1f} ms "
                         f"{_ci(i, 'extra_after_snapshot_ms', '{:+.0f}')} | "
                         f"{i['handover_ms_median']:.1f} ms | "
                         f"{i['steady_overhead_pct']:+.1f}% | {decomposed} |")
    (OUT / "snapshot_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
