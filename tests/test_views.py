"""The plain-data views (vrl/views.py): runs and branch points, the compare table, curves,
the layer heatmap, the commit graph, commit details and diffs - on a normal repository,
on a metadata-only clone, and without torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import vrl

from vrl import Repo, views
from vrl.errors import VrlError

ROOT = Path(__file__).resolve().parents[1]


def at(minute: int) -> str:
    return f"2026-11-29T09:{minute:02d}:00.000000Z"


def state(i: int, frozen_l1: bool = False) -> dict:
    w = np.full((4, 4), 1.0 + 0.1 * i, np.float32)
    l1 = np.ones((4, 4), np.float32) * (1.0 if frozen_l1 else 1.0 + 0.01 * i)
    return {"model": {"l0.weight": w, "l1.weight": l1, "l10.weight": w * 2},
            "optimizer": {"m": w * 3}}


def make_history(repo: Repo) -> dict:
    """main: 5 snapshots (steps 0..40, return 0..4, loss 1/(i+1)); exp branches from
    main's third snapshot, with lr 0.3 and net.depth 3, and records eval/score; exp2
    branches from exp's second snapshot. main keeps training first."""
    ids: dict = {"main": [], "exp": [], "exp2": []}
    hp = {"lr": 0.1, "net": {"width": 64, "depth": 2}, "seed": 1}
    for i in range(5):
        ids["main"].append(repo.commit(
            state(i), env={"python": "3.11"}, hparams=hp, step=10 * i, time=at(i),
            metrics={"return": float(i), "loss": 1 / (i + 1)}, message=f"main {i}"))
    repo.branch("exp", ids["main"][2])
    exp_hp = {"lr": 0.3, "net": {"width": 64, "depth": 3}, "seed": 1}
    for j in range(3):
        ids["exp"].append(repo.commit(
            state(10 + j, frozen_l1=True), env=False, hparams=exp_hp, step=30 + 10 * j,
            time=at(10 + j), ref="refs/heads/exp", message=f"exp {j}",
            metrics={"return": 10.0 + j, "eval/score": [7.0, "nan", 5.0][j]},
            meta={"frozen_layers": ["l1"]}))
    repo.branch("exp2", ids["exp"][1])
    ids["exp2"].append(repo.commit(state(20), env=False, hparams={**exp_hp, "extra": True},
                                   step=50, time=at(20), ref="refs/heads/exp2",
                                   metrics={"return": 3.0}, message="exp2 0"))
    repo.tag("best", ids["exp"][2])
    return ids


@pytest.fixture
def hist(repo):
    return repo, make_history(repo)


def by_name(rows):
    return {row["name"]: row for row in rows}


def test_runs_and_branch_points(hist):
    repo, ids = hist
    rows = by_name(views.runs(repo))
    assert sorted(rows) == ["exp", "exp2", "main"]  # tags only when asked
    assert rows["main"]["branch_point"] is None
    assert rows["main"]["snapshots"] == rows["main"]["own"] == 5
    point = rows["exp"]["branch_point"]
    assert point["seconds"] == views.seconds(at(2))
    assert (point["id"], point["run"], point["step"], point["index"]) == \
        (ids["main"][2], "main", 20, 2)
    assert (rows["exp"]["snapshots"], rows["exp"]["own"]) == (6, 3)
    # a branch of a branch points at the branch it came from, not at the trunk
    point = rows["exp2"]["branch_point"]
    assert (point["id"], point["run"]) == (ids["exp"][1], "exp")
    assert (rows["exp2"]["snapshots"], rows["exp2"]["own"]) == (6, 1)
    assert rows["exp"]["hparams"] == {"lr": 0.3, "net.depth": 3, "net.width": 64, "seed": 1}
    tagged = by_name(views.runs(repo, all_tags=True))
    assert tagged["best"]["id"] == ids["exp"][2] and tagged["best"]["ref"] == "refs/tags/best"
    json.dumps(tagged, allow_nan=False)  # plain data


def test_branch_point_when_one_run_ends_inside_another(repo):
    a = [repo.commit(state(i), env=False, time=at(i), step=i) for i in range(3)]
    repo.branch("old", a[1])  # main continued from old's head: old is main's prefix
    rows = by_name(views.runs(repo))
    assert rows["old"]["branch_point"] is None
    assert rows["main"]["branch_point"]["id"] == a[1]
    assert rows["main"]["branch_point"]["run"] == "old"


def test_metric_summary_last_and_best(hist):
    repo, _ = hist
    rows = by_name(views.runs(repo))
    ret = rows["exp"]["metrics"]["return"]
    assert (ret["last"], ret["last_step"], ret["best"], ret["best_step"]) == (12.0, 50, 12.0, 50)
    # loss is lower-is-better; exp's line holds main's first three snapshots
    loss = rows["exp"]["metrics"]["loss"]
    assert (loss["last"], loss["best"], loss["best_step"]) == (1 / 3, 1 / 3, 20)
    score = rows["exp"]["metrics"]["eval/score"]
    assert (score["last"], score["best"], score["best_step"]) == (5.0, 7.0, 30)
    # a non-finite last value is shown as stored, never as a JSON NaN
    rows = by_name(views.runs(repo, revs=["exp~1"]))
    assert rows["exp~1"]["metrics"]["eval/score"]["last"] == "nan"
    assert rows["exp~1"]["metrics"]["eval/score"]["best"] == 7.0
    assert views.lower_is_better("losses/value_loss") and not views.lower_is_better("return")
    assert views.lower_is_better("perf/update_s") and not views.lower_is_better("charts/SPS")
    assert views.lower_is_better("losses/approx_kl") and views.lower_is_better("wall_time")
    assert not views.lower_is_better("losses/explained_variance")
    assert not views.lower_is_better("charts/timesteps")


def test_compare_shows_only_differing_hparams_flattened(hist):
    repo, _ = hist
    table = views.compare(repo)
    assert table["params"] == ["extra", "lr", "net.depth"]  # net.width and seed agree
    rows = by_name(table["rows"])
    assert rows["main"]["hparams"] == {"lr": 0.1, "net.depth": 2}  # "extra" missing
    assert rows["exp2"]["hparams"] == {"extra": True, "lr": 0.3, "net.depth": 3}
    assert table["metrics"] == ["eval/score", "loss", "return"]
    assert views.compare(repo, ["main", "exp"])["params"] == ["lr", "net.depth"]
    assert views.compare(repo, ["exp", "exp2~1"])["params"] == []  # same commit twice
    # one row: nothing to compare against, every hyperparameter shown
    assert views.compare(repo, ["main"])["params"] == ["lr", "net.depth", "net.width", "seed"]
    assert views.compare(repo, all_params=True)["params"] == \
        ["extra", "lr", "net.depth", "net.width", "seed"]
    json.dumps(table, allow_nan=False)


def test_compare_chosen_and_missing_metrics(hist):
    repo, _ = hist
    table = views.compare(repo, ["main", "exp"], metrics=["eval/score", "return"])
    assert table["metrics"] == ["eval/score", "return"]
    rows = by_name(table["rows"])
    assert set(rows["exp"]["metrics"]) == {"eval/score", "return"}
    assert set(rows["main"]["metrics"]) == {"return"}  # main never recorded eval/score
    with pytest.raises(VrlError, match="no run has metric 'retrun'; metrics: eval/score, "
                                       "loss, return"):
        views.compare(repo, metrics=["retrun"])


def test_compare_sort(hist):
    repo, _ = hist
    order = [row["name"] for row in views.compare(repo, sort="return")["rows"]]
    assert order == ["exp", "main", "exp2"]  # 12, 4, 3: best first
    order = [row["name"] for row in views.compare(repo, sort="return:asc")["rows"]]
    assert order == ["exp2", "main", "exp"]
    # loss is lower-is-better: smallest first (main 0.2, then exp and exp2 at 1/3)
    assert views.compare(repo, sort="loss")["rows"][0]["name"] == "main"
    # rows without the value come last, in either direction
    for sort in ("eval/score", "eval/score:asc"):
        assert views.compare(repo, sort=sort)["rows"][-1]["name"] == "main"
    assert [r["name"] for r in views.compare(repo, sort="lr:desc")["rows"]][-1] == "main"
    assert [r["name"] for r in views.compare(repo, sort="own")["rows"]] == \
        ["exp2", "exp", "main"]
    with pytest.raises(VrlError, match="cannot sort by 'nope'"):
        views.compare(repo, sort="nope")


def test_curves_follow_first_parent_lines(hist):
    repo, ids = hist
    runs = by_name(views.curves(repo, "return"))
    assert [p[0] for p in runs["exp"]["points"]] == [0, 10, 20, 30, 40, 50]
    assert [p[2] for p in runs["exp"]["points"]] == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    assert runs["exp"]["points"][0][1] == views.seconds(at(0))
    assert runs["exp"]["branch_point"]["id"] == ids["main"][2]
    # non-finite values are skipped
    runs = by_name(views.curves(repo, "eval/score", ["exp"]))
    assert [p[2] for p in runs["exp"]["points"]] == [7.0, 5.0]
    with pytest.raises(VrlError, match="no run has metric 'nope'"):
        views.curves(repo, "nope")
    assert views.metric_names(repo) == ["eval/score", "loss", "return"]
    assert views.metric_names(repo, ["main"]) == ["loss", "return"]


def test_smoothing_is_tensorboards_debiased_ema():
    values = [1.0, 3.0, 2.0]
    # by hand: ema 0.1, 0.1*0.9+0.3=0.39, 0.39*0.9+0.2=0.551; debias 1-0.9^n
    want = [0.1 / 0.1, 0.39 / 0.19, 0.551 / 0.271]
    assert views.smooth(values, 0.9) == pytest.approx(want)
    assert views.smooth(values, 0.0) == values
    assert views.smooth([5.0] * 4, 0.99) == pytest.approx([5.0] * 4)  # no pull towards 0
    with pytest.raises(VrlError, match="not in"):
        views.smooth(values, 1.0)


def test_layer_heatmap(hist):
    repo, ids = hist
    heat = views.layer_heatmap(repo, "exp")
    # the model's layers only (not optimizer state), in natural order
    assert heat["layers"] == ["model/l0", "model/l1", "model/l10"]
    assert [c["id"] for c in heat["commits"]] == ids["main"][:3] + ids["exp"]
    l0, l1 = heat["values"][0], heat["values"][1]
    assert l0[0] is None  # the root commit added every layer
    assert l0[1] == pytest.approx(0.1, rel=1e-5)  # 1.0 -> 1.1
    assert l0[3] == pytest.approx((2.0 - 1.2) / 1.2, rel=1e-5)  # main 2 -> exp 0
    assert l1[4] == 0.0 and l1[5] == 0.0  # frozen in exp: no change
    assert heat["frozen"] == [[], [3, 4, 5], []]
    assert 4 not in heat["material"][1] and 4 in heat["material"][0]
    assert heat["max"] == max(v for row in heat["values"] for v in row if v is not None)
    limited = views.layer_heatmap(repo, "exp", limit=2)
    assert [c["id"] for c in limited["commits"]] == ids["exp"][1:]
    assert limited["frozen"][1] == [0, 1]
    everything = views.layer_heatmap(repo, "exp", prefix="")
    assert everything["layers"][-1] == "optimizer"
    json.dumps(heat, allow_nan=False)


def test_graph_lanes(hist):
    repo, ids = hist
    g = views.graph(repo)
    order = [c["id"] for c in g["commits"]]
    assert len(order) == 9 and set(order) == {i for v in ids.values() for i in v}
    position = {oid: i for i, oid in enumerate(order)}
    for c in g["commits"]:  # topological: children before parents
        assert all(position[p] > c["row"] for p in c["parents"])
    rows = {c["id"]: c for c in g["commits"]}
    assert rows[ids["main"][-1]]["refs"] == ["main"]
    assert rows[ids["exp"][-1]]["refs"] == ["exp", "tag: best"]
    assert g["branch"] == "main" and g["head"] == ids["main"][-1]
    # an edge's lane stays reserved from its child's row to its parent's: no other commit
    # is drawn in it on the way
    for c in g["commits"]:
        for p, lane in zip(c["parents"], c["parent_lanes"], strict=True):
            for between in g["commits"][c["row"] + 1:position[p]]:
                assert between["lane"] != lane, (c["id"][:8], between["id"][:8])
    assert g["lanes"] == 2  # exp2 and exp share lane 0 once exp2 joined exp
    assert {rows[i]["lane"] for i in ids["main"][:3]} == {0}


def test_commit_detail_and_diff(hist):
    repo, ids = hist
    d = views.commit_detail(repo, ids["exp"][0])
    hp = {h["key"]: h for h in d["hparams"]}
    assert hp["lr"] == {"key": "lr", "value": 0.3, "old": 0.1, "status": "changed"}
    assert hp["seed"]["status"] == "same"
    assert d["parents"] == [ids["main"][2]] and d["frozen_layers"] == ["l1"]
    assert d["diff"]["layers"]["model/l0"]["status"] == "changed"
    assert [k for k, v in d["diff"]["layers"].items() if v["frozen"]] == ["model/l1"]
    assert views.commit_detail(repo, ids["main"][0])["env"] == {"python": "3.11"}
    dd = views.diff(repo, "main", "exp2")
    assert dd["error"] is None and dd["diff"]["layers"]["model/l1"]["rel"] > 0
    assert {h["key"]: h["status"] for h in dd["hparams"]}["extra"] == "added"
    json.dumps(d, allow_nan=False)
    json.dumps(dd, allow_nan=False)


def test_views_on_a_metadata_only_clone_without_torch(hist, tmp_path, capsys):
    """Push, clone --metadata-only, then every view in an interpreter that cannot import
    torch: same answers as on the original, and a diff that needs tensors says so (opened
    as the UI opens it, never downloading: a default `Repo` would fetch the tensors)."""
    repo, ids = hist

    def cli(*args):
        code, out, err = vrl(capsys, *args)
        assert code == 0, err

    cli("-C", str(repo.workdir), "remote", "add", "origin", str(tmp_path / "remote.vrl"),
        "--create")
    for branch in ("main", "exp", "exp2"):
        cli("-C", str(repo.workdir), "push", "-q", "origin", branch)
    cli("clone", "--metadata-only", "-q", str(tmp_path / "remote.vrl"), str(tmp_path / "c"))
    env = dict(os.environ)
    poison = tmp_path / "poison"
    (poison / "torch").mkdir(parents=True)
    (poison / "torch" / "__init__.py").write_text("raise ImportError('torch is poisoned')\n")
    script = f"""
import json, sys
from vrl import Repo, views
repo = Repo({str(tmp_path / "c")!r}, fetch=False)
out = {{"compare": views.compare(repo), "curves": views.curves(repo, "return"),
       "heat": views.layer_heatmap(repo, "origin/exp"), "graph": views.graph(repo),
       "detail": views.commit_detail(repo, "origin/exp"),
       "diff": views.diff(repo, "main", "origin/exp2"),
       "names": views.metric_names(repo)}}
assert "torch" not in sys.modules
print(json.dumps(out, allow_nan=False))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": os.pathsep.join([str(poison), str(ROOT)])},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    rows = by_name(got["compare"]["rows"])
    assert sorted(rows) == ["main", "origin/exp", "origin/exp2"]  # remote-tracking runs
    assert rows["origin/exp"]["branch_point"]["id"] == ids["main"][2]
    assert got["compare"]["params"] == ["extra", "lr", "net.depth"]
    want = views.layer_heatmap(repo, "exp")
    assert got["heat"]["values"] == want["values"] and got["heat"]["frozen"] == want["frozen"]
    assert got["detail"]["diff"]["layers"] == views.commit_detail(repo, "exp")["diff"]["layers"]
    assert got["diff"]["diff"] is None and "is not here" in got["diff"]["error"]
    assert got["names"] == ["eval/score", "loss", "return"]
    assert len(got["graph"]["commits"]) == 9
    assert [p[2] for p in by_name(got["curves"])["origin/exp"]["points"]] == \
        [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]


def test_commits_read_without_their_statistics_match_the_full_read(hist):
    """The fast path parses a commit without its layer statistics; a commit whose bytes
    would fool the cut (a nested `],"stats":` inside the statistics) or that is not
    canonical JSON is read whole; either way the fields are the full read's."""
    repo, ids = hist
    from vrl.objects import Commit

    tricky = Commit(manifest=repo.read_commit(ids["main"][0]).manifest,
                    parents=(ids["main"][-1],), message='],"stats":{} "x"', author="a",
                    time=at(30), hparams={"p": [1], "stats": {"q": [2]}},
                    metrics={"return": 1.0}, step=7,
                    stats={"layers": {"model/l0": {"rel": 0.5, "material": True,
                                                   "sb": [], "stats": {"z": []}}},
                           "parent": ids["main"][-1]})
    payload = tricky.to_bytes()
    assert payload.rfind(b'],"stats":') > payload.index(b'"stats":{"layers"')  # the trap
    cid = repo.objects.write("commit", payload)
    pretty = json.dumps(tricky.to_json(), indent=1).encode()
    pid = repo.objects.write("commit", pretty)
    # not sorted: a field after the statistics, which a cut there would lose
    data = tricky.to_json()
    metrics = data.pop("metrics")
    stats, step, time = data.pop("stats"), data.pop("step"), data.pop("time")
    unsorted = json.dumps({**data, "stats": stats, "metrics": metrics, "step": step,
                           "time": time}, separators=(",", ":")).encode()
    uid = repo.objects.write("commit", unsorted)
    assert views.split_stats(unsorted) is None
    for oid in (cid, pid, uid, *ids["exp"]):
        history = views.History(repo)
        light, full = history.commit(oid), repo.read_commit(oid)
        assert light == Commit(**{**full.__dict__, "stats": {}})
        want = {k: (v.get("rel"), v.get("material")) for k, v in full.stats["layers"].items()}
        assert history.layers(oid) == want
    assert views.split_stats(payload) is not None and views.split_stats(pretty) is None


def test_remote_tracking_branches_are_runs_unless_a_local_branch_shows_them(hist):
    repo, ids = hist
    repo.refs.update("refs/remotes/origin/exp", ids["exp"][0])  # behind the local exp
    repo.refs.update("refs/remotes/origin/main", ids["main"][-1])  # same as main
    repo.refs.update("refs/remotes/origin/side", ids["main"][1])
    repo.refs.update("refs/remotes/up/copy", ids["exp2"][0])  # a commit exp2 shows
    assert [r["name"] for r in views.runs(repo)] == ["exp", "exp2", "main", "origin/side"]


def test_graph_with_a_merge_keeps_edges_clear(hist):
    """A commit with two parents (hand-made: vrl's own commits have one) gets a lane per
    parent edge, and no commit sits in a lane an edge runs down."""
    repo, ids = hist
    from vrl.objects import Commit

    base = repo.read_commit(ids["exp2"][0])
    merge = Commit(manifest=base.manifest, parents=(ids["exp2"][0], ids["main"][-1]),
                   message="merge", author="a", time=at(40))
    mid = repo.objects.write("commit", merge.to_bytes())
    side = Commit(manifest=base.manifest, parents=(ids["main"][1],), message="side",
                  author="a", time=at(41))
    sid = repo.objects.write("commit", side.to_bytes())
    repo.refs.update("refs/heads/merged", mid)
    repo.refs.update("refs/heads/side", sid)
    g = views.graph(repo)
    rows = {c["id"]: c for c in g["commits"]}
    position = {c["id"]: c["row"] for c in g["commits"]}
    assert len(rows[mid]["parent_lanes"]) == 2
    assert len(set(rows[mid]["parent_lanes"])) == 2
    for c in g["commits"]:
        assert all(position[p] > c["row"] for p in c["parents"])
        for p, lane in zip(c["parents"], c["parent_lanes"], strict=True):
            for between in g["commits"][c["row"] + 1:position[p]]:
                assert between["lane"] != lane
    assert g["commits"][0]["id"] == sid and g["lanes"] >= 3


def test_refs_token_changes_when_a_ref_moves(hist):
    repo, ids = hist
    before = views.refs_token(repo)
    assert views.refs_token(repo) == before
    import numpy as np

    repo.commit({"w": np.zeros(1, np.float32)}, env=False)
    assert views.refs_token(repo) != before
