"""Runs as branches, measured: PBT against the best run of a grid sweep, and merged fine-tunes.

    python bench/runs_bench.py pbt [--seeds 3] [--iterations 40] [--rounds 8] [--workers 2]
    python bench/runs_bench.py merge [--seeds 3]
    python bench/runs_bench.py pbt|merge --quick       # smoke test: tiny budgets

``pbt`` (through the CLI, in one store, on the warehouse with the trainer's defaults):

* ``grid``: ``vrl sweep`` over ``--lrs`` (4 learning rates) x ``--seeds`` seeds, each run
  ``--iterations`` iterations (40: README's run), the learning rate annealed (the default);
* ``grid-constant``: the same grid with ``anneal_lr=false`` (PBT turns annealing off: this
  arm separates that from PBT itself);
* ``pbt``: per seed r, ``vrl pbt`` with 4 members (``--first-seed 10r``), ``--rounds`` rounds
  of ``iterations / rounds`` iterations, exploring the learning rate (factors 0.8/1.2, or
  a fresh draw from the grid's values with probability 0.25; m0 starts at the trainer's
  default, the others at draws from the grid).

Each arm spends 4 x iterations of agent-steps per seed. Per arm and seed the *selected*
run is the one with the highest training return (mean ``charts/episodic_return`` of its
last three snapshots), as a user picks a winner; every run's final policy is evaluated with
``vrl eval`` on ``--eval-episodes`` worlds from one fixed seed (the same worlds for every
run), and the table shows the selected run's evaluation, the best evaluation of the four
(an oracle choice) and their mean.

``merge`` (in process, the dirty-layer bench's fine-tune regime: its cached base policy,
trained with the trainer's defaults on the default task for ``--pretrain-steps``; the new
task has 30 AGVs, a 3x4 floor plan and a collision penalty of -0.3): per seed s two
fine-tunes of the base (seeds 2s-1 and 2s, ``--ft-iterations``, each committed on its own
branch from the base), then ``repo.merge`` with ``average`` and with ``task-arithmetic:1``
(base + the sum of both deltas). Every policy (base, both parents, both merges) is
evaluated on the new task and on the old one, on ``--eval-episodes`` worlds from one fixed
seed.

Writes bench/out/runs_pbt.{json,md} or bench/out/runs_merge.{json,md} (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "out"
RETURN = "charts/episodic_return"
# a tiny warehouse and network for --quick (per iteration: 2 worlds x 16 steps x 4 AGVs)
QUICK_SETS = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
              "--set", "num_minibatches=2", "--set", "update_epochs=1",
              "--set", "env.num_agents=4", "--set", "env.max_steps=8"]


def fmt(values: list[float], digits: int = 3) -> str:
    values = [v for v in values if v is not None and v == v]
    if not values:
        return "n/a"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.{digits}g} +/- {std:.2g}"


def header(args: argparse.Namespace, started: str, load: float) -> list[str]:
    command = "python " + shlex.join([sys.argv[0], *sys.argv[1:]])
    return [f"`{command}` - started {started}, load average {load:.2f} at the start, "
            f"{os.cpu_count()} CPUs.", ""]


# ------------------------------------------------------------------------------ pbt


def vrl(store: Path, *args: str, log: Path | None = None) -> str:
    """Run the vrl CLI in `store`; its output (also appended to `log`)."""
    done = subprocess.run([sys.executable, "-m", "vrl", *args], cwd=store, text=True,
                          capture_output=True)
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ vrl {shlex.join(args)}\n{done.stdout}{done.stderr}\n")
    if done.returncode != 0:
        raise SystemExit(f"vrl {shlex.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def tail_return(repo: Any, branch: str, last: int = 3) -> float:
    values = []
    for entry in repo.log(branch):
        value = entry.commit.metrics.get(RETURN)
        if isinstance(value, (int, float)) and value == value:
            values.append(float(value))
        if len(values) == last:
            break
    return statistics.fmean(values) if values else float("nan")


def lr_path(repo: Any, branch: str) -> list[float]:
    """The learning rate of every round along the branch's whole lineage (through exploits):
    the schedule PBT found, oldest first."""
    rates: list[float] = []
    for entry in reversed(repo.log(branch)):
        lr = entry.commit.hparams.get("learning_rate")
        if not rates or rates[-1] != lr:
            rates.append(lr)
    return rates


def evaluate(store: Path, branch: str, episodes: int) -> dict[str, float]:
    out = json.loads(vrl(store, "eval", branch, "--episodes", str(episodes), "--seed", "1000",
                         "--json", "--no-baseline"))
    return {"return": out["policy"]["return"], "deliveries": out["policy"]["deliveries"],
            "step": out["step"]}


def pbt_bench(args: argparse.Namespace, work: Path) -> tuple[dict, list[str]]:
    from vrl import Repo

    store, log = work / "store", work / "commands.log"
    store.mkdir()
    vrl(store, "init")
    per_iteration = 2 * 16 * 4 if args.quick else 8 * 128 * 20
    steps = args.iterations * per_iteration
    if args.iterations % args.rounds:
        raise SystemExit("--iterations must be a multiple of --rounds")
    sets = QUICK_SETS if args.quick else []
    seeds = list(range(1, args.seeds + 1))
    lrs = args.lrs.split(",")
    runs: list[dict] = []
    walls: dict[str, float] = {}
    for arm in args.arms.split(","):
        start = time.perf_counter()
        if arm in ("grid", "grid-constant"):
            name = arm.replace("-", "")
            extra = ["--set", "anneal_lr=false"] if arm == "grid-constant" else []
            vrl(store, "sweep", name, "--grid", f"learning_rate={args.lrs}", "--seeds",
                ",".join(map(str, seeds)) + ",", "--steps", str(steps), "--workers",
                str(args.workers), *sets, *extra, log=log)
            groups = {seed: [f"sweep/{name}/learning_rate={lr}-s{seed}" for lr in lrs]
                      for seed in seeds}
        elif arm == "pbt":
            groups = {}
            for seed in seeds:
                vrl(store, "pbt", f"p{seed}", "--population", str(len(lrs)), "--rounds",
                    str(args.rounds), "--steps-per-round", str(steps // args.rounds),
                    "--explore", "learning_rate=factors:0.8,1.2", "--explore",
                    f"learning_rate=resample:choice:{args.lrs}", "--seed", str(seed),
                    "--first-seed", str(10 * seed), "--workers", str(args.workers), *sets,
                    log=log)
                groups[seed] = [f"pbt/p{seed}/m{i}" for i in range(len(lrs))]
        else:
            raise SystemExit(f"unknown arm {arm!r}: choose from grid, grid-constant, pbt")
        walls[arm] = time.perf_counter() - start
        repo = Repo(store)
        for seed, branches in groups.items():
            for branch in branches:
                result = evaluate(store, branch, args.eval_episodes)
                runs.append({"arm": arm, "seed": seed, "branch": branch,
                             "train_return": tail_return(repo, branch),
                             "eval_return": result["return"],
                             "eval_deliveries": result["deliveries"], "step": result["step"],
                             "learning_rates": lr_path(repo, branch)})
                print(f"{arm} seed {seed} {branch}: train {runs[-1]['train_return']:.3f} "
                      f"eval {result['return']:.3f} ({result['deliveries']:.1f} deliveries)",
                      flush=True)
    fsck = vrl(store, "fsck")
    lines = ["| arm | agent-steps per seed | wall | selected run: eval return | its "
             "deliveries | best of 4: eval return | mean of 4: eval return |",
             "|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    for arm in walls:
        rows = [r for r in runs if r["arm"] == arm]
        selected, best, mean, deliveries = [], [], [], []
        for seed in seeds:
            group = [r for r in rows if r["seed"] == seed]
            pick = max(group, key=lambda r: r["train_return"])
            selected.append(pick["eval_return"])
            deliveries.append(pick["eval_deliveries"])
            best.append(max(r["eval_return"] for r in group))
            mean.append(statistics.fmean(r["eval_return"] for r in group))
        summary[arm] = {"selected": selected, "best": best, "mean": mean}
        total = sum(r["step"] for r in rows) // len(seeds)
        lines.append(f"| {arm} | {total:,} | {walls[arm] / 60:.1f} min | {fmt(selected)} | "
                     f"{fmt(deliveries)} | {fmt(best)} | {fmt(mean)} |")
    if "pbt" in summary and "grid" in summary:
        diff = [p - g for p, g in zip(summary["pbt"]["selected"], summary["grid"]["selected"],
                                      strict=True)]
        lines += ["", f"PBT minus grid (selected runs, paired by seed): {fmt(diff)}."]
    winners = [max((r for r in runs if r["arm"] == "pbt" and r["seed"] == s),
                   key=lambda r: r["train_return"]) for s in seeds] if "pbt" in walls else []
    for w in winners:
        path = " -> ".join(f"{lr:g}" for lr in w["learning_rates"])
        lines.append(f"PBT seed {w['seed']} winner {w['branch']}: learning rate {path}.")
    lines.append(f"`vrl fsck` on the store afterwards: {fsck.strip().splitlines()[-1]}")
    return {"runs": runs, "walls": walls, "summary": summary}, lines


# ---------------------------------------------------------------------------- merge


def merge_bench(args: argparse.Namespace, work: Path) -> tuple[dict, list[str]]:
    import dirty_layers_bench as dlb
    import torch

    from trainer.hooks import MetricsRecorder
    from trainer.store_hook import StoreHook
    from trainer.train import Trainer
    from vrl import Repo

    torch.set_num_threads(args.threads)
    # the dirty-layer bench's defaults (its fine-tune regime)
    ns = argparse.Namespace(algo="ppo", agents=20, pretrain_steps=args.pretrain_steps,
                            pretrain_budget=False, cache=args.cache, envs=4, steps=64,
                            minibatches=8, epochs=4, ft_agents=30, ft_layout="3x4",
                            ft_collision=-0.3, ft_schedule=args.ft_schedule, ft_lr=None)
    hidden = [128, 128]
    if args.quick:
        ns.agents, ns.ft_agents, ns.envs, ns.steps, ns.epochs, ns.minibatches = 4, 6, 1, 32, 1, 2
        ns.pretrain_steps, ns.pretrain_budget, ns.ft_layout = 256, True, "2x2"
        hidden = [16]
    base_repo, base_id = dlb.base_snapshot(ns, hidden)
    repo = Repo.init(work / "store")
    base = repo.commit(base_repo.load(base_id), message="base policy", env=False)
    repo.branch("base", base)

    def model_of(rev: str) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(v) for k, v in repo.load(rev)["model"].items()}

    def scores(rev: str, finetune: bool, seed: int) -> dict[str, float]:
        # one fixed seed per task and pair: every policy meets the same worlds
        cfg = dlb.make_config(ns, hidden, seed=1000 + seed, iterations=10, finetune=finetune)
        trainer = Trainer(dlb.task_env(ns, finetune), cfg,
                          eval_env=dlb.task_env(ns, finetune, worlds=args.eval_episodes))
        trainer.agent.load_state_dict(model_of(rev))
        m = trainer.evaluate(num_episodes=args.eval_episodes)
        return {"return": m["eval/return"], "deliveries": m.get("eval/deliveries", 0.0)}

    rows: list[dict] = []
    for seed in range(1, args.seeds + 1):
        parents = []
        for side, fseed in (("a", 2 * seed - 1), ("b", 2 * seed)):
            branch = f"ft-{side}{seed}"
            repo.branch(branch, base)
            cfg = dlb.make_config(ns, hidden, fseed, args.ft_iterations, finetune=True)
            rec = MetricsRecorder()
            trainer = Trainer(dlb.task_env(ns, True), cfg,
                              hooks=[StoreHook(repo, branch=branch, best_metric=None), rec])
            state = repo.load(base)
            trainer.agent.load_state_dict(model_of(base))
            trainer.algo.optimizer.load_state_dict(state["algo"]["optimizer"])
            for group in trainer.algo.optimizer.param_groups:
                group["lr"] = cfg.learning_rate  # the base's saved lr is its annealed end
            trainer.train()
            parents.append(branch)
        soup = repo.merge(parents, "average", branch=f"soup{seed}",
                          message=f"average of {' and '.join(parents)}")
        arith = repo.merge(parents, "task-arithmetic:1", branch=f"arith{seed}",
                           message=f"base + both deltas of {' and '.join(parents)}")
        assert repo.read_commit(soup).meta["merge"]["base"] == base  # the merge base found
        a, b, avg = model_of(parents[0]), model_of(parents[1]), model_of(soup)
        assert all(torch.allclose(avg[k], (a[k] + b[k]) / 2) for k in avg
                   if a[k].is_floating_point())
        policies = {"base": base, "parent a": parents[0], "parent b": parents[1],
                    "average": soup, "task-arithmetic:1": arith}
        row: dict[str, Any] = {"seed": seed}
        for label, rev in policies.items():
            row[label] = {"new": scores(rev, True, seed), "old": scores(rev, False, seed)}
        rows.append(row)
        print(f"pair {seed}: " + ", ".join(f"{k} {v['new']['return']:.3f}/{v['old']['return']:.3f}"
                                           for k, v in row.items() if k != "seed"), flush=True)
    labels = ["base", "parent a", "parent b", "average", "task-arithmetic:1"]
    lines = ["| policy | new task: eval return | new task: deliveries | old task: eval return "
             "| old task: deliveries |", "|---|---|---|---|---|"]
    for label in labels:
        cells = [fmt([r[label][task][key] for r in rows]) for task in ("new", "old")
                 for key in ("return", "deliveries")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for task in ("new", "old"):
        for label in ("average", "task-arithmetic:1"):
            best = [r[label][task]["return"] - max(r["parent a"][task]["return"],
                                                   r["parent b"][task]["return"]) for r in rows]
            mean = [r[label][task]["return"] - (r["parent a"][task]["return"]
                                                + r["parent b"][task]["return"]) / 2
                    for r in rows]
            lines.append(f"{task} task, {label} minus the better parent: {fmt(best)}; minus "
                         f"the parents' mean: {fmt(mean)} (paired by seed).")
    lines[-4] = "\n" + lines[-4]
    return {"pairs": rows}, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=("pbt", "merge"))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=40,
                   help="pbt: iterations per run (8 worlds x 128 steps x 20 AGVs each)")
    p.add_argument("--rounds", type=int, default=8, help="pbt: rounds of PBT")
    p.add_argument("--lrs", default="1e-4,2.5e-4,1e-3,2.5e-3",
                   help="pbt: the grid's learning rates (4: one per member)")
    p.add_argument("--arms", default="grid,grid-constant,pbt")
    p.add_argument("--workers", type=int, default=2, help="pbt: runs at a time")
    p.add_argument("--pretrain-steps", type=int, default=2_000_000,
                   help="merge: agent-steps of the base policy (as the dirty-layer stage)")
    p.add_argument("--ft-iterations", type=int, default=120,
                   help="merge: fine-tune budget in iterations of the default task (4 x 64 "
                   "x 20 agent-steps each; as the dirty-layer stage)")
    p.add_argument("--ft-schedule", choices=("anneal", "constant"), default="constant",
                   help="merge: the fine-tunes' learning rate (as the dirty-layer stage)")
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache", default=os.path.join(tempfile.gettempdir(),
                                                   "vrl-dirty-bench-cache"),
                   help="merge: the dirty-layer bench's base-policy cache")
    p.add_argument("--out", default=None,
                   help="output path without extension (default bench/out/runs_PART)")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny budgets")
    args = p.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="vrl-runs-"))
    if args.quick:
        args.seeds, args.iterations, args.rounds, args.ft_iterations = 1, 4, 2, 3
        args.eval_episodes, args.cache = 4, str(work / "cache")
    try:
        if args.part == "pbt":
            data, lines = pbt_bench(args, work)
        else:
            data, lines = merge_bench(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out) if args.out else OUT / f"runs_{args.part}"
    out.parent.mkdir(parents=True, exist_ok=True)
    data |= {"command": shlex.join(sys.argv), "args": vars(args), "started": started,
             "load_start": load, "load_end": os.getloadavg()[0]}
    Path(f"{out}.json").write_text(json.dumps(data, indent=1, default=float))
    text = "\n".join(header(args, started, load) + lines) + "\n"
    Path(f"{out}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
