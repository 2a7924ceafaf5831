"""bench/runs_bench.py as `dvc repro` runs it (dvc.yaml with params.yaml), at a smoke budget:
every ${...} resolves, the script accepts every option and writes its table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import dvc_stage_argv

ROOT = Path(__file__).resolve().parents[1]


def run_stage(stage: str, tmp_path: Path) -> tuple[str, dict]:
    argv = dvc_stage_argv(stage)
    assert argv[:2] == ["python", "bench/runs_bench.py"]
    out = tmp_path / "stage"
    argv[argv.index("--out") + 1] = str(out)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VRL_AUTHOR": "tester"}
    done = subprocess.run([sys.executable, str(ROOT / argv[1]), *argv[2:], "--quick"],
                          env=env, cwd=tmp_path, timeout=600, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out.with_suffix(".md").read_text(), json.loads(out.with_suffix(".json").read_text())


def test_merge_stage_merges_fine_tunes_and_evaluates_every_policy(tmp_path):
    table, data = run_stage("runs_merge", tmp_path)
    for label in ("base", "parent a", "parent b", "average", "task-arithmetic:1"):
        assert f"| {label} |" in table
    pair = data["pairs"][0]
    # every policy evaluated on both tasks
    assert all(set(pair[k]) == {"new", "old"} for k in pair if k != "seed")
    assert "better parent" in table


@pytest.mark.slow
def test_pbt_stage_runs_every_arm_at_equal_steps(tmp_path):
    table, data = run_stage("runs_pbt", tmp_path)
    steps = {}
    for run in data["runs"]:
        steps.setdefault(run["arm"], 0)
        steps[run["arm"]] += run["step"]
    assert set(steps) == {"grid", "grid-constant", "pbt"} and len(set(steps.values())) == 1
    assert "| pbt |" in table and "fsck" in table and ": ok" in table
