"""`vrl compare`: the table, --metrics, --sort, --json, --csv, errors; without torch."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import vrl
from test_views import make_history

from vrl import Repo

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def hist(ws):
    repo = Repo.init(ws)
    return repo, make_history(repo)


def lines(text):
    return [line.split() for line in text.strip().splitlines()]


def test_table_shows_differing_hparams_metrics_and_branch_points(hist, capsys):
    _, ids = hist
    code, out, err = vrl(capsys, "compare")
    assert code == 0, err
    assert lines(out) == [
        ["run", "commit", "step", "snapshots", "branched", "from", "extra", "lr", "net.depth",
         "return", "return:best"],
        ["exp", ids["exp"][-1][:8], "50", "6", "(+3)", "main", "(step", "20)", "-", "0.3", "3",
         "12", "12"],
        ["exp2", ids["exp2"][-1][:8], "50", "6", "(+1)", "exp", "(step", "40)", "True", "0.3",
         "3", "3", "11"],
        ["main", ids["main"][-1][:8], "40", "5", "-", "-", "0.1", "2", "4", "4"]]
    # the table shows the return; the other metrics are a flag away, and said so
    assert "1 of 3 metrics shown" in err


def test_metrics_sort_and_missing_values(hist, capsys):
    code, out, _ = vrl(capsys, "compare", "--metrics", "eval/score,loss", "--sort",
                       "eval/score:asc")
    assert code == 0
    rows = lines(out)
    assert rows[0][-4:] == ["eval/score", "eval/score:best", "loss", "loss:best"]
    assert [r[0] for r in rows[1:]] == ["exp", "exp2", "main"]  # 5, nan (no value), none
    assert rows[1][-4:] == ["5", "7", "0.3333", "0.3333"]
    assert rows[2][-4:] == ["nan", "7", "0.3333", "0.3333"]
    assert rows[3][-4:] == ["-", "-", "0.2", "0.2"]  # main never recorded eval/score
    code, out, _ = vrl(capsys, "compare", "main", "exp", "--sort", "return")
    assert [r[0] for r in lines(out)[1:]] == ["exp", "main"]
    code, out, _ = vrl(capsys, "compare", "main", "exp", "--sort", "return:asc",
                       "--all-params")
    assert lines(out)[0][6:10] == ["lr", "net.depth", "net.width", "seed"]
    assert [r[0] for r in lines(out)[1:]] == ["main", "exp"]


def test_one_run_lists_its_hyperparameters_one_per_line(hist, capsys):
    _, ids = hist
    code, out, err = vrl(capsys, "compare", "main")
    assert code == 0, err
    assert out.splitlines() == [
        "run   commit    step  snapshots  branched from  return  return:best",
        f"main  {ids['main'][-1][:8]}  40    5          -              4       4",
        "", "hyperparameters:", "  lr         0.1", "  net.depth  2", "  net.width  64",
        "  seed       1"]


def test_default_metrics_are_the_return_and_its_smoothed_form(ws, capsys):
    repo = Repo.init(ws)
    old = {"charts/return": 1.0, "charts/episodic_return": 1.5, "losses/kl": 0.1}
    repo.commit({"w": [1.0]}, metrics=old, message="an old trainer's", env=False)
    repo.commit({"w": [2.0]}, metrics={"charts/episodic_return": 2.0, "charts/episodes": 8.0,
                                       "charts/return_last100": 1.75, "losses/kl": 0.2},
                message="a new one's", env=False)
    code, out, _ = vrl(capsys, "compare")
    assert lines(out)[0][6:] == ["charts/episodic_return", "charts/episodic_return:best",
                                 "charts/return_last100", "charts/return_last100:best"]
    # commits of old runs only: their return by its old name
    repo2 = Repo.init(ws / "old")
    repo2.commit({"w": [1.0]}, metrics={"charts/return": 1.0, "losses/kl": 0.1},
                 message="old", env=False)
    os.chdir(ws / "old")
    code, out, _ = vrl(capsys, "compare")
    assert lines(out)[0][6:] == ["charts/return", "charts/return:best"]


def test_json_and_csv(hist, capsys):
    _, ids = hist
    code, out, _ = vrl(capsys, "compare", "--json", "--all-tags")
    data = json.loads(out)
    assert code == 0 and data["params"] == ["extra", "lr", "net.depth"]
    assert [r["name"] for r in data["rows"]] == ["exp", "exp2", "main", "best"]
    assert data["rows"][0]["metrics"]["return"] == {"last": 12.0, "last_step": 50,
                                                    "best": 12.0, "best_step": 50}
    code, out, _ = vrl(capsys, "compare", "--csv", "--metrics", "return")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and [r["run"] for r in rows] == ["exp", "exp2", "main"]
    assert rows[1] == {"run": "exp2", "id": ids["exp2"][0], "step": "50",
                       "time": "2026-11-29T09:20:00.000000Z", "snapshots": "6", "own": "1",
                       "branch_point_run": "exp", "branch_point_id": ids["exp"][1],
                       "extra": "True", "lr": "0.3", "net.depth": "3", "return": "3.0",
                       "return:best": "11.0", "return:last_step": "50",
                       "return:best_step": "40"}
    assert rows[2]["extra"] == "" and rows[2]["branch_point_run"] == ""
    code, _, err = vrl(capsys, "compare", "--csv", "--json")
    assert code == 2 and "choose one" in err


@pytest.mark.parametrize("args, message", [
    (["--metrics", "retrun"], "error: no run has metric 'retrun'; metrics: eval/score, loss, "
                              "return\n"),
    (["--sort", "nope"], "error: cannot sort by 'nope': it is no metric, hyperparameter or "
                         "column (name, step, snapshots, own, time, id) of these runs\n"),
    (["nope"], None),
])
def test_bad_input_is_one_line(hist, capsys, args, message):
    code, out, err = vrl(capsys, "compare", *args)
    assert code == 1 and out == "" and err.count("\n") == 1 and err.startswith("error: ")
    if message:
        assert err == message


def test_empty_repository(ws, capsys):
    Repo.init(ws)
    code, out, _ = vrl(capsys, "compare")
    assert code == 0 and out == "No runs yet: commit a snapshot first\n"
    code, out, _ = vrl(capsys, "compare", "--json")
    assert json.loads(out) == {"params": [], "metrics": [], "rows": []}


def test_hostile_names_are_escaped(ws, capsys):
    repo = Repo.init(ws)
    import numpy as np

    repo.commit({"w": np.ones(2, np.float32)}, env=False, hparams={"\x1b[31mlr": "\x1b]0;x"},
                metrics={"r\x1b": 1.0})
    repo.branch("b")
    repo.commit({"w": np.zeros(2, np.float32)}, env=False, hparams={"\x1b[31mlr": 2},
                metrics={"r\x1b": 2.0})
    code, out, _ = vrl(capsys, "compare", "--metrics", "r\x1b")
    assert code == 0 and "\x1b" not in out and "\\x1b[31mlr" in out


def test_compare_never_imports_torch(hist, tmp_path):
    repo, _ = hist
    poison = tmp_path / "poison"
    (poison / "torch").mkdir(parents=True)
    marker = tmp_path / "torch-was-imported"
    (poison / "torch" / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nraise ImportError('torch is poisoned')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)])}
    for args in (["compare"], ["compare", "--json"], ["compare", "--csv", "--all-tags"]):
        proc = subprocess.run([sys.executable, "-c", "import sys; from vrl.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", *args], cwd=repo.workdir,
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
