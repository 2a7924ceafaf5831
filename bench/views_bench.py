"""Views benchmark: compare, curves and the layer heatmap on a synthetic history.

    python bench/views_bench.py [--runs 5] [--out bench/out/views_bench.json]

The repository: 10 branches of 100 commits each, branch k starting one commit before the
head of branch k-1, which then takes one more step (1,009 commits; every branch has a
branch point; the longest first-parent line holds 991 commits). Every commit carries
30 metrics, ~25 hyperparameters (nested), an environment record, the frozen layers and
layer statistics for 50 model layers plus optimizer state, as a training snapshot does.
Commits are written directly into one pack (their snapshots share one small manifest):
the views read commits only, so tensor data plays no part.

Each figure is the median of --runs calls, each on a freshly opened repository (nothing
cached, as for a CLI call), as wall-clock and CPU seconds (`*_cpu_s`, steadier on a busy
machine); `vrl compare` is also timed as a command (interpreter start and imports
included).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from vrl import Repo, views
from vrl.objects import Commit, Manifest, TensorEntry

BRANCHES, PER_BRANCH, METRICS, LAYERS = 10, 100, 30, 50


def build(root: Path) -> Repo:
    Repo.init(root)
    repo = Repo(root, fsync=False)
    rng = random.Random(0)
    tensor = repo.objects.write("tensor", b"\0" * 64)
    tensors = {f"model/layer.{i}.weight": TensorEntry(tensor, "float32", (16,), 64)
               for i in range(LAYERS)}
    manifest = repo.objects.write("manifest", Manifest(tensors, {}).to_bytes())
    env = {"python": "3.11.9", "os": "Linux-6.8-x86_64", "cpu": "x86_64", "torch": "2.13.0",
           "cuda": None, "device": "cpu", "packages": "f" * 64, "seeds": {"torch": 1},
           "code": {"commit": "a" * 40, "branch": "main", "dirty": False}}
    layer_names = [f"model/layer.{i}" for i in range(LAYERS)] + \
        [f"algo/optimizer/state/{i}" for i in range(2 * LAYERS)]
    heads: list[str] = []
    count = 0
    with repo.objects.batch():
        for b in range(BRANCHES):
            hparams = {"algo": {"lr": 3e-4 * (1 + b % 3), "clip": 0.2, "epochs": 4,
                                "gamma": 0.99, "gae_lambda": 0.95, "ent_coef": 0.01 * b},
                       "env": {"id": "warehouse", "agents": 20, "size": [16, 16]},
                       "net": {"hidden": 64, "depth": 2 + b % 2}, "seed": b,
                       "steps": 1_000_000, "envs": 16, "device": "cpu",
                       "dirty": {"threshold": 0.02, "window": 3, "refresh": 10}}
            parent = None
            if b:
                line = heads[-1]  # one before the previous branch's head
                parent = repo.read_commit(line).parents[0]
            ids = []
            for i in range(PER_BRANCH):
                count += 1
                step = (repo.read_commit(parent).step + 2048) if parent else 0
                layers = {name: {"status": "changed", "shapes": [[64, 64]],
                                 "rel": rng.random() * 0.05, "max_abs": rng.random(),
                                 "material": True, "nbytes": 16384} for name in layer_names}
                metrics = {f"group{m // 10}/metric_{m}": rng.gauss(m, 1) for m in range(METRICS)}
                metrics["charts/return_last100"] = i + b + rng.random()
                commit = Commit(
                    manifest=manifest, parents=(parent,) if parent else (),
                    message=f"iter {i}", author="bench",
                    time=f"2026-11-29T{count // 3600:02d}:{count // 60 % 60:02d}:"
                         f"{count % 60:02d}.000000Z",
                    hparams=hparams, metrics=metrics, env=env, step=step,
                    stats={"threshold": 1e-3, "bytes_new": 1, "bytes_total": 1,
                           "summary": "", "layers": layers, "parent": parent},
                    meta={"iteration": i, "frozen_layers": [f"layer.{j}" for j in
                                                            range(i % 7)]})
                parent = repo.objects.write("commit", commit.to_bytes())
                ids.append(parent)
            if b:  # the previous branch takes one more step after this one left it
                prev = repo.read_commit(heads[-1])
                extra = Commit(**{**prev.__dict__, "parents": (heads[-1],),
                                  "stats": {**prev.stats, "parent": heads[-1]},
                                  "message": "one more"})
                heads[-1] = repo.objects.write("commit", extra.to_bytes())
                count += 1
            heads.append(ids[-1])
    for b, head in enumerate(heads):
        repo.refs.update("refs/heads/" + ("main" if b == 0 else f"exp{b}"), head)
    return repo


def median(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of `fn`; on a busy machine the CPU time
    is the steadier figure."""
    walls, cpus = [], []
    for _ in range(runs):
        cpu = time.process_time() + _children_cpu()
        start = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() + _children_cpu() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="bench/out/views_bench.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        start = time.perf_counter()
        repo = build(root)
        built = time.perf_counter() - start
        longest = max(repo.branches(), key=lambda b: len(views.History(repo).line(
            repo.resolve(b))))
        commits = len(views.graph(repo)["commits"])
        heat = views.layer_heatmap(Repo(root), longest)
        table = views.compare(Repo(root))
        assert len(table["rows"]) == BRANCHES, table["rows"]
        results = {
            "commits": commits, "branches": BRANCHES, "metrics_per_commit": METRICS + 1,
            "heatmap_shape": [len(heat["layers"]), len(heat["commits"])],
            "build_s": round(built, 2),
            "compare_s": median(lambda: views.compare(Repo(root)), args.runs),
            "compare_chosen_metrics_s": median(
                lambda: views.compare(Repo(root), metrics=["charts/return_last100"],
                                      sort="charts/return_last100"), args.runs),
            "curves_10_runs_s": median(
                lambda: views.curves(Repo(root), "charts/return_last100"), args.runs),
            "heatmap_s": median(lambda: views.layer_heatmap(Repo(root), longest), args.runs),
            "graph_s": median(lambda: views.graph(Repo(root)), args.runs),
            "metric_names_s": median(lambda: views.metric_names(Repo(root)), args.runs),
        }
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        command = [sys.executable, "-c", "import sys; from vrl.cli import main; "
                   "sys.exit(main(sys.argv[1:]))", "compare"]
        results["vrl_compare_command_s"] = median(
            lambda: subprocess.run(command, cwd=root, env=env, check=True,
                                   capture_output=True), args.runs)
        results["vrl_compare_json_command_s"] = median(
            lambda: subprocess.run([*command, "--json"], cwd=root, env=env, check=True,
                                   capture_output=True), args.runs)
    for key, value in list(results.items()):
        if key.endswith("_s") and isinstance(value, tuple):
            results[key] = round(value[0], 3)
            results[key[:-2] + "_cpu_s"] = round(value[1], 3)
    results["load_average"] = os.getloadavg()[0]
    print(json.dumps(results, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
