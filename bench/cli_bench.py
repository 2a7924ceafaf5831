"""CLI benchmark on a real-size file: `vrl commit`, `vrl checkout` of an older snapshot and
`vrl export`, wall clock through the command line (a fresh interpreter each time, as a user
runs it), against `dvc add` / `dvc checkout` of the same file when dvc is installed.

    python bench/cli_bench.py [--runs 5] [--code DIR] [--dvc PATH] [--out bench/out/cli_bench.json]

The file: ~90 MB, ~100 tensors, shaped like a small sentence-embedding model (float32
embeddings and attention/MLP weights, float16 layer norms, int64 position ids). The second
version changes 12 of the tensors (~12%). `--code DIR` runs the vrl found in DIR
(e.g. an older checkout) instead of this one. Every figure is the median of --runs runs
with a warm page cache and byte code cached (for vrl as for dvc).
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
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[1]


def model(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    hidden, ffn = 384, 1536

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, np.float32)

    out: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": w(30522, hidden),
        "embeddings.position_embeddings.weight": w(512, hidden),
        "embeddings.token_type_embeddings.weight": w(2, hidden),
        "embeddings.position_ids": np.arange(512, dtype=np.int64)[None],
        "embeddings.LayerNorm.weight": np.ones(hidden, np.float16),
        "embeddings.LayerNorm.bias": np.zeros(hidden, np.float16),
        "pooler.dense.weight": w(hidden, hidden), "pooler.dense.bias": w(hidden),
    }
    for i in range(6):
        p = f"encoder.layer.{i}"
        for name in ("self.query", "self.key", "self.value", "output.dense"):
            out[f"{p}.attention.{name}.weight"] = w(hidden, hidden)
            out[f"{p}.attention.{name}.bias"] = w(hidden)
        out[f"{p}.intermediate.dense.weight"] = w(ffn, hidden)
        out[f"{p}.intermediate.dense.bias"] = w(ffn)
        out[f"{p}.output.dense.weight"] = w(hidden, ffn)
        out[f"{p}.output.dense.bias"] = w(hidden)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[f"{p}.{ln}.weight"] = np.ones(hidden, np.float16)
            out[f"{p}.{ln}.bias"] = np.zeros(hidden, np.float16)
    if version > 1:  # a fine-tuning step that moved two matrices per layer
        for i in range(6):
            for key in (f"encoder.layer.{i}.attention.output.dense.weight",
                        f"encoder.layer.{i}.intermediate.dense.weight"):
                out[key] = out[key] * np.float32(1.01)
    return out


def vrl_cmd(code: Path) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(code)!r}); "
            "from vrl.cli import main; sys.exit(main(sys.argv[1:]))"]


PYCACHE: list[str] = []  # set by main: where both tools' byte code is cached


def run(cmd: list[str], cwd: Path) -> float:
    # Byte code is cached (in a scratch folder, not the source tree) as a pip install
    # would have it: with PYTHONDONTWRITEBYTECODE set, vrl run from a source checkout was
    # compiled again by every command while dvc, installed, read its cached byte code.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # dvc's usage analytics off: its detached reporter process costs dvc's commands time
    # (the baseline is the faster dvc) and wrote into the byte-code folder while the
    # benchmark removed it
    env.update({"VRL_AUTHOR": "bench", "PYTHONPATH": "", "DVC_NO_ANALYTICS": "1"})
    if PYCACHE:
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env=env)
    return time.perf_counter() - start


def median(times: list[float]) -> float:
    return round(statistics.median(times), 4)


def bench_vrl(tmp: Path, code: Path, v1: Path, v2: Path, runs: int) -> dict[str, float]:
    vrl = vrl_cmd(code)
    commits, bare_commits, checkouts, exports = [], [], [], []
    for r in range(runs):
        ws = tmp / f"vrl-{r}"
        ws.mkdir()
        run([*vrl, "init"], ws)
        shutil.copy(v1, ws / "policy.safetensors")
        bare_commits.append(run([*vrl, "commit", "policy.safetensors", "-m", "v1",
                                 "--no-env"], ws))
        shutil.rmtree(ws / ".vrl")
        run([*vrl, "init"], ws)
        commits.append(run([*vrl, "commit", "policy.safetensors", "-m", "v1"], ws))
        shutil.copy(v2, ws / "policy.safetensors")
        run([*vrl, "commit", "policy.safetensors", "-m", "v2"], ws)
        checkouts.append(run([*vrl, "checkout", "HEAD~1"], ws))
        exports.append(run([*vrl, "export", "main", "out.safetensors"], ws))
        shutil.rmtree(ws)
    return {"commit_s": median(commits), "commit_no_env_s": median(bare_commits),
            "checkout_older_s": median(checkouts),
            "export_s": median(exports)}


def bench_dvc(tmp: Path, dvc: str, v1: Path, v2: Path, runs: int) -> dict[str, float]:
    adds, checkouts = [], []
    for r in range(runs):
        ws = tmp / f"dvc-{r}"
        ws.mkdir()
        subprocess.run(["git", "init", "-q"], cwd=ws, check=True)
        run([dvc, "init", "-q"], ws)
        shutil.copy(v1, ws / "policy.safetensors")
        adds.append(run([dvc, "add", "-q", "policy.safetensors"], ws))
        shutil.copy(ws / "policy.safetensors.dvc", tmp / "v1.dvc")
        shutil.copy(v2, ws / "policy.safetensors")
        run([dvc, "add", "-q", "policy.safetensors"], ws)
        shutil.copy(tmp / "v1.dvc", ws / "policy.safetensors.dvc")  # the older version
        checkouts.append(run([dvc, "checkout", "-q", "policy.safetensors"], ws))
        shutil.rmtree(ws)
    return {"add_s": median(adds), "checkout_older_s": median(checkouts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--code", type=Path, default=ROOT, help="directory holding vrl/")
    parser.add_argument("--dvc", default=shutil.which("dvc"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "cli_bench.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        PYCACHE.append(str(tmp / "pycache"))
        v1, v2 = tmp / "v1.safetensors", tmp / "v2.safetensors"
        save_file(model(1), str(v1))
        save_file(model(2), str(v2))
        bench_vrl(tmp, args.code, v1, v2, 1)  # untimed: compiles, as installing would
        result: dict[str, object] = {
            "file_mb": round(v1.stat().st_size / 1e6, 1), "tensors": len(model(1)),
            "runs": args.runs, "code": str(args.code),
            "vrl": bench_vrl(tmp, args.code, v1, v2, args.runs)}
        if args.dvc:
            result["dvc"] = bench_dvc(tmp, args.dvc, v1, v2, args.runs)
            result["ratios"] = {
                "commit_vs_dvc_add": round(result["vrl"]["commit_s"] /
                                           result["dvc"]["add_s"], 3),
                "checkout_vs_dvc_checkout": round(result["vrl"]["checkout_older_s"] /
                                                  result["dvc"]["checkout_older_s"], 3)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table(result) + "\n")
    print(json.dumps(result, indent=2))


def table(result: dict) -> str:
    """The CLI table of docs/benchmarks.md: vrl's CLI wall times, with `dvc` on the same
    file when measured."""
    ours, dvc = result["vrl"], result.get("dvc", {})
    rows = [("`vrl commit FILE` (environment captured)", ours["commit_s"], dvc.get("add_s"),
             "`dvc add FILE`", "<= 0.33"),
            ("`vrl commit FILE --no-env`", ours["commit_no_env_s"], dvc.get("add_s"),
             "`dvc add FILE`", "-"),
            ("`vrl checkout` of the older snapshot", ours["checkout_older_s"],
             dvc.get("checkout_older_s"), "`dvc checkout` of the older version", "<= 0.33"),
            ("`vrl export REV FILE.safetensors`", ours["export_s"], None, "-", "<= 0.5 s")]
    lines = [f"| {result['file_mb']} MB, {result['tensors']} tensors | vrl | baseline | ratio "
             "| goal |", "|---|---|---|---|---|"]
    for what, t, base, base_name, goal in rows:
        ratio = f"{t / base:.2f}x" if base else "-"
        shown = f"{base_name} {base:.2f} s" if base else base_name
        lines.append(f"| {what} | {t:.2f} s | {shown} | {ratio} | {goal} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
