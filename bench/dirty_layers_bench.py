"""Dirty-layer training vs full training on the warehouse, at equal agent-step budgets.

    python bench/dirty_layers_bench.py --regime both [--seeds 3] [--hidden 128,128]
        [--hidden 512,512,512] [--quick]

Regimes:

* ``scratch``: train from a fresh network on the default task.
* ``finetune``: first train a base policy on the default task with the trainer's defaults
  (``--pretrain-steps``; cached under ``--cache``, keyed by the settings), then change
  the task in three ways - another floor plan
  (``--ft-layout``), more AGVs (``--ft-agents``, 20 -> 30) and a harsher collision penalty
  (``--ft-collision``) - and fine-tune from the base weights and Adam state, at the
  trainer's learning rate annealed over the fine-tune or held (``--ft-schedule``).

Arms (``--arms``): ``full`` (every layer trains), ``threshold`` (the original criterion:
one global relative-change threshold, any layer), ``plasticity`` (each layer's recent
movement over its own earlier movement, read from commit statistics) and ``drift`` (net
change over path length of a layer's last training iterations); the last two freeze
input-side prefixes only (at most ``--max-depth`` layers per network; ``ARM:N``, e.g.
``drift:2``, sets N for that arm alone), so the backward pass stops before the frozen
layers. Every arm snapshots every
iteration into its own store. Reported per regime, size and arm (mean +/- std over seeds):
update wall time, backward wall time (measured in process around ``loss.backward()``),
update FLOPs and backward FLOPs of the Linear layers (counted from the frozen set of each
iteration: forward, weight-gradient and input-gradient matmuls; a cached frozen prefix
counts one forward over the rollout), optimizer steps per layer, final return and
deliveries (mean of the last three episode ends), eval return (the final policy on
``--eval-worlds`` worlds from a fixed seed: common random numbers across the arms of a
seed), each layer's per-commit and net movement, iterations to reach 95% of the
full arm's final return (same seed), and store growth. Wall times on a shared machine are
noisy; FLOPs and optimizer steps are exact. Differences against the full arm are paired
by seed. Writes bench/out/dirty_layers.json and .md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.agent import frozen_prefix_depth
from trainer.config import PPOConfig, config_from_dict
from trainer.dirty_layers import DirtyLayerConfig, DirtyLayerController
from trainer.envs.warehouse import WarehouseEnv
from trainer.hooks import Hook, MetricsRecorder
from trainer.store_hook import StoreHook
from trainer.train import Trainer
from vrl import Repo

OUT = Path(__file__).parent / "out"
ARMS = ("full", "threshold", "plasticity", "drift")


def parse_arm(spec: str) -> tuple[str, int | None]:
    """``drift`` -> ("drift", None); ``drift:2`` -> ("drift", 2): that arm's max depth."""
    name, _, depth = spec.partition(":")
    if name not in ARMS or (depth and (not depth.isdigit() or int(depth) < 1)):
        raise ValueError(f"unknown arm {spec!r}; choose from {', '.join(ARMS)}, "
                         "optionally ARM:N with a max depth N >= 1")
    return name, int(depth) if depth else None


class ComputeCounter(Hook):
    """Per iteration, from the layers frozen during it: update and backward FLOPs of the
    Linear layers and optimizer steps per layer. Must run before the controller changes
    the frozen set (first hook)."""

    def __init__(self, trainer: Trainer) -> None:
        self.flops: list[float] = []
        self.backward_flops: list[float] = []
        self.steps_per_layer: dict[str, int] = {n: 0 for n in trainer.layer_names()}
        self._last_steps = 0

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict) -> None:
        cfg = trainer.config
        batch = trainer.steps_per_iteration
        steps = trainer.algo.optimizer_steps - self._last_steps
        self._last_steps = trainer.algo.optimizer_steps
        samples = batch // cfg.num_minibatches * cfg.num_minibatches * cfg.update_epochs
        fwd = bwd = 0.0
        for net_name in ("actor", "critic"):
            net: nn.Sequential = getattr(trainer.agent, net_name)
            cached = frozen_prefix_depth(net)
            grad_before = False  # does any layer before this one need a gradient?
            for i, m in enumerate(net):
                if not isinstance(m, nn.Linear):
                    continue
                mac2 = 2.0 * m.in_features * m.out_features
                trainable = m.weight.requires_grad
                fwd += mac2 * (batch if i < cached else samples)
                bwd += mac2 * samples * (int(trainable) + int(grad_before))
                grad_before = grad_before or trainable
        self.flops.append(fwd + bwd)
        self.backward_flops.append(bwd)
        for name in self.steps_per_layer:
            if name not in trainer.frozen_layers:
                self.steps_per_layer[name] += steps


def parse_hidden(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def task_env(args: argparse.Namespace, finetune: bool, worlds: int | None = None
             ) -> WarehouseEnv:
    worlds = worlds or args.envs
    if not finetune:
        return WarehouseEnv(worlds, num_agents=args.agents)
    bx, by = (int(x) for x in args.ft_layout.split("x"))
    return WarehouseEnv(worlds, num_agents=args.ft_agents,
                        collision_penalty=args.ft_collision,
                        layout_kwargs={"blocks_x": bx, "blocks_y": by})


def make_config(args: argparse.Namespace, hidden: list[int], seed: int,
                iterations: int, finetune: bool = False) -> PPOConfig:
    """The trainer's defaults for ``--algo``, with the benchmark's budget (and, for a
    fine-tune, its learning rate and schedule)."""
    extra: dict[str, Any] = {}
    if finetune:
        extra["anneal_lr"] = args.ft_schedule == "anneal"
        if args.ft_lr is not None:
            extra["learning_rate"] = args.ft_lr
    return config_from_dict(args.algo, {
        "seed": seed, "num_envs": args.envs, "num_steps": args.steps,
        "num_minibatches": args.minibatches, "update_epochs": args.epochs,
        "hidden_sizes": hidden,
        "total_steps": args.envs * args.agents * args.steps * iterations} | extra)


def base_snapshot(args: argparse.Namespace, hidden: list[int]) -> tuple[Repo, str]:
    """A policy trained on the default task (cached: reused while the settings match)."""
    key = json.dumps({k: getattr(args, k) for k in ("algo", "agents", "pretrain_steps",
                                                   "pretrain_budget")}
                     | {"hidden": hidden}, sort_keys=True)
    path = Path(args.cache) / hashlib.sha256(key.encode()).hexdigest()[:16]
    if (path / "DONE").exists():
        repo = Repo(path)
        return repo, repo.resolve("base")
    shutil.rmtree(path, ignore_errors=True)
    repo = Repo.init(path)
    if args.pretrain_budget:  # the benchmark's (small) batch and epochs
        cfg = make_config(args, hidden, seed=0, iterations=1)
        cfg.total_steps = args.pretrain_steps
        env = task_env(args, finetune=False)
    else:  # the trainer's defaults (8 worlds x 128 steps, 10 x 32 minibatches)
        cfg = config_from_dict(args.algo, {"seed": 0, "hidden_sizes": hidden,
                                           "total_steps": args.pretrain_steps})
        env = WarehouseEnv(cfg.num_envs, num_agents=args.agents)
    rec = MetricsRecorder()
    trainer = Trainer(env, cfg, hooks=[rec])
    start = time.perf_counter()
    trainer.train()
    print(f"base {hidden}: {trainer.iteration} iterations in "
          f"{time.perf_counter() - start:.0f}s, return "
          f"{rec.iterations[-1].get('charts/return_last100', float('nan')):.3f}", flush=True)
    state = {"model": trainer.agent.state_dict(), "algo": trainer.algo.state_dict()}
    cid = repo.commit(state, message="base policy", metrics=trainer.last_metrics, env=False)
    repo.branch("base", cid)
    (path / "DONE").write_text(key)
    return repo, repo.resolve("base")


def tail_mean(values: list[float], last: int = 3) -> float:
    """Mean of the last `last` values that exist (episodes end every max_steps steps)."""
    values = [v for v in values if v == v]
    return statistics.fmean(values[-last:]) if values else float("nan")


def run(regime: str, hidden: list[int], arm: str, seed: int, args: argparse.Namespace,
        work: Path, base: Any) -> dict:
    finetune = regime == "finetune"
    iterations = args.iterations if finetune else args.scratch_iterations
    cfg = make_config(args, hidden, seed, iterations, finetune)
    env = task_env(args, finetune)
    repo_dir = work / f"{regime}-{'x'.join(map(str, hidden))}-{arm}-{seed}"
    shutil.rmtree(repo_dir, ignore_errors=True)
    repo = Repo.init(repo_dir)
    store = StoreHook(repo, branch="run", best_metric=None)
    rec = MetricsRecorder()
    hooks: list[Hook] = [store, rec]
    ctrl = None
    criterion, depth = parse_arm(arm)
    if criterion != "full":
        dcfg = DirtyLayerConfig(criterion=criterion, threshold=args.threshold,
                                window=args.window,
                                plasticity=args.plasticity, reference=args.reference,
                                drift=args.drift,
                                lr_normalise=not args.no_lr_normalise,
                                prefix_only=criterion in ("plasticity", "drift"),
                                max_depth=depth or args.max_depth,
                                networks=tuple(args.freeze_networks.split(","))
                                if args.freeze_networks else None,
                                refresh=args.refresh,
                                warmup=args.warmup, sync=True)
        ctrl = DirtyLayerController(store, dcfg)
        hooks.insert(1, ctrl)
    trainer = Trainer(env, cfg, hooks=hooks)
    if base is not None:
        base_repo, base_id = base
        state = base_repo.load(base_id)
        trainer.agent.load_state_dict({k: torch.as_tensor(v).clone()
                                       for k, v in state["model"].items()})
        trainer.algo.optimizer.load_state_dict(state["algo"]["optimizer"])
        for group in trainer.algo.optimizer.param_groups:
            # the base's saved lr is its annealed end value (~0): start from this run's
            group["lr"] = cfg.learning_rate
    counter = ComputeCounter(trainer)
    trainer.hooks.insert(0, counter)  # sees the frozen set the iteration ran with
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    # the final policy on the run's task: eval_worlds episodes from a fixed seed (the same
    # worlds and sampling stream for every arm of a seed: common random numbers, so the
    # paired difference between arms is not swamped by episode noise)
    trainer.eval_env = task_env(args, finetune, worlds=args.eval_worlds)
    evaluation = trainer.evaluate(num_episodes=args.eval_worlds) if args.eval_worlds else {}
    its = rec.iterations
    curve = [m.get("charts/episodic_return", float("nan")) for m in its]
    size = sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*") if p.is_file())
    movement = layer_movement(repo, store.commits)
    net = {}  # per layer, its net change over the last `span` commits, at each commit
    span = args.drift_span
    for i in range(span, len(store.commits)):
        diff = repo.diff(store.commits[i - span], store.commits[i])
        for lc in diff.layers:
            if lc.layer.startswith("model/") and "/" not in lc.layer[6:]:
                net.setdefault(lc.layer[6:], [None] * span).append(lc.rel)
    return {
        "regime": regime, "hidden": hidden, "arm": arm, "seed": seed, "wall_s": wall,
        "update_s": sum(m["perf/update_s"] for m in its),
        "backward_s": sum(m.get("perf/backward_s", 0.0) for m in its),
        "rollout_s": sum(m["perf/rollout_s"] for m in its),
        "update_gflops": sum(counter.flops) / 1e9,
        "backward_gflops": sum(counter.backward_flops) / 1e9,
        "optimizer_steps_per_layer": counter.steps_per_layer,
        "final_return": tail_mean(curve),
        "eval_return": evaluation.get("eval/return", float("nan")),
        "eval_deliveries": evaluation.get("eval/deliveries", float("nan")),
        "deliveries": tail_mean([m.get("env/deliveries", float("nan")) for m in its]),
        "return_curve": curve,
        "store_mb": size / 1e6,
        "frozen_per_iteration": [f for _, f in ctrl.history] if ctrl else [],
        "measures": ctrl.measures if ctrl else [],
        "movement": movement,
        "net_movement": net,
        "learning_rate": [m.get("charts/learning_rate") for m in its],
    }


def layer_movement(repo: Repo, commits: list[str]) -> dict[str, list[float | None]]:
    """Per layer, its relative change against the parent in every commit (None where
    the layer was frozen or the commit has no parent), from commit statistics."""
    out: dict[str, list[float | None]] = {}
    for cid in commits:
        layers = repo.read_commit(cid).stats.get("layers") or {}
        for name, entry in layers.items():
            if not name.startswith("model/") or "/" in name[6:]:
                continue
            moved = entry.get("status") not in ("unchanged", "added")
            out.setdefault(name[6:], []).append(entry.get("rel") if moved else None)
    return out


def iterations_to(curve: list[float], target: float, smooth: int = 3) -> int | None:
    """First iteration (1-based) whose running mean of `smooth` returns reaches target."""
    seen: list[float] = []
    for i, value in enumerate(curve, 1):
        if value == value:
            seen.append(value)
            if statistics.fmean(seen[-smooth:]) >= target:
                return i
    return None


def fmt(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}g} +/- {std:.2g}"


def table(rows: list[dict]) -> list[str]:
    lines = ["| regime | trunk | arm | update s (noisy) | backward s (noisy) | update GFLOPs "
             "| backward GFLOPs | optimizer steps per layer (mean) | final return | "
             "deliveries | eval return | iterations to 95% | store MB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["regime"], "x".join(map(str, r["hidden"])), r["arm"]),
                          []).append(r)
    for (regime, trunk, arm), group in groups.items():
        full = {r["seed"]: r for r in rows if r["regime"] == regime and r["arm"] == "full"
                and "x".join(map(str, r["hidden"])) == trunk}
        to95 = []
        for r in group:
            ref = full.get(r["seed"])
            if ref is not None and ref["final_return"] == ref["final_return"]:
                target = ref["final_return"] - 0.05 * abs(ref["final_return"])
                to95.append(iterations_to(r["return_curve"], target))
        steps = [statistics.fmean(r["optimizer_steps_per_layer"].values()) for r in group]
        reached = [t for t in to95 if t is not None]
        lines.append(
            f"| {regime} | {trunk} | {arm} | {fmt([r['update_s'] for r in group])} | "
            f"{fmt([r['backward_s'] for r in group])} | "
            f"{fmt([r['update_gflops'] for r in group], 4)} | "
            f"{fmt([r['backward_gflops'] for r in group], 4)} | {fmt(steps, 4)} | "
            f"{fmt([r['final_return'] for r in group])} | "
            f"{fmt([r['deliveries'] for r in group])} | "
            f"{fmt([r.get('eval_return', float('nan')) for r in group])} | "
            f"{fmt(reached) if reached else 'n/a'}"
            f"{f' ({len(reached)}/{len(to95)} reached)' if len(reached) < len(to95) else ''}"
            f" | {fmt([r['store_mb'] for r in group])} |")
    return lines


def savings(rows: list[dict]) -> list[str]:
    out = []
    keys = sorted({(r["regime"], "x".join(map(str, r["hidden"])), r["arm"]) for r in rows})
    for regime, trunk, arm in keys:
        if arm == "full":
            continue
        mine = [r for r in rows if (r["regime"], "x".join(map(str, r["hidden"])), r["arm"])
                == (regime, trunk, arm)]
        full = {r["seed"]: r for r in rows if (r["regime"], "x".join(map(str, r["hidden"])),
                                                r["arm"]) == (regime, trunk, "full")}
        pairs = [(r, full[r["seed"]]) for r in mine if r["seed"] in full]
        if not pairs:
            continue

        def rel(key: str, pairs: list = pairs) -> str:
            return fmt([100 * (1 - r[key] / f[key]) for r, f in pairs if f[key]], 3)

        ret = fmt([100 * (r["final_return"] - f["final_return"]) / abs(f["final_return"])
                   for r, f in pairs if f["final_return"]], 3)
        diff = fmt([r["final_return"] - f["final_return"] for r, f in pairs], 3)
        ev = [(r.get("eval_return", float("nan")), f.get("eval_return", float("nan")))
              for r, f in pairs]
        ev_rel = fmt([100 * (a - b) / abs(b) for a, b in ev if b == b and b], 3)
        ev_diff = fmt([a - b for a, b in ev], 3)
        out.append(f"- {regime}, {trunk}, {arm} vs full (paired by seed, {len(pairs)} "
                   f"seeds): update FLOPs saved {rel('update_gflops')}%, backward FLOPs "
                   f"saved {rel('backward_gflops')}%, update time saved {rel('update_s')}% "
                   f"(noisy), final return change {ret}% (difference {diff}), eval return change "
                   f"{ev_rel}% (difference {ev_diff})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--regime", choices=("scratch", "finetune", "both"), default="both")
    p.add_argument("--arms", default="full,threshold,plasticity",
                   help=f"comma-separated, from {', '.join(ARMS)}")
    p.add_argument("--hidden", action="append", type=parse_hidden,
                   help="trunk widths, e.g. 128,128 (repeat for several sizes)")
    p.add_argument("--algo", default="ppo", choices=("ppo", "gspo"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--first-seed", type=int, default=1,
                   help="seeds first-seed .. first-seed + seeds - 1")
    p.add_argument("--pretrain-steps", type=int, default=1_000_000,
                   help="agent-steps of the base policy (trainer defaults otherwise)")
    p.add_argument("--pretrain-budget", action="store_true",
                   help="train the base with the benchmark's batch and epochs instead")
    p.add_argument("--iterations", type=int, default=30,
                   help="fine-tune budget in iterations of the default task: iterations x "
                   "envs x steps x agents agent-steps (fewer iterations with more AGVs)")
    p.add_argument("--scratch-iterations", type=int, default=30)
    p.add_argument("--envs", type=int, default=4)
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--minibatches", type=int, default=8)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--ft-agents", type=int, default=30)
    p.add_argument("--ft-layout", default="3x4", help="shelf blocks XxY of the new plan")
    p.add_argument("--ft-collision", type=float, default=-0.3)
    p.add_argument("--ft-schedule", choices=("anneal", "constant"), default="anneal",
                   help="fine-tune learning rate: annealed linearly to 0 over the fine-tune "
                   "(the trainer's default) or constant")
    p.add_argument("--ft-lr", type=float, default=None,
                   help="fine-tune learning rate (default: the trainer's)")
    p.add_argument("--threshold", type=float, default=0.01)
    p.add_argument("--plasticity", type=float, default=0.5)
    p.add_argument("--drift", type=float, default=0.6)
    p.add_argument("--max-depth", type=int, default=None,
                   help="prefix arms: freeze at most this many layers per network")
    p.add_argument("--freeze-networks", default=None,
                   help="freeze only layers of these networks (comma-separated, e.g. "
                   "critic; default: any)")
    p.add_argument("--reference", type=int, default=3)
    p.add_argument("--no-lr-normalise", action="store_true",
                   help="plasticity on raw movement (learning-rate annealing counts)")
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--refresh", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(),
                                                   "vrl-dirty-bench-cache"))
    p.add_argument("--out", default=str(OUT / "dirty_layers"),
                   help="output path without extension (.json and .md are written)")
    p.add_argument("--eval-worlds", type=int, default=32,
                   help="evaluate the final policy on this many worlds (one episode each; "
                   "fixed seed per run seed; 0: skip)")
    p.add_argument("--drift-span", type=int, default=4,
                   help="record each layer's net change over this many commits")
    p.add_argument("--include", action="append", default=[],
                   help="also tabulate the runs of an earlier output (.json), e.g. the full "
                   "arm of the same seeds run in another invocation; repeatable")
    p.add_argument("--label", default=None,
                   help="name this invocation's non-full arms ARM-LABEL in the tables")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: tiny budgets, one seed, a throwaway cache")
    args = p.parse_args()
    args.hidden = args.hidden or [[128, 128]]
    arms = [a for a in args.arms.split(",") if a]
    for arm in arms:
        try:
            parse_arm(arm)
        except ValueError as exc:
            p.error(str(exc))
    # recorded with the results, so every row can be traced to the command that made it
    command = "python " + shlex.join([sys.argv[0], *sys.argv[1:]])
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="vrl-dirty-"))
    if args.quick:
        args.seeds, args.envs, args.agents, args.ft_agents, args.steps = 1, 1, 4, 6, 32
        args.pretrain_steps, args.iterations, args.scratch_iterations = 256, 8, 8
        args.pretrain_budget = True
        args.epochs, args.minibatches, args.reference, args.window = 1, 2, 2, 1
        args.warmup, args.refresh, args.ft_layout = 1, 5, "2x2"
        args.hidden = [[16]]
        args.cache = str(work / "cache")
    torch.set_num_threads(args.threads)
    regimes = ("scratch", "finetune") if args.regime == "both" else (args.regime,)
    rows: list[dict] = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = Path(f"{out}.json"), Path(f"{out}.md")  # dots in --out stay
    try:
        for hidden in args.hidden:
            for regime in regimes:
                base = base_snapshot(args, hidden) if regime == "finetune" else None
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    for arm in arms:
                        r = run(regime, hidden, arm, seed, args, work, base)
                        if args.label and arm != "full":
                            r["arm"] = f"{arm}-{args.label}"
                        rows.append(r)
                        # after every run, so a long invocation's finished runs are kept
                        json_path.write_text(json.dumps(
                            {"command": command, "args": vars(args), "runs": rows},
                            indent=1))
                        print(f"{regime} {hidden} seed {seed} {arm:10s}: update "
                              f"{r['update_s']:.1f}s backward {r['backward_s']:.1f}s "
                              f"GFLOPs {r['update_gflops']:.1f} return "
                              f"{r['final_return']:.3f} eval {r['eval_return']:.3f} "
                              f"deliveries {r['deliveries']:.2f} "
                              f"store {r['store_mb']:.1f} MB", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load_end = os.getloadavg()[0]
    invocations, notes = [], []  # the included outputs' commands and notes, listed below
    for earlier in args.include:  # tabulated, not written into this output's runs
        ours = {(r["regime"], tuple(r["hidden"]), r["arm"], r["seed"]) for r in rows}
        data = json.loads(Path(earlier).read_text())
        rows += [r for r in data["runs"]
                 if (r["regime"], tuple(r["hidden"]), r["arm"], r["seed"]) not in ours]
        invocations += [i["command"] for i in data.get("invocations", [])]
        if "command" in data:
            invocations.append(data["command"])
        notes.append(data.get("note", ""))
    lines = table(rows) + [""] + savings(rows) + [
        "", f"{args.seeds} seeds; {args.algo}; fine-tune {args.iterations} and scratch "
        f"{args.scratch_iterations} iterations of {args.envs} worlds x {args.steps} steps "
        f"({args.agents} AGVs; fine-tune task: {args.ft_agents} AGVs, {args.ft_layout} "
        f"blocks, collision {args.ft_collision}); base {args.pretrain_steps} "
        f"agent-steps ({'bench budget' if args.pretrain_budget else 'trainer defaults'}); "
        f"{args.epochs} epochs x {args.minibatches} minibatches; fine-tune LR "
        f"{args.ft_schedule}; threshold {args.threshold}, plasticity {args.plasticity} "
        f"(reference {args.reference}), drift {args.drift}, window {args.window}, "
        f"max depth {args.max_depth}, networks {args.freeze_networks or 'any'}, refresh "
        f"{args.refresh}, warmup {args.warmup}; eval "
        f"on {args.eval_worlds} worlds; torch threads {args.threads}.",
        "", f"This invocation (started {started}, 1-minute load average {load_start:.1f} at "
        f"the start and {load_end:.1f} at the end; wall times noisy, FLOPs and optimizer "
        f"steps exact): `{command}`"]
    if invocations:
        lines += ["", f"Included rows ({', '.join(args.include)}) come from these "
                  "invocations. " + " ".join(n for n in notes if n), ""] + [
                      f"- `{c}`" for c in invocations]
    md_path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
