"""Remote benchmark: push / pull a 50-commit history to a local S3 server (moto).

Two histories: a small policy (~1 MB) and a big model (default 400 MB in 40 tensors) where
a few tensors change per commit. For each we measure, in the same run:
  - bytes vrl sends vs the bytes of the distinct objects (the changed tensors + metadata);
  - vrl push time vs a plain parallel s3fs upload of exactly the same files;
  - a no-op push (in-process and as a `vrl push` CLI call);
  - an incremental push, a clone (full and metadata-only) and a pull;
  - `dvc push` of a whole-file checkpoint per commit, only when `dvc` is installed.
Writes bench/out/remote_bench.json.

`--backends-only`: the small history's push, no-op push and clone on every backend, each
served on 127.0.0.1 (a local path; moto S3; asyncssh SFTP; fake-gcs-server; Azurite), a
fresh remote per run; writes bench/out/remote_backends.json.

    nice -n 10 python bench/remote_bench.py [--size-mb 400] [--commits 50] [--changed 2]
                                            [--repeat 5] [--skip-big] [--backends-only]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ["AWS_EC2_METADATA_DISABLED"] = "true"  # never ask a cloud metadata endpoint


def build_history(path: Path, n_tensors: int, tensor_bytes: int, commits: int,
                  changed: int) -> Any:
    import torch

    from vrl import Repo

    repo = Repo.init(path)
    repo = Repo(path, fsync=False)  # building the input is not what we measure
    numel = max(1, tensor_bytes // 4)
    gen = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(numel, generator=gen) for i in range(n_tensors)}
    for c in range(commits):
        if c:
            for j in range(changed):
                name = f"layers.{(c * changed + j) % n_tensors}.weight"
                state[name] = state[name] + 0.001
        repo.commit(state, message=f"iter {c}", step=c, env=False,
                    metrics={"return": float(c)})
    return repo


REQUESTS = [0]  # HTTP requests sent to S3 by this process (vrl and the baseline alike)


def count_requests() -> None:
    """Count every request aiobotocore (under s3fs) sends: the bench's request figures."""
    from aiobotocore.endpoint import AioEndpoint

    send = AioEndpoint._send

    async def counted(self: Any, request: Any) -> Any:
        REQUESTS[0] += 1
        return await send(self, request)

    AioEndpoint._send = counted


def counted(func: Any) -> tuple[Any, float, int]:
    """(result, seconds, S3 requests) of one call."""
    before = REQUESTS[0]
    start = time.perf_counter()
    out = func()
    return out, time.perf_counter() - start, REQUESTS[0] - before


def object_bytes(repo: Any, oids: set[str]) -> int:
    return sum(64 + repo.objects.kind_and_size(o)[1] for o in oids)  # header + payload


def plain_s3fs_upload(endpoint: str, bucket: str, files: list[Path], jobs: int) -> float:
    """The yardstick: s3fs's own parallel `put` of the same files."""
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir(bucket)
    start = time.perf_counter()
    fs.put([str(f) for f in files], [f"{bucket}/objects/{f.parent.name}/{f.name}"
                                     for f in files], batch_size=jobs)
    return time.perf_counter() - start


def median_time(func: Any, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_case(name: str, tmp: Path, endpoint: str, n_tensors: int, tensor_bytes: int,
             commits: int, changed: int, jobs: int, repeat: int = 1) -> dict[str, Any]:
    import boto3

    from vrl.remote import add_remote, clone, open_named, pull, push

    s3 = boto3.client("s3", endpoint_url=endpoint)
    bucket = f"vrl-{name}"
    s3.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/repo"
    opts = {"endpoint_url": endpoint}

    t0 = time.perf_counter()
    repo = build_history(tmp / f"{name}-src", n_tensors, tensor_bytes, commits, changed)
    build_s = time.perf_counter() - t0
    add_remote(repo, "origin", url, opts, create=True)
    reachable = repo.reachable(include_reflog=False)
    distinct = object_bytes(repo, reachable)
    tensor_ids = {o for o in reachable if repo.objects.kind_and_size(o)[0] == "tensor"}
    model_bytes = n_tensors * tensor_bytes
    whole_file_bytes = commits * model_bytes  # a whole checkpoint per commit

    # the same bytes as plain files (packed objects have no file of their own)
    files = []
    for o in sorted(reachable):
        files.append(tmp / f"{name}-plain-files" / o[:2] / o[2:])
        files[-1].parent.mkdir(parents=True, exist_ok=True)
        files[-1].write_bytes(repo.objects.read_raw(o))
    # vrl push and the plain upload, alternated, each into a fresh bucket: medians
    push_runs, plain_runs = [], []
    for r in range(repeat):
        if r:
            s3.create_bucket(Bucket=f"{bucket}-{r}")
            add_remote(repo, f"run{r}", f"s3://{bucket}-{r}/repo", opts, create=True)
        remote = "origin" if r == 0 else f"run{r}"
        store = open_named(repo, remote)
        result, seconds, requests = counted(
            lambda s=store, n=remote: push(repo, s, n, jobs=jobs))
        push_runs.append((seconds, requests))
        if r == 0:
            first = result
        plain_runs.append(counted(lambda b=f"{bucket}-plain{r}": plain_s3fs_upload(
            endpoint, b, files, jobs))[1:])
    push_s = statistics.median(t for t, _ in push_runs)
    plain_s = statistics.median(t for t, _ in plain_runs)

    noop_s = median_time(lambda: push(repo, open_named(repo, "origin"), "origin", jobs=jobs))
    _, _, noop_requests = counted(lambda: push(repo, open_named(repo, "origin"), "origin",
                                               jobs=jobs))
    cli_env = {**os.environ}
    noop_cli = median_time(lambda: subprocess.run(
        [sys.executable, "-c", "import sys; from vrl.cli import main; sys.exit(main())",
         "push", "-q"], cwd=repo.workdir, env=cli_env,
        check=True, capture_output=True), runs=3)

    cloned, clone_s, clone_requests = counted(lambda: clone(
        url, tmp / f"{name}-clone", options=opts, jobs=jobs, checkout=False))
    lazy, lazy_s, lazy_requests = counted(lambda: clone(
        url, tmp / f"{name}-lazy", options=opts, jobs=jobs, metadata_only=True))
    # one snapshot of the metadata-only clone, its tensors fetched on demand
    _, lazy_load_s, lazy_load_requests = counted(lambda: lazy.load(lazy.head()))

    # one more commit upstream: push it, pull it
    build_history_step(repo, n_tensors, changed, commits)
    head_m = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    parent_m = repo.read_manifest(repo.read_commit(repo.resolve("HEAD^")).manifest)
    new_tensors = {e.id for e in head_m.tensors.values()} - \
        {e.id for e in parent_m.tensors.values()}
    inc, inc_s, inc_requests = counted(lambda: push(repo, open_named(repo, "origin"), "origin",
                                                    jobs=jobs))
    (pulled, fetched), pull_s, pull_requests = counted(lambda: pull(
        cloned, open_named(cloned, "origin"), "origin", jobs=jobs))

    return {
        "commits": commits, "tensors": n_tensors, "tensor_bytes": tensor_bytes,
        "model_bytes": model_bytes, "changed_per_commit": changed, "build_s": build_s,
        "distinct_object_bytes": distinct, "distinct_tensors": len(tensor_ids),
        "whole_checkpoint_per_commit_bytes": whole_file_bytes,
        "push": {"seconds": push_s, "bytes_sent": first.bytes, "objects": first.objects,
                 "bytes_sent_equals_distinct": first.bytes == distinct,
                 "MB_per_s": first.bytes / push_s / 1e6,
                 "requests": push_runs[0][1], "runs_s": [t for t, _ in push_runs]},
        "plain_s3fs_put": {"seconds": plain_s, "bytes": distinct,
                           "requests": plain_runs[0][1], "runs_s": [t for t, _ in plain_runs]},
        "push_vs_plain_s3fs": push_s / plain_s,
        "noop_push_s": noop_s, "noop_push_requests": noop_requests, "noop_push_cli_s": noop_cli,
        "clone_s": clone_s, "clone_requests": clone_requests,
        "clone_metadata_only_s": lazy_s, "clone_metadata_only_requests": lazy_requests,
        "lazy_load_head_s": lazy_load_s, "lazy_load_head_requests": lazy_load_requests,
        "incremental_push": {"seconds": inc_s, "objects": inc.objects, "bytes": inc.bytes,
                             "requests": inc_requests,
                             "changed_tensors": len(new_tensors),
                             "changed_tensor_bytes": object_bytes(repo, new_tensors)},
        "pull": {"seconds": pull_s, "status": pulled.status, "objects": fetched.objects,
                 "bytes": fetched.bytes, "requests": pull_requests},
        "dvc": dvc_compare(tmp / f"{name}-dvc", n_tensors, tensor_bytes, commits, changed)
        if shutil.which("dvc") else "dvc not installed: skipped",
    }


BACKENDS = ("local", "s3", "sftp", "gs", "az")


def run_backends(tmp: Path, commits: int, small_bytes: int, jobs: int, repeat: int,
                 backends: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """The small history pushed to and cloned from each backend: medians of `repeat` runs,
    each into a fresh remote (bucket, container or directory)."""
    from vrl.remote import add_remote, clone, open_named, push
    from vrl.testing import servers
    from vrl.testing.remote_conformance import azure_case, gcs_case, s3_case, ssh_case

    repo = build_history(tmp / "backends-src", 8, small_bytes, commits, 1)
    out: dict[str, Any] = {}
    for backend in backends:
        if backend == "s3":
            server: Any = servers.s3_server(threaded=True)  # parallel uploads
            new_case = lambda s=server: s3_case(s)  # noqa: E731
        elif backend == "sftp":
            setup = servers.sftp_server(tmp / "sshd")
            server = setup.server
            new_case = lambda s=setup: ssh_case(s)  # noqa: E731
        elif backend == "gs":
            server = servers.gcs_server()
            new_case = lambda s=server: gcs_case(s)  # noqa: E731
        elif backend == "az":
            server = servers.azurite_server()
            os.environ["AZURE_STORAGE_ACCOUNT_KEY"] = servers.AZURITE_KEY
            new_case = lambda s=server: azure_case(s)  # noqa: E731
        else:
            server = None
            new_case = lambda: RemoteCaseLocal(tmp)  # noqa: E731
        try:
            pushes, noops, clones = [], [], []
            for r in range(repeat):
                case = new_case()
                name = f"{backend}{r}"
                add_remote(repo, name, case.url, case.options, create=True)
                start = time.perf_counter()
                push(repo, open_named(repo, name), name, jobs=jobs)
                pushes.append(time.perf_counter() - start)
                noops.append(median_time(lambda n=name: push(repo, open_named(repo, n), n,
                                                             jobs=jobs), runs=3))
                start = time.perf_counter()
                clone(case.url, tmp / f"clone-{name}", options=case.options, jobs=jobs,
                      checkout=False)
                clones.append(time.perf_counter() - start)
            out[backend] = {"push_s": statistics.median(pushes),
                            "noop_push_s": statistics.median(noops),
                            "clone_s": statistics.median(clones),
                            "runs": {"push_s": pushes, "noop_push_s": noops,
                                     "clone_s": clones}}
            print(backend, json.dumps(out[backend]), flush=True)
        finally:
            if server is not None:
                server.kill()
    return out


class RemoteCaseLocal:
    """A fresh local-path remote (what the other backends' cases give, for a directory)."""

    def __init__(self, tmp: Path) -> None:
        import uuid

        self.url = str(tmp / f"local-{uuid.uuid4().hex[:8]}.vrl")
        self.options: dict[str, str] = {}


def build_history_step(repo: Any, n_tensors: int, changed: int, c: int) -> None:
    import torch

    from vrl.tensors import flatten

    state = flatten(repo.load("HEAD"))[0]
    state = {k: v.clone() for k, v in state.items() if isinstance(v, torch.Tensor)}
    for j in range(changed):
        name = f"layers.{(c * changed + j) % n_tensors}.weight"
        state[name] = state[name] + 0.001
    repo.commit(state, message=f"iter {c}", step=c, env=False)


def dvc_compare(path: Path, n_tensors: int, tensor_bytes: int, commits: int,
                changed: int) -> dict[str, Any]:
    """`dvc add` + `dvc push` of a whole safetensors checkpoint per commit (local remote)."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    remote = path.parent / (path.name + "-remote")
    run = lambda *a: subprocess.run(a, cwd=path, check=True, capture_output=True)  # noqa: E731
    run("git", "init", "-q")
    run("dvc", "init", "-q")
    run("dvc", "remote", "add", "-d", "r", str(remote))
    gen = torch.Generator().manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(max(1, tensor_bytes // 4), generator=gen)
             for i in range(n_tensors)}
    total = 0.0
    for c in range(commits):
        if c:
            for j in range(changed):
                name = f"layers.{(c * changed + j) % n_tensors}.weight"
                state[name] = state[name] + 0.001
        save_file(state, str(path / "policy.safetensors"))
        start = time.perf_counter()
        run("dvc", "add", "-q", "policy.safetensors")
        run("dvc", "push", "-q")
        total += time.perf_counter() - start
    sent = sum(f.stat().st_size for f in remote.rglob("*") if f.is_file())
    return {"push_s_total": total, "bytes_on_remote": sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=400.0,
                        help="big model size (use less on a slow machine; recorded)")
    parser.add_argument("--tensors", type=int, default=40)
    parser.add_argument("--commits", type=int, default=50)
    parser.add_argument("--changed", type=int, default=2, help="tensors changed per commit")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--skip-big", action="store_true")
    parser.add_argument("--repeat", type=int, default=5,
                        help="pushes (and plain uploads) per case, alternated: medians")
    parser.add_argument("--small-tensor-kb", type=int, default=128)
    parser.add_argument("--backends-only", action="store_true",
                        help="the small history on every backend (remote_backends.json)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "out" /
                                             "remote_bench.json"))
    args = parser.parse_args()
    if args.backends_only:
        backends_main(args)
        return

    from vrl.testing.servers import s3_server

    count_requests()
    server = s3_server(threaded=True)  # parallel uploads need a threaded server
    endpoint = f"http://127.0.0.1:{server.port}"
    tmp = Path(tempfile.mkdtemp(prefix="vrl-remote-bench-"))
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform()},
        "server": "moto (threaded) on 127.0.0.1", "jobs": args.jobs,
    }
    try:
        # small policy: ~1 MB in 8 tensors, 1 changes per commit
        results["small"] = run_case("small", tmp, endpoint, 8, args.small_tensor_kb * 1024,
                                    args.commits, 1, args.jobs, args.repeat)
        print(json.dumps({"small": results["small"]}, indent=1), flush=True)
        if not args.skip_big:
            tensor_bytes = int(args.size_mb * 1e6 / args.tensors)
            results["big"] = run_case("big", tmp, endpoint, args.tensors, tensor_bytes,
                                      args.commits, args.changed, args.jobs, args.repeat)
            print(json.dumps({"big": results["big"]}, indent=1), flush=True)
    finally:
        server.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


def backends_main(args: argparse.Namespace) -> None:
    os.environ["NO_GCE_CHECK"] = "true"  # anon credentials everywhere: nothing to look up
    tmp = Path(tempfile.mkdtemp(prefix="vrl-remote-backends-"))
    load = os.getloadavg()
    try:
        rows = run_backends(tmp, args.commits, args.small_tensor_kb * 1024, args.jobs,
                            args.repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "load_before": load,
                    "load_after": os.getloadavg()},
        "commits": args.commits, "tensors": 8, "tensor_bytes": args.small_tensor_kb * 1024,
        "jobs": args.jobs, "repeat": args.repeat,
        "servers": {"local": "a directory", "s3": "moto (threaded)", "sftp": "asyncssh",
                    "gs": "fake-gcs-server (in memory)", "az": "Azurite (in memory)"},
        "backends": rows,
    }
    out = Path(args.out).with_name("remote_backends.json") \
        if args.out.endswith("remote_bench.json") else Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
