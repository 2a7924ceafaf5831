"""The JSON API of `vrl ui`, its HTTP server (read-only, loopback Host only, nothing but
the packaged assets) and `vrl report`, on small hand-made repositories (no browser)."""

import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from helpers import vrl

from vrl import Repo
from vrl.ui.api import Api, ApiError
from vrl.ui.report import render
from vrl.ui.server import UiServer, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script></script><!-- & \u2028"


def state(scale: float) -> dict:
    rng = np.random.default_rng(0)
    return {"actor.0.weight": (rng.standard_normal((8, 4)) * scale).astype(np.float32),
            "actor.0.bias": np.zeros(8, np.float32),
            "critic.0.weight": rng.standard_normal((1, 8)).astype(np.float32)}


@pytest.fixture
def hist(tmp_path):
    """main: 3 commits; exp (from main~1): 2 commits with another lr, a hostile message."""
    repo = Repo.init(tmp_path / "r")
    for i in range(3):
        s = state(1.0 + 0.1 * i)
        repo.commit(s, message=f"main {i}", step=10 * (i + 1),
                    hparams={"lr": 0.1, "net": {"width": 8}}, metrics={"return": float(i)},
                    meta={"frozen_layers": ["critic.0"]} if i == 2 else None)
    repo.branch("exp", "main~1")
    for i in range(2):
        s = state(2.0 + i)
        repo.commit(s, message=EVIL if i else "exp 0", step=20 + 10 * (i + 1), ref="refs/heads/exp",
                    hparams={"lr": 0.5, "net": {"width": 8}},
                    metrics={"return": 5.0 + i, "loss": float("nan")})
    repo.tag("best", "exp")
    return repo


def test_summary_lists_runs_tags_and_metrics(hist):
    s = Api(hist).get("summary", {})
    assert list(s["branches"]) == ["exp", "main"]
    assert s["branches"]["main"] == hist.resolve("main")
    assert s["tags"] == {"best": hist.resolve("exp")}
    assert s["metrics"] == ["loss", "return"] and s["default_metric"] == "return"
    assert s["return_metrics"] == ["return"]
    assert s["current_branch"] == "main" and s["repo"] == "r"


def test_defaults_are_the_return_and_its_smoothed_form_as_in_the_cli():
    from vrl.ui.api import default_metrics

    names = ["charts/episodic_return", "charts/return", "charts/return_last100", "loss"]
    assert default_metrics(names) == {
        "default_metric": "charts/episodic_return",
        "return_metrics": ["charts/episodic_return", "charts/return_last100"]}
    assert default_metrics(["charts/return", "loss"])["default_metric"] == "charts/return"
    assert default_metrics(["loss", "x"]) == {"default_metric": "loss", "return_metrics": []}
    assert default_metrics([]) == {"default_metric": None, "return_metrics": []}


def test_graph_has_every_commit_with_labels_and_lanes(hist):
    g = Api(hist).get("graph", {})
    assert len(g["commits"]) == 5 and g["lanes"] == 2
    by_id = {c["id"]: c for c in g["commits"]}
    assert by_id[hist.resolve("main")]["refs"] == [{"name": "main", "kind": "head"}]
    assert by_id[hist.resolve("exp")]["refs"] == [{"name": "exp", "kind": "branch"},
                                                  {"name": "best", "kind": "tag"}]
    fork = by_id[hist.resolve("main~1")]
    assert fork["message"] == "main 1"
    assert {c["lane"] for c in g["commits"]} == {0, 1}


def test_curves_follow_each_run_and_skip_non_finite(hist):
    api = Api(hist)
    main = api.get("curves", {"metric": ["return"], "rev": ["main"]})
    assert [(p[0], p[2]) for p in main["points"]] == [(10, 0.0), (20, 1.0), (30, 2.0)]
    exp = api.get("curves", {"metric": ["return"], "rev": ["exp"]})
    assert [(p[0], p[2]) for p in exp["points"]] == [(10, 0.0), (20, 1.0), (30, 5.0), (40, 6.0)]
    assert all(isinstance(p[1], float) for p in exp["points"])  # wall time, seconds
    # a metric a run lacks, or only has as NaN, is an empty curve, not an error
    assert api.get("curves", {"metric": ["loss"], "rev": ["main"]})["points"] == []
    assert api.get("curves", {"metric": ["loss"], "rev": ["exp"]})["points"] == []


def test_commit_page_marks_changes_against_the_parent(hist):
    c = Api(hist).get("commit", {"rev": ["exp~1"]})
    hp = {h["key"]: h for h in c["hparams"]}
    assert hp["lr"] == {"key": "lr", "value": 0.5, "old": 0.1, "status": "changed"}
    assert hp["net.width"]["status"] == "same"
    assert c["message"] == "exp 0" and c["step"] == 30
    assert {layer["layer"] for layer in c["layers"]} == {"actor.0", "critic.0"}
    assert all(layer["status"] for layer in c["layers"])
    assert c["env"] and all(set(e) == {"key", "value"} for e in c["env"])
    frozen = Api(hist).get("commit", {"rev": ["main"]})
    assert frozen["frozen"] == ["critic.0"]
    assert [layer["frozen"] for layer in frozen["layers"]] == [False, True]
    assert Api(hist).get("commit", {"rev": ["exp"]})["message"] == EVIL  # data, not markup


def test_diff_gives_layers_and_the_hparams_that_differ(hist):
    d = Api(hist).get("diff", {"a": ["main"], "b": ["exp"]})
    assert d["a"] == hist.resolve("main") and d["b"] == hist.resolve("exp")
    assert [h["key"] for h in d["hparams"]] == ["lr"]
    assert {layer["layer"] for layer in d["layers"]} == {"actor.0", "critic.0"}
    assert d["error"] is None and "layers" in d["summary"]


def test_heatmap_is_layers_by_commits_with_frozen_cells(hist):
    h = Api(hist).get("heatmap", {"rev": ["main"]})
    assert h["layers"] == ["actor.0", "critic.0"]
    assert len(h["commits"]) == 3 and all(len(row) == 3 for row in h["values"])
    assert h["values"][0][0] is None  # the root has no parent to compare with
    assert h["values"][0][1] > 0 and h["values"][1][1] == 0
    assert h["frozen"] == [[], [2]]


def test_compare_rows_show_differing_hparams_and_last_best(hist):
    c = Api(hist).get("compare", {})
    assert c["params"] == ["lr"]
    rows = {r["name"]: r for r in c["rows"]}
    assert rows["exp"]["hparams"] == {"lr": 0.5}
    assert rows["exp"]["metrics"]["return"] == [6.0, 6.0]
    assert rows["main"]["metrics"]["return"] == [2.0, 2.0]
    assert rows["exp"]["branch_point"] == "main@20"


@pytest.mark.parametrize("model", [False, True])
def test_warm_reads_the_heatmap_data_before_anyone_asks(tmp_path, monkeypatch, model):
    from vrl import views

    repo = Repo.init(tmp_path / "w")
    for i in range(4):
        s = state(1.0 + i)
        if model:  # a training snapshot: the heatmap shows the model's layers only
            s = {"model": s, "optimizer": {"m": np.full(3, float(i), np.float32)}}
        repo.commit(s, message=f"c{i}")
    expected = Api(Repo(repo.workdir)).get("heatmap", {"rev": ["main"]})
    assert all(name.startswith("model/") == model for name in expected["layers"])
    api = Api(repo)
    api.warm().join(30)
    assert api._busy == 0
    parsed = []
    real = views.History.stats
    monkeypatch.setattr(views.History, "stats",
                        lambda self, oid: parsed.append(oid) or real(self, oid))
    assert api.get("heatmap", {"rev": ["main"]}) == expected
    assert len(parsed) <= 1  # the head's layer names only: every line was read by warm()


def test_bad_requests_are_errors_not_crashes(hist):
    api = Api(hist)
    with pytest.raises(ApiError, match="no such API route"):
        api.get("../../etc/passwd", {})
    with pytest.raises(ApiError, match="missing parameter 'rev'"):
        api.get("commit", {})
    with pytest.raises(Exception, match="nope"):
        api.get("commit", {"rev": ["nope"]})


def test_version_moves_with_refs_and_drops_cached_answers(hist):
    api = Api(hist)
    v1 = api.version()
    before = api.get("curves", {"metric": ["return"], "rev": ["main"]})
    assert api.version() == v1
    hist.commit(state(9.0), message="new", step=40, metrics={"return": 9.0})
    assert api.version() != v1
    after = api.get("curves", {"metric": ["return"], "rev": ["main"]})
    assert len(after["points"]) == len(before["points"]) + 1


def test_api_answers_are_strict_json(hist):
    api = Api(hist)
    for route, params in [("summary", {}), ("graph", {}), ("compare", {}),
                          ("commit", {"rev": ["exp"]}), ("heatmap", {"rev": ["exp"]}),
                          ("diff", {"a": ["main"], "b": ["exp"]})]:
        json.dumps(api.get(route, params), allow_nan=False)  # NaN metrics never leak


# ---------------------------------------------------------------------------- HTTP server


@pytest.fixture
def server(hist):
    srv = UiServer(Api(hist), "127.0.0.1", 0)
    serve_in_thread(srv)
    yield srv
    srv.shutdown()
    srv.server_close()


def fetch(url, method="GET", host=None):
    req = urllib.request.Request(url, method=method)
    if host:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_server_serves_page_assets_and_api(server):
    status, headers, body = fetch(server.url)
    assert status == 200 and b'src="/static/app.js"' in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    for path in ("static/app.js", "static/app.css", "static/uPlot.iife.min.js",
                 "static/uPlot.LICENSE"):
        assert fetch(server.url + path)[0] == 200, path
    status, headers, body = fetch(server.url + "api/summary")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["branches"].keys() == {"exp", "main"}


def test_server_is_read_only_and_serves_nothing_else(server, tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    for path in ("static/../../secret.txt", "static/%2e%2e/api.py", "vrl/ui/api.py",
                 ".vrl/config", "static/server.py", "etc/passwd", "static/"):
        status, _, body = fetch(server.url + path)
        assert status == 404 and b"secret" not in body, path
    status, _, body = fetch(server.url + "api/commit?rev=../../../../etc/passwd")
    assert status == 404 and "error" in json.loads(body)
    for method in ("POST", "PUT", "DELETE"):
        assert fetch(server.url + "api/summary", method=method)[0] == 405


def test_server_refuses_foreign_host_headers(server):
    port = server.server_address[1]
    assert fetch(server.url, host=f"evil.example:{port}")[0] == 403
    assert fetch(server.url + "api/summary", host="evil.example")[0] == 403
    assert fetch(server.url, host=f"localhost:{port}")[0] == 200


# ---------------------------------------------------------------------------- report


def test_report_is_one_self_contained_file(hist):
    html = render(hist, [])
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched
    assert "/static/" not in html
    data = re.search(r'<script id="vrl-data" type="application/json">(.*?)</script>',
                     html, re.S).group(1)
    assert "<" not in data and "\u2028" not in data  # cannot end the script element
    api = json.loads(data)["api"]
    assert set(api["summary"]["branches"]) == {"exp", "main"}
    assert "curves?metric=return&rev=main" in api and "heatmap?rev=exp" in api
    assert f"commit?rev={hist.resolve('exp')}" in api
    assert api[f"commit?rev={hist.resolve('exp')}"]["message"] == EVIL
    assert "diff?a=exp&b=main" in api
    assert "MIT" in html  # uPlot's licence travels with it


def test_report_keeps_shared_curve_points_once(hist):
    from vrl.ui.report import bundle

    api = bundle(hist, [])
    exp = api["curves?metric=return&rev=exp"]
    main = api["curves?metric=return&rev=main"]
    # exp (first in the report) is whole; main repeats its first two points
    assert "prefix" not in exp and len(exp["points"]) == 4
    assert main["prefix"] == {"key": "curves?metric=return&rev=exp", "n": 2}
    whole = exp["points"][:2] + main["points"]  # what the page rebuilds
    assert whole == Api(hist).get("curves", {"metric": ["return"], "rev": ["main"]})["points"]


def test_report_of_chosen_revs_only(hist):
    api = json.loads(re.search(r'type="application/json">(.*?)</script>',
                               render(hist, ["main"]), re.S).group(1))["api"]
    assert list(api["summary"]["branches"]) == ["main"]
    assert len(api["graph"]["commits"]) == 3
    assert api["summary"]["metrics"] == ["return"]


def test_report_of_a_long_history_keeps_the_key_commit_pages(hist, monkeypatch):
    import vrl.ui.report as report

    monkeypatch.setattr(report, "MAX_COMMIT_PAGES", 4)
    api = report.bundle(hist, [])
    pages = {k.split("=")[1] for k in api if k.startswith("commit?")}
    # labelled (main, exp), the branch point (main~1), the first after it on each side
    assert pages == {hist.resolve(r) for r in ("main", "exp", "main~1", "exp~1")}
    assert len(api["graph"]["commits"]) == 5  # the graph still shows every commit


def test_report_cli_writes_the_file(hist, capsys, monkeypatch):
    monkeypatch.chdir(hist.workdir)
    code, _, err = vrl(capsys, "report", "main", "exp", "-o", "out.html")
    assert code == 0 and "wrote out.html" in err
    assert (hist.workdir / "out.html").read_text().startswith("<!doctype html>")
    assert not list(hist.workdir.glob(".out.html*"))
    code, _, err = vrl(capsys, "report", "nope", "-o", "x.html")
    assert code == 1 and err.startswith("error:") and "nope" in err
    assert not (hist.workdir / "x.html").exists()


def test_ui_cli_port_in_use_is_one_line(hist, capsys, monkeypatch, server):
    monkeypatch.chdir(hist.workdir)
    code, _, err = vrl(capsys, "ui", "--port", str(server.server_address[1]))
    assert code == 1 and err.startswith("error: cannot listen on 127.0.0.1:")
    assert len(err.strip().splitlines()) == 1


def test_views_of_a_repository_never_import_torch(hist):
    """Every API route and `vrl report`, in a process where importing torch fails."""
    script = f"""
import sys
sys.modules["torch"] = None  # any import of torch raises ImportError
from vrl.ui.api import Api, open_repo
from vrl.ui.report import render
repo = open_repo({str(hist.workdir)!r})
api = Api(repo)
for route, params in [("summary", {{}}), ("graph", {{}}), ("compare", {{}}),
                      ("curves", {{"metric": ["return"], "rev": ["exp"]}}),
                      ("commit", {{"rev": ["exp"]}}), ("heatmap", {{"rev": ["main"]}}),
                      ("diff", {{"a": ["main~1"], "b": ["main"]}}), ("scalars", {{}})]:
    api.get(route, params)
render(repo, [])
from vrl.cli import main
assert main(["-C", {str(hist.workdir)!r}, "report", "-o", "r.html"]) == 0
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_an_empty_repository_answers_empty_views(tmp_path):
    repo = Repo.init(tmp_path / "e")
    api = Api(repo)
    assert api.get("summary", {})["branches"] == {}
    assert api.get("graph", {})["commits"] == []
    assert api.get("compare", {})["rows"] == []
    assert '"branches":{}' in render(repo, [])


# ---------------------------------------------------------------------------- dashboard


def test_scalars_give_every_metric_of_the_chosen_runs_by_column(hist):
    api = Api(hist)
    data = api.get("scalars", {})
    assert data["metrics"] == ["loss", "return"]
    assert data["groups"] == [{"group": "", "metrics": ["loss", "return"]}]
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == ["exp", "main"]
    exp = runs["exp"]
    assert exp["id"] == hist.resolve("exp") and exp["steps"] == [10, 20, 30, 40]
    assert exp["values"]["return"] == [0.0, 1.0, 5.0, 6.0]
    assert exp["values"]["loss"] == [None, None, None, None]  # NaN: a gap, strict JSON
    assert len(exp["seconds"]) == 4 and all(isinstance(t, float) for t in exp["seconds"])
    assert "loss" not in runs["main"]["values"]  # a run without a metric: no column
    # the same points as the one-metric route
    curve = api.get("curves", {"metric": ["return"], "rev": ["exp"]})["points"]
    pairs = zip(exp["steps"], exp["values"]["return"], strict=True)
    assert [[p[0], p[2]] for p in curve] == [[x, v] for x, v in pairs]
    only = api.get("scalars", {"rev": ["main"]})
    assert [r["name"] for r in only["runs"]] == ["main"] and only["metrics"] == ["return"]
    json.dumps(data, allow_nan=False)


def test_metric_groups_follow_the_trainers_prefixes_then_names_then_ungrouped():
    from vrl.views import metric_groups

    names = ["zeta", "losses/value_loss", "eval/return", "custom/x", "charts/sps",
             "env/deliveries", "charts/episodic_return", "a/b", "losses/entropy"]
    assert metric_groups(names) == [
        {"group": "charts", "metrics": ["charts/episodic_return", "charts/sps"]},
        {"group": "losses", "metrics": ["losses/entropy", "losses/value_loss"]},
        {"group": "env", "metrics": ["env/deliveries"]},
        {"group": "eval", "metrics": ["eval/return"]},
        {"group": "a", "metrics": ["a/b"]}, {"group": "custom", "metrics": ["custom/x"]},
        {"group": "", "metrics": ["zeta"]}]


def test_scalars_are_quick_on_many_runs(tmp_path):
    """20 runs x 100 commits x 30 metrics (metadata only): well under the page's budget."""
    import time

    repo = Repo.init(tmp_path / "many")
    names = [f"{g}/m{i}" for i, g in enumerate(["charts", "losses", "env"] * 10)]
    s = {"w": np.zeros(2, np.float32)}
    repo.commit(s, message="root", step=0, metrics={n: 0.0 for n in names})
    for r in range(20):
        repo.branch(f"r{r}", "main")
        for i in range(100):
            repo.commit(s, message="it", step=i + 1, ref=f"refs/heads/r{r}", allow_empty=True,
                        metrics={n: float(i * k + r) for k, n in enumerate(names)})
    api = Api(repo)
    api.get("graph", {})  # as `vrl ui` warms up
    start = time.perf_counter()
    data = api.get("scalars", {})
    body = json.dumps(data, allow_nan=False, separators=(",", ":"))
    elapsed = time.perf_counter() - start
    assert len(data["runs"]) == 21 and len(data["metrics"]) == 30
    assert elapsed < 1.5, elapsed  # ~0.06 s here; generous for loaded CI machines
    assert len(body) < 2_000_000


def training_state(scale: float) -> dict:
    """A training snapshot as the trainer commits one: model, optimizer state, RNG."""
    rng = np.random.default_rng(1)
    return {"model/actor.0.weight": (rng.standard_normal((4, 3)) * scale).astype(np.float32),
            "model/actor.0.bias": np.zeros(4, np.float32) + scale,
            "model/critic.0.weight": rng.standard_normal((1, 4)).astype(np.float32) * scale,
            "optimizer/state/0/exp_avg": np.full((4, 3), scale, np.float32),
            "optimizer/state/1/exp_avg": np.full(4, scale, np.float32),
            "optimizer/state/2/exp_avg": np.full((1, 4), scale, np.float32),
            "rng/torch": np.arange(4, dtype=np.uint8) + int(scale * 10)}


def test_layer_rows_are_in_the_clis_order_with_parameter_names(tmp_path):
    from vrl.cli._common import render_diff

    repo = Repo.init(tmp_path / "t")
    layout = {"state_layout": {"model_prefix": "model/", "optimizer_params": [
        "actor.0.weight", "actor.0.bias", "critic.0.weight"]}}
    repo.commit(training_state(1.0), message="a", step=1, meta=layout)
    repo.commit(training_state(2.0), message="b", step=2, meta=layout)
    rows = Api(repo).get("commit", {"rev": ["main"]})["layers"]
    assert [(r["kind"], r["label"]) for r in rows] == [
        ("model", "actor.0"), ("model", "critic.0"),
        ("optimizer", "optimizer/state/0"), ("optimizer", "optimizer/state/1"),
        ("optimizer", "optimizer/state/2"), ("other", "rng")]
    assert [r["parameter"] for r in rows if r["kind"] == "optimizer"] == [
        "actor.0.weight", "actor.0.bias", "critic.0.weight"]
    # the CLI prints the same rows in the same order
    text = render_diff(repo.diff("main").with_layout(repo.read_commit(repo.resolve("main")).meta))
    lines = text.splitlines()
    at = [next(i for i, line in enumerate(lines) if line.split()[:1] == [r["label"]])
          for r in rows]
    assert at == sorted(at), text
    assert "actor.0.bias" in lines[at[3]]  # the parameter beside its optimizer state
    diff_rows = Api(repo).get("diff", {"a": ["main~1"], "b": ["main"]})["layers"]
    assert [r["label"] for r in diff_rows] == [r["label"] for r in rows]


GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00"
       b"\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def test_eval_gif_is_found_by_commit_id_only(hist, server, tmp_path):
    exp = hist.resolve("exp")
    assert Api(hist).get("commit", {"rev": ["exp"]})["gif"] is False
    assert fetch(server.url + "api/gif?rev=exp")[0] == 404
    (hist.workdir / "eval").mkdir()
    (hist.workdir / "eval" / f"{exp[:12]}.gif").write_bytes(GIF)
    status, headers, body = fetch(server.url + "api/gif?rev=exp")
    assert status == 200 and headers["Content-Type"] == "image/gif" and body == GIF
    assert Api(hist).get("commit", {"rev": ["exp"]})["gif"] is True
    assert Api(hist).get("commit", {"rev": ["main"]})["gif"] is False
    # (a full id works too; on .vrl/eval as well)
    main = hist.resolve("main")
    (hist.vrl_dir / "eval").mkdir()
    (hist.vrl_dir / "eval" / f"{main}.gif").write_bytes(GIF)
    assert fetch(server.url + "api/gif?rev=main")[0] == 200
    # only files named by a resolved commit id, only GIFs, nothing through a link
    (tmp_path / "secret.gif").write_bytes(GIF + b"secret")
    for rev in ("../secret", "../../secret.gif", "eval/x", "%2e%2e%2fsecret", ""):
        status, _, body = fetch(server.url + "api/gif?rev=" + rev)
        assert status == 404 and b"secret" not in body, rev
    first = hist.resolve("main~1")
    (hist.workdir / "eval" / f"{first[:12]}.gif").symlink_to(tmp_path / "secret.gif")
    assert fetch(server.url + "api/gif?rev=main~1")[0] == 404
    (hist.workdir / "eval" / f"{first}.gif").write_bytes(b"<svg onload=alert(1)>")
    assert fetch(server.url + "api/gif?rev=main~1")[0] == 404


def test_first_paint_holds_the_runs_escaped(hist, server):
    status, _, body = fetch(server.url)
    page = body.decode()
    assert status == 200 and "loading..." not in page
    assert 'id="first-paint"' in page
    for name in ("exp", "main"):
        assert f">{name}</a>" in page
    assert "<title>vrl \u00b7 r</title>" in page


def test_first_paint_escapes_hostile_names_and_messages(tmp_path):
    repo = Repo.init(tmp_path / "h")
    evil_msg = '<img src=x onerror="alert(1)">'
    repo.commit(state(1.0), message=evil_msg, step=1, metrics={"return": 1.0},
                hparams={"note": "<script>alert(2)</script>"})
    evil_branch = "<script>alert(3)</script>"  # ref names allow it
    repo.branch(evil_branch, "main")
    repo.commit(state(2.0), message=evil_msg, step=2, metrics={"return": 2.0},
                hparams={"note": "<b>x</b>"}, ref=f"refs/heads/{evil_branch}")
    srv = UiServer(Api(repo), "127.0.0.1", 0)
    serve_in_thread(srv)
    try:
        page = fetch(srv.url)[2].decode()
    finally:
        srv.shutdown()
        srv.server_close()
    main = page[page.index('<main id="main">'):page.index("</main>")]
    assert "<script" not in main and "<img" not in main and "<b>" not in main
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in main
    from html import escape

    assert escape(evil_branch) in main
    report = render(repo, [])
    body = report[report.index('<main id="main">'):report.index("</main>")]
    assert "<script" not in body and escape(evil_branch) in body
