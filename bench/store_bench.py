"""Store benchmark: vrl against the strongest baselines measured in the same run.

    python bench/store_bench.py [--runs 5] [--dvc PATH_TO_DVC] [--out bench/out/store_bench.json]
                                [--models small,big] [--no-log]

Models: 100 float32 tensors of 1M elements (400 MB) and a small RL policy (~1 MB).
Every figure is the median of --runs runs (8x as many for the small policy, whose commits
take milliseconds). A commit is timed until it returns, which is when it is durable; its
background write-out (the journal's) is waited for, untimed, before the next contender
runs, and counted in the CPU rows. Ratios are vrl time / baseline time (lower is
better). The page cache is warm for every contender. vrl commits durably (fsync on, its
default), so its commits are compared with durable baselines too: the file written, then
the file and its directory fsynced. Commits here capture no environment (a Snapshotter
captures it once per run).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vrl import Repo
from vrl.snapshotter import Snapshotter


def median_time(fn: Callable[[], object], runs: int, setup: Callable[[], object] | None = None,
                cpu: list[float] | None = None) -> float:
    """Median wall time of `fn`; with `cpu`, the process CPU time (all threads, user +
    system) of each run is appended to it (it depends far less on the machine's load)."""
    times = []
    for _ in range(runs):
        if setup:
            setup()
        start, start_cpu = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
        del out  # freeing what fn returned (a restored state's maps) is not fn's time
    return statistics.median(times)


def interleaved(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Median wall time of each contender, run in turn round after round (load changes
    hit them alike); what a contender returns is freed after its clock stops."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    keys = list(fns)
    for i in range(runs):
        # the order rotates: each contender follows each other one equally often (what the
        # one before leaves behind - page tables to tear down, caches - hits all alike)
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            fn = fns[key]
            start = time.perf_counter()
            out = fn()
            times[key].append(time.perf_counter() - start)
            del out
    return {k: statistics.median(v) for k, v in times.items()}


def count_fsyncs(fn: Callable[[], object]) -> int:
    """How many fsync/fdatasync calls `fn` makes (threads included)."""
    calls = [0]
    real = os.fsync, os.fdatasync

    def counted(fd: int, which: int = 0) -> None:
        calls[0] += 1
        real[which](fd)

    os.fsync, os.fdatasync = counted, lambda fd: counted(fd, 1)  # type: ignore[assignment]
    try:
        fn()
    finally:
        os.fsync, os.fdatasync = real
    return calls[0]


def big_model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(1000, 1000, generator=g) for i in range(100)}


def small_policy() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({
        "actor": torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                     torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                     torch.nn.Linear(256, 5)),
        "critic": torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                      torch.nn.Linear(256, 256), torch.nn.Tanh(),
                                      torch.nn.Linear(256, 1)),
    })
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def durable(path: Path, save: Callable[[], object]) -> None:
    """A baseline made as durable as a vrl commit: written, then file and folder fsynced."""
    save()
    for target, flags in ((path, os.O_RDONLY), (path.parent, os.O_RDONLY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def touch_all(tensors: dict[str, torch.Tensor]) -> float:
    return sum(float(t.sum()) for t in tensors.values())


def store_size(repo: Repo) -> int:
    return sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*") if p.is_file())


def bench_model(name: str, state: dict[str, torch.Tensor], work: Path, runs: int
                ) -> dict[str, float]:
    r: dict[str, float] = {"bytes": sum(t.numel() * t.element_size() for t in state.values())}
    st_path, pt_path = work / "m.safetensors", work / "m.pt"
    r["safetensors_save"] = median_time(lambda: save_file(state, str(st_path)), runs)
    r["torch_save"] = median_time(lambda: torch.save(state, pt_path), runs)

    def save_file_durable() -> None:
        durable(st_path, lambda: save_file(state, str(st_path)))

    def torch_save_durable() -> None:
        durable(pt_path, lambda: torch.save(state, pt_path))

    def fresh(fsync: bool) -> Callable[[], None]:
        def setup() -> None:
            shutil.rmtree(work / "repo", ignore_errors=True)
            Repo.init(work / "repo")
            holder["repo"] = Repo(work / "repo", fsync=fsync)
        return setup

    holder: dict[str, Repo] = {}
    # durable commits and their durable baselines alternate, round by round (a load
    # change on this shared machine hits both alike)
    times: dict[str, list[float]] = {"commit": [], "base": [], "cpu": []}
    for _ in range(runs):
        fresh(True)()
        start, start_cpu = time.perf_counter(), time.process_time()
        holder["repo"].commit(state, env=False)
        times["commit"].append(time.perf_counter() - start)  # returned: durable
        holder["repo"].sync()  # its files written (in the background): not in the baseline
        times["cpu"].append(time.process_time() - start_cpu)
        start = time.perf_counter()
        save_file_durable()
        times["base"].append(time.perf_counter() - start)
    r["vrl_first_commit"] = statistics.median(times["commit"])
    r["vrl_first_commit_cpu"] = statistics.median(times["cpu"])
    r["safetensors_save_fsync"] = statistics.median(times["base"])
    fresh(True)()
    r["vrl_first_commit_fsyncs"] = count_fsyncs(  # (its background write-out included)
        lambda: (holder["repo"].commit(state, env=False), holder["repo"].sync()))
    r["vrl_first_commit_nofsync"] = median_time(
        lambda: holder["repo"].commit(state, env=False), runs, fresh(False))

    # incremental: one of the tensors changes in place between commits (as a training
    # step would), the repository stays open, fsync on, environment captured
    fresh(True)()
    repo = holder["repo"]
    repo.commit(state, env=False)
    victim = next(iter(state.values()))

    def change() -> None:
        victim.add_(0.001)

    def incremental() -> None:
        repo.commit(state, env=False)  # exact: every byte is read (no copy is held)

    # the timed rounds interleave the two contenders and nothing else (the store's growth
    # is measured in rounds of its own, below: walking the store before each commit would
    # stand between the baseline and the commit)
    times, cpu, base = [], [], []
    for _ in range(runs):
        change()
        start, start_cpu = time.perf_counter(), time.process_time()
        incremental()
        times.append(time.perf_counter() - start)  # returned: durable
        repo.sync()  # its files written (in the background): not in the baseline
        cpu.append(time.process_time() - start_cpu)
        start = time.perf_counter()
        torch_save_durable()
        base.append(time.perf_counter() - start)
    growth = []
    for _ in range(3):
        before = store_size(repo)
        change()
        incremental()
        repo.sync()
        growth.append(store_size(repo) - before)
    r["vrl_incremental_commit"] = statistics.median(times)
    r["vrl_incremental_commit_cpu"] = statistics.median(cpu)
    r["torch_save_fsync"] = statistics.median(base)
    if r["bytes"] < 16 << 20:  # the mean of many small commits, pack merges included
        start = time.perf_counter()
        for _ in range(64):
            victim.add_(0.001)
            incremental()
        r["vrl_incremental_commit_mean"] = (time.perf_counter() - start) / 64
    change()
    r["vrl_incremental_commit_fsyncs"] = count_fsyncs(lambda: (incremental(), repo.sync()))
    r["store_growth_per_incremental"] = statistics.median(growth)
    r["changed_tensor_bytes"] = victim.numel() * victim.element_size()

    # through the Snapshotter, which holds the previous copies: step() then flush() (the
    # commit has landed when flush returns)
    snap = Snapshotter(repo, state_fn=lambda: state, include_rng=False, env=False,
                       handle_sigterm=False)
    try:
        snap.step(0)
        snap.flush()
        times = []
        for i in range(runs):
            victim.add_(0.001)
            start = time.perf_counter()
            snap.step(i + 1)
            snap.flush()
            times.append(time.perf_counter() - start)
    finally:
        snap.close()
    r["vrl_snapshotter_commit"] = statistics.median(times)

    save_file(state, str(st_path))
    # restore: until the state is returned; then, separately, restore and drop the state
    # (vrl unmaps one file per tensor, load_file one file)
    r.update(interleaved({
        "safetensors_load": lambda: load_file(str(st_path)),
        "vrl_load": lambda: repo.load("HEAD"),
        "safetensors_load_drop": lambda: len(load_file(str(st_path))),
        "vrl_load_drop": lambda: len(repo.load("HEAD"))}, runs * 6))
    r.update(interleaved({"safetensors_load_touch": lambda: touch_all(load_file(str(st_path))),
                          "vrl_load_touch": lambda: touch_all(repo.load("HEAD"))}, runs))
    r["vrl_fresh_open_load"] = median_time(lambda: Repo(work / "repo").load("HEAD"), runs * 3)
    print(f"  {name}: done", file=sys.stderr)
    return r


def _write_layout(layout: str, target: Path, state: dict[str, torch.Tensor]) -> None:
    """One whole-file checkpoint, or a folder with one file per tensor."""
    if layout == "file":
        save_file(state, str(target))
        return
    target.mkdir(exist_ok=True)
    for k, v in state.items():
        save_file({k: v}, str(target / f"{k}.safetensors"))


def bench_dvc(dvc: str, state: dict[str, torch.Tensor], work: Path, runs: int
              ) -> dict[str, float]:
    """`dvc add` of a whole-file checkpoint and of a per-layer folder: first and after one
    tensor changed (DVC hashes and caches the whole file / the changed file)."""
    out: dict[str, float] = {}
    for layout in ("file", "folder"):
        firsts, seconds = [], []
        for _ in range(runs):
            proj = work / f"dvc-{layout}"
            shutil.rmtree(proj, ignore_errors=True)
            proj.mkdir()
            subprocess.run(["git", "init", "-q"], cwd=proj, check=True)
            subprocess.run([dvc, "init", "-q"], cwd=proj, check=True)
            target = "m.safetensors" if layout == "file" else "layers"
            state_copy = {k: v.clone() for k, v in state.items()}

            _write_layout(layout, proj / target, state_copy)
            start = time.perf_counter()
            subprocess.run([dvc, "add", "-q", target], cwd=proj, check=True)
            firsts.append(time.perf_counter() - start)
            next(iter(state_copy.values())).add_(0.001)
            _write_layout(layout, proj / target, state_copy)
            start = time.perf_counter()
            subprocess.run([dvc, "add", "-q", target], cwd=proj, check=True)
            seconds.append(time.perf_counter() - start)
        out[f"dvc_add_{layout}_first"] = statistics.median(firsts)
        out[f"dvc_add_{layout}_incremental"] = statistics.median(seconds)
    return out


def bench_log(work: Path, runs: int, commits: int = 1000) -> dict[str, float]:
    path = work / "log-repo"
    shutil.rmtree(path, ignore_errors=True)
    Repo.init(path)
    repo = Repo(path, fsync=False)
    state = small_policy()
    key = "actor.4.bias"
    for i in range(commits):
        state[key] = state[key] + 0.01
        repo.commit(state, message=f"iter {i}", step=i, metrics={"return": float(i)},
                    env=False)
    vrl = shutil.which("vrl") or str(Path(sys.executable).parent / "vrl")
    out = {}
    for label, args in (("vrl_log_oneline_1000", ["log", "--oneline"]),
                        ("vrl_log_full_1000", ["log"]),
                        ("vrl_log_metrics_1000", ["log", "--metrics", "return"])):
        out[label] = median_time(lambda a=args: subprocess.run(
            [vrl, "-C", str(path), *a], check=True, stdout=subprocess.DEVNULL), runs)
    out["python_startup"] = median_time(lambda: subprocess.run(
        [sys.executable, "-c", "pass"], check=True), runs)
    return out


def table(results: dict) -> str:
    rows = []
    names = [n for n in ("big", "small") if n in results]
    for name in names:
        r = results[name]
        label = "400 MB, 100 tensors" if name == "big" else f"policy {r['bytes'] / 1e6:.1f} MB"
        big = name == "big"
        rows += [
            (label, "first commit (fsync) / save_file + fsync", r["vrl_first_commit"],
             r["safetensors_save_fsync"], "<= 0.8" if big else "<= 1.5"),
            (label, "first commit (fsync) / save_file (no fsync)", r["vrl_first_commit"],
             r["safetensors_save"], "-"),
            (label, "first commit (no fsync) / save_file (no fsync)",
             r["vrl_first_commit_nofsync"], r["safetensors_save"], "-"),
            (label, "incremental commit, 1 tensor changed, bare `repo.commit` (exact, "
             "reads every byte) / torch.save + fsync", r["vrl_incremental_commit"],
             r["torch_save_fsync"], "<= 0.25" if big else "<= 0.5"),
            *([(label, "incremental commit, mean of 64 in a row (pack merges every 32 "
                "commits and Python's garbage collection included) / torch.save + fsync",
                r["vrl_incremental_commit_mean"],
                r["torch_save_fsync"], "-")] if "vrl_incremental_commit_mean" in r else []),
            (label, "incremental commit, 1 tensor changed, through the Snapshotter "
             "(step + flush) / torch.save + fsync", r["vrl_snapshotter_commit"],
             r["torch_save_fsync"], "<= 0.1" if big else "-"),
            (label, "restore (memory-mapped) / safetensors load_file", r["vrl_load"],
             r["safetensors_load"], "<= 1.0"),
            (label, "restore + read every byte / same for load_file", r["vrl_load_touch"],
             r["safetensors_load_touch"], "-"),
        ]
        if "vrl_load_drop" in r:
            rows.insert(-1, (label, "restore, then drop the state (unmapped) / same for "
                             "load_file", r["vrl_load_drop"], r["safetensors_load_drop"], "-"))
        for key in ("dvc_add_file_first", "dvc_add_folder_first"):
            if key in r:
                rows.append((label, f"first commit / `dvc add` ({key.split('_')[2]})",
                             r["vrl_first_commit"], r[key], "-"))
        for key in ("dvc_add_file_incremental", "dvc_add_folder_incremental"):
            if key in r:
                rows.append((label, f"incremental commit / `dvc add` ({key.split('_')[2]})",
                             r["vrl_incremental_commit"], r[key], "-"))
    lines = ["| model | measurement | vrl | baseline | ratio | goal |",
             "|---|---|---|---|---|---|"]
    for label, what, ours, base, goal in rows:
        lines.append(f"| {label} | {what} | {ours * 1e3:.1f} ms | {base * 1e3:.1f} ms | "
                     f"{ours / base:.2f}x | {goal} |")
    for name in names:
        r = results[name]
        if "vrl_first_commit_fsyncs" in r:
            lines.append(f"| {'400 MB' if name == 'big' else 'policy'} | fsync calls and "
                         "process CPU time (all threads) per commit: first / incremental | "
                         f"{r['vrl_first_commit_fsyncs']} / "
                         f"{r['vrl_incremental_commit_fsyncs']} fsyncs, "
                         f"{r['vrl_first_commit_cpu'] * 1e3:.1f} / "
                         f"{r['vrl_incremental_commit_cpu'] * 1e3:.1f} ms CPU | - | - | - |")
        lines.append(f"| {'400 MB' if name == 'big' else 'policy'} | store growth per "
                     f"incremental commit | {r['store_growth_per_incremental']:,.0f} B | "
                     f"changed tensor {r['changed_tensor_bytes']:,} B | "
                     f"+{r['store_growth_per_incremental'] - r['changed_tensor_bytes']:,.0f} B"
                     " | = changed + metadata |")
    lg = results.get("log", {})
    for key in ("vrl_log_oneline_1000", "vrl_log_full_1000", "vrl_log_metrics_1000"):
        if key not in lg:
            continue
        lines.append(f"| 1,000 commits | `{key[4:-5].replace('_', ' --')}` wall time "
                     f"(python startup {lg['python_startup'] * 1e3:.0f} ms) | "
                     f"{lg[key] * 1e3:.0f} ms | - | - | < 300 ms |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dvc", default=shutil.which("dvc"),
                        help="path to the dvc executable (default: on PATH)")
    parser.add_argument("--out", default="bench/out/store_bench.json")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--models", default="small,big",
                        help="comma-separated subset of small,big (e.g. --models small)")
    parser.add_argument("--no-log", action="store_true", help="skip the 1,000-commit log bench")
    args = parser.parse_args()
    models = set(args.models.split(","))
    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(args.work or tempfile.mkdtemp(prefix="vrl-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"runs": args.runs, "torch": torch.__version__, "cpus": os.cpu_count()}
    try:
        for name, make in (("small", small_policy), ("big", big_model)):
            if name not in models:
                continue
            state = make()
            # a small policy's commits take milliseconds: medians of 8x as many (a shared
            # machine's noise otherwise decides them)
            results[name] = bench_model(name, state, work,
                                        args.runs * (8 if name == "small" else 1))
            if args.dvc:
                results[name].update(bench_dvc(args.dvc, state, work, max(1, args.runs // 2)))
            del state
        if not args.no_log:
            results["log"] = bench_log(work, args.runs)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    md = table(results)
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
