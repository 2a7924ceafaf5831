"""`vrl ui` and `vrl report` in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver` packages; .ci/run installs them) driven by Selenium, over a repository
made by a short `vrl train` with two branches, and over a metadata-only clone of it.

Screenshots of every page are saved under the test's tmp dir (pytest prints it with -v
on failure; look at them when changing the page)."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from vrl import Repo
from vrl.ui.api import Api, open_repo
from vrl.ui.server import UiServer, serve_in_thread

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
except ImportError:
    selenium = None

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and DRIVER and selenium),
    reason="needs headless Chromium and its driver (apt-get install chromium "
           "chromium-driver; .ci/run installs them) and selenium (the dev extra)")

SMALL = ["--set", "num_envs=2", "--set", "num_steps=16", "--set", "hidden_sizes=[16]",
         "--set", "num_minibatches=2", "--set", "update_epochs=2",
         "--set", "env.num_agents=4", "--set", "env.max_steps=8", "--no-progress",
         "--device", "cpu"]
STEPS = 2 * 16 * 4  # per iteration
METRIC = "charts/episodic_return"  # the default metric: the return


def vrl_cli(cwd, *calls):
    """Run several `vrl` command lines in one fresh process (torch imported once)."""
    script = ("import sys\nfrom vrl.cli import main\n" +
              "".join(f"code = main({list(c)!r})\nassert code == 0, {list(c)!r}\n"
                      for c in calls))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VRL_AUTHOR": "tester"}
    out = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """base: 6 dirty-layer iterations; lr-high: from base~2 with another learning rate,
    and a commit message that is markup."""
    ws = tmp_path_factory.mktemp("ui") / "runs"
    ws.mkdir()
    vrl_cli(ws, ["init"],
            ["train", *SMALL, "--steps", str(6 * STEPS), "--branch", "base", "--dirty-layers",
             "--dirty-threshold", "0.01", "--dirty-window", "1"],
            ["train", *SMALL, "--steps", str(7 * STEPS), "--from", "base~2",
             "--branch", "lr-high", "--set", "learning_rate=0.003"],
            ["tag", "<b>bold</b>", "lr-high~1"])
    # an evaluation episode of lr-high's head, where the commit page finds it
    (ws / "eval").mkdir()
    gif = f"eval/{Repo(ws).resolve('lr-high')[:12]}.gif"
    vrl_cli(ws, ["eval", "lr-high", "--episodes", "1", "--no-baseline", "--gif", gif])
    return ws


def expected_points(ws, runs):
    """Points per run of the default metric, as the API of the trained repository `ws`
    gives them (a clone's `origin/NAME` is NAME there)."""
    api = Api(open_repo(ws))
    metric = api.get("summary", {})["default_metric"]
    return {run: len(api.get("curves", {"metric": [metric], "rev": [run.removeprefix(
        "origin/")]})["points"]) for run in runs}


def first_own(ws):
    """The first snapshot of lr-high (its parent is on base)."""
    return Repo(ws).resolve("lr-high~2")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path):
    folder = tmp_path / "screenshots"
    folder.mkdir()
    return folder


def serve(path):
    server = UiServer(Api(open_repo(path)), "127.0.0.1", 0)
    serve_in_thread(server)
    return server


def wait(driver, script, timeout=20.0):
    """Poll a JavaScript expression until it is truthy; return its value."""
    end = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return ({script});")
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for: {script}")
        time.sleep(0.1)


def open_view(driver, url, view):
    # a change of the hash alone does not reload the page: forget the view shown before
    driver.execute_script("const m = document.getElementById('main');"
                          "if (m) m.dataset.view = '';")
    driver.get(url)
    wait(driver, f"document.body.dataset.ready && document.getElementById('main')"
                 f".dataset.view === {view!r}")


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def check_pages(driver, url, shots, runs, first_own, expected, prefix="", clone=False):
    """Every view of the app at `url` over a repository whose runs are `runs`."""
    from selenium.webdriver.support.ui import Select

    driver.get_log("browser")  # start with an empty console
    open_view(driver, url, "graph")
    text = driver.find_element("id", "graph").text
    for name in runs:
        assert name in text
    assert "<b>bold</b>" in text  # a tag name shown as text, never as markup
    assert not driver.find_elements("css selector", "#graph b")
    rows = driver.find_elements("css selector", "#graph .row")
    assert len(rows) >= 8
    driver.save_screenshot(str(shots / f"{prefix}graph.png"))

    # click a commit: its page
    first = rows[0]
    cid = first.get_attribute("data-id")
    first.click()
    wait(driver, "document.getElementById('main').dataset.view === 'commit'")
    page = driver.find_element("id", "main").text
    assert cid in page and "Hyperparameters" in page and "Layers" in page
    # the layer table (from stored statistics), as `vrl show` prints it: model layers
    # first, named without the model prefix
    assert "model layer (model/)" in page and "actor.0" in page
    driver.save_screenshot(str(shots / f"{prefix}commit.png"))

    # the first snapshot of lr-high: its changed learning rate is highlighted
    open_view(driver, url + f"#/commit/{first_own}", "commit")
    changed = [r.text for r in driver.find_elements("css selector", "tr.changed")]
    assert any(t.startswith("learning_rate 0.003 2.5") for t in changed), changed

    # curves: one series per run, each with its points
    open_view(driver, url + "#/curves", "curves")
    wait(driver, "document.getElementById('chart').dataset.points")
    points = json.loads(driver.find_element("id", "chart").get_attribute("data-points"))
    assert set(points) == set(runs) and all(n >= 6 for n in points.values()), points
    assert points == expected  # also where a report keeps shared points once
    assert driver.execute_script("return window.__vrl.chart.series.length") == len(runs) + 1
    driver.save_screenshot(str(shots / f"{prefix}curves.png"))
    driver.find_element("css selector", "input[name=xaxis][value=time]").click()
    wait(driver, "window.__vrl.chart && window.__vrl.chart.scales.x.time === true")
    Select(driver.find_element("id", "metric")).select_by_value("losses/entropy")
    wait(driver, "(document.getElementById('chart') || {dataset: {}}).dataset.metric"
                 " === 'losses/entropy' && location.hash === '#/curves/losses%2Fentropy'")

    # the dashboard: a card per metric, each run in the return's
    open_view(driver, url + "#/scalars", "scalars")
    cards = driver.find_elements("css selector", "#scalars .card")
    assert len(cards) >= 10
    card = driver.find_element("css selector", f"#scalars .card[data-metric='{METRIC}']")
    assert int(card.get_attribute("data-series")) == len(runs)
    driver.save_screenshot(str(shots / f"{prefix}scalars.png"))

    # heatmap: layers x snapshots, frozen cells marked
    open_view(driver, url + "#/heatmap/base", "heatmap")
    canvas = driver.find_element("css selector", "#heatmap canvas")
    assert int(canvas.get_attribute("data-layers")) == 4
    assert int(canvas.get_attribute("data-commits")) == 6
    assert int(canvas.get_attribute("data-frozen")) > 0
    driver.save_screenshot(str(shots / f"{prefix}heatmap.png"))

    open_view(driver, url + "#/compare", "compare")
    table = driver.find_element("id", "compare-table").text
    assert "learning_rate" in table and all(name in table for name in runs)
    driver.save_screenshot(str(shots / f"{prefix}compare.png"))

    open_view(driver, url + f"#/diff/base/{quote(runs[1], safe='')}", "diff")
    wait(driver, "document.getElementById('diff-out').textContent.includes('Hyperparameters')")
    diff = driver.find_element("id", "diff-out").text
    assert "learning_rate" in diff
    if clone:  # layer changes between unrelated commits need tensors: said, not fetched
        assert "Layer changes need tensor data that is not here" in diff
    else:
        assert "model layer (model/)" in diff and "actor.0" in diff
    driver.save_screenshot(str(shots / f"{prefix}diff.png"))
    assert console_errors(driver) == []


def test_ui_in_a_browser(trained, browser, shots):
    server = serve(trained)
    try:
        check_pages(browser, server.url, shots, ["base", "lr-high"], first_own(trained),
                    expected_points(trained, ["base", "lr-high"]))
    finally:
        server.shutdown()
        server.server_close()


def test_ui_updates_when_a_commit_lands(trained, browser, shots, tmp_path):
    ws = tmp_path / "live"
    shutil.copytree(trained, ws)
    server = serve(ws)
    try:
        open_view(browser, server.url + "#/curves", "curves")
        wait(browser, "document.getElementById('chart').dataset.points")
        before = json.loads(browser.find_element("id", "chart").get_attribute("data-points"))
        version = browser.execute_script("return window.__vrl.version")
        # a new snapshot on the branch the page shows, as `vrl train` commits one
        repo = Repo(ws)
        head = repo.read_commit(repo.resolve("lr-high"))
        repo.commit(repo.load("lr-high"), message="iter 99", step=head.step + STEPS,
                    metrics={METRIC: 0.5}, ref="refs/heads/lr-high", allow_empty=True)
        wait(browser, f"window.__vrl.version !== {version!r}", timeout=15)
        after = wait(browser, "(() => { const c = document.getElementById('chart'); "
                              "const p = c && c.dataset.points; return p && "
                              f"JSON.parse(p)['lr-high'] === {before['lr-high'] + 1} && p; }})()")
        assert json.loads(after)["base"] == before["base"]
        browser.save_screenshot(str(shots / "live.png"))

        # `vrl train` committing a new branch while the graph is open
        open_view(browser, server.url, "graph")
        rows = len(browser.find_elements("css selector", "#graph .row"))
        # (from lr-high~1: the commit made above is no training snapshot)
        vrl_cli(ws, ["train", *SMALL, "--steps", str(10 * STEPS), "--from", "lr-high~1",
                     "--branch", "live-run"])
        total = len(Api(open_repo(ws)).get("graph", {})["commits"])
        assert total > rows
        # (the page may have redrawn between two commits: wait for the last one)
        wait(browser, "document.getElementById('graph') && "
                      "document.getElementById('graph').textContent.includes('live-run') && "
                      f"document.querySelectorAll('#graph .row').length === {total}",
             timeout=15)
        browser.save_screenshot(str(shots / "live-graph.png"))
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_report_in_a_browser(trained, browser, shots):
    out = trained / "report.html"
    vrl_cli(trained, ["report", "-o", str(out)])
    browser.get_log("browser")
    open_view(browser, out.as_uri(), "graph")
    assert "report of" in browser.find_element("id", "live").text
    check_pages(browser, out.as_uri(), shots, ["base", "lr-high"], first_own(trained),
                expected_points(trained, ["base", "lr-high"]), prefix="report-")


def test_metadata_only_clone_serves_the_same_pages(trained, browser, shots, tmp_path):
    remote = tmp_path / "remote.vrl"
    clone = tmp_path / "clone"
    vrl_cli(trained, ["remote", "add", "origin", str(remote), "--create"],
            ["push", "origin", "--all", "--tags"])
    vrl_cli(tmp_path, ["clone", str(remote), str(clone), "--metadata-only", "--no-checkout",
                       "-b", "base"])
    repo = Repo(clone)
    assert not any(repo.objects.has(e.id) for e in
                   repo.read_manifest(repo.read_commit(repo.resolve("base")).manifest)
                   .tensors.values())
    server = serve(clone)
    try:
        runs = ["base", "origin/lr-high"]
        check_pages(browser, server.url, shots, runs, first_own(trained),
                    expected_points(trained, runs), prefix="clone-", clone=True)
    finally:
        server.shutdown()
        server.server_close()


def test_an_empty_repository_shows_empty_pages(browser, tmp_path):
    Repo.init(tmp_path / "empty")
    server = serve(tmp_path / "empty")
    try:
        browser.get_log("browser")
        for view, hash_, text in [("graph", "", "No commits yet."),
                                  ("curves", "#/curves", "No metrics recorded yet."),
                                  ("compare", "#/compare", "No runs yet."),
                                  ("heatmap", "#/heatmap", "No commits yet."),
                                  ("diff", "#/diff", "Diff")]:
            open_view(browser, server.url + hash_, view)
            assert text in browser.find_element("id", "main").text, view
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- dashboard


def test_scalars_dashboard(trained, browser, shots):
    """Every metric a card, grouped by prefix; one run selector and one smoothing slider
    for all cards; hover shows step and values."""
    from selenium.webdriver.common.action_chains import ActionChains

    server = serve(trained)
    try:
        data = Api(open_repo(trained)).get("scalars", {})
        groups = [g["group"] for g in data["groups"]]
        assert groups[:2] == ["charts", "losses"] and len(data["metrics"]) >= 10
        browser.get_log("browser")
        open_view(browser, server.url + "#/scalars", "scalars")
        cards = browser.find_elements("css selector", "#scalars .card")
        assert [c.get_attribute("data-metric") for c in cards] == \
            [m for g in data["groups"] for m in g["metrics"]]
        assert [g.get_attribute("data-group") for g in
                browser.find_elements("css selector", "#scalars details.group")] == groups
        series = {c.get_attribute("data-metric"): int(c.get_attribute("data-series"))
                  for c in cards}
        assert series[METRIC] == 2 and max(series.values()) == 2
        assert browser.execute_script("return window.__vrl.cards.length") == len(cards)
        browser.save_screenshot(str(shots / "scalars.png"))

        # hover: the step and each run's value under the cursor
        over = browser.find_element("css selector", f"#scalars .card[data-metric='{METRIC}'] "
                                                    ".u-over")
        ActionChains(browser).move_to_element(over).perform()
        tip = wait(browser, "!document.getElementById('tooltip').hidden && "
                            "document.getElementById('tooltip').textContent")
        assert tip.startswith(METRIC) and "step " in tip and ("base" in tip or "lr-high" in tip)
        browser.save_screenshot(str(shots / "scalars-hover.png"))
        ActionChains(browser).move_to_element(browser.find_element("tag name", "h1")).perform()

        # one smoothing slider for every card: 0 draws the raw values
        smoothed = browser.execute_script(
            "return window.__vrl.cards.map((c) => c.chart.data.slice(1))")
        browser.execute_script("const s = document.getElementById('smooth'); s.value = 0;"
                               "s.dispatchEvent(new Event('input'));")
        wait(browser, "document.getElementById('scalars').dataset.smooth === '0'")
        raw = browser.execute_script(
            "return window.__vrl.cards.map((c) => c.chart.data.slice(1))")
        assert raw != smoothed
        i = [c.get_attribute("data-metric") for c in cards].index(METRIC)
        base = next(r for r in data["runs"] if r["name"] == "base")["values"][METRIC]
        assert [v for v in raw[i][0] if v is not None] == [v for v in base if v is not None]

        # one run selector for every card (and the curves view)
        browser.find_element("css selector", "input.run-pick[value='lr-high']").click()
        wait(browser, "document.getElementById('scalars').dataset.runs === '[\"base\"]'")
        assert {int(c.get_attribute("data-series")) for c in
                browser.find_elements("css selector", "#scalars .card")} <= {0, 1}
        assert browser.execute_script("return window.__vrl.runs") == ["base"]
        browser.find_element("css selector", "input.run-pick[value='lr-high']").click()
        wait(browser, "document.getElementById('scalars').dataset.runs === "
                      "'[\"base\",\"lr-high\"]'")

        # a run has one colour: its cards' lines, its checkbox and its line in the graph
        colours = browser.execute_script(
            "return ['base', 'lr-high'].map((r) => window.__vrl.colorOf(r))")
        assert len(set(colours)) == 2
        chart = browser.execute_script(
            "return window.__vrl.cards[0].chart.series.slice(1).map((s) => [s.label, "
            "s._stroke || s.stroke])")
        assert all(colour == colours[["base", "lr-high"].index(name)] for name, colour in chart
                   if isinstance(colour, str)), chart
        repo = Repo(trained)
        open_view(browser, server.url, "graph")
        rows = [r.get_attribute("data-id") for r in
                browser.find_elements("css selector", "#graph .row")]
        dots = [d.get_attribute("data-color") for d in
                browser.find_elements("css selector", "#graph svg circle")]
        for name, colour in zip(["base", "lr-high"], colours, strict=True):
            assert dots[rows.index(repo.resolve(name))] == colour, name
        open_view(browser, server.url + "#/scalars", "scalars")

        # groups collapse (and stay so when the page redraws)
        losses = browser.find_element("css selector", "details.group[data-group=losses]")
        losses.find_element("tag name", "summary").click()
        wait(browser, "!document.querySelector('details.group[data-group=losses]').open")
        assert not losses.find_element("css selector", ".card").is_displayed()
        assert browser.execute_script("return window.__vrl.collapsed.losses") is True

        # a filter narrows the cards
        browser.find_element("id", "scalar-filter").send_keys("entropy")
        wait(browser, "[...document.querySelectorAll('#scalars .card')].filter((c) => "
                      "!c.hidden).length === 1")
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_runs_table_sorts_and_scatters_hparams_against_a_metric(trained, browser, shots):
    from selenium.webdriver.support.ui import Select

    server = serve(trained)
    try:
        browser.get_log("browser")
        open_view(browser, server.url + "#/compare", "compare")
        names = lambda: [r.text.split()[0] for r in  # noqa: E731
                         browser.find_elements("css selector", "#compare-table tbody tr")]
        header = [h for h in browser.find_elements("css selector", "#compare-table th")
                  if h.text == "step"][0]
        header.click()  # numbers: largest first
        assert names() == ["lr-high", "base"]
        header.click()
        assert names() == ["base", "lr-high"]
        assert "sorted-asc" in header.get_attribute("class")

        dots = browser.find_elements("css selector", "#scatter circle.dot")
        assert sorted(d.get_attribute("data-run") for d in dots) == ["base", "lr-high"]
        Select(browser.find_element("id", "scatter-x")).select_by_value("learning_rate")
        Select(browser.find_element("id", "scatter-y")).select_by_value(METRIC)
        wait(browser, "document.getElementById('scatter').dataset.points === '2'")
        text = browser.find_element("id", "scatter").text
        assert "learning_rate" in text and METRIC in text
        # the higher learning rate lies to the right
        at = {d.get_attribute("data-run"): float(d.get_attribute("cx")) for d in
              browser.find_elements("css selector", "#scatter circle.dot")}
        assert at["lr-high"] > at["base"]
        browser.execute_script("document.getElementById('scatter').scrollIntoView()")
        browser.save_screenshot(str(shots / "scatter.png"))
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_commit_page_shows_the_eval_gif_and_layers_in_the_clis_order(trained, browser, shots):
    server = serve(trained)
    repo = Repo(trained)
    try:
        browser.get_log("browser")
        open_view(browser, server.url + "#/commit/lr-high", "commit")
        size = wait(browser, "(() => { const i = document.getElementById('eval-gif');"
                             "return i && i.complete && i.naturalWidth; })()")
        assert size > 50
        # model layers, then optimizer state by parameter, then other state - as the CLI
        layers = browser.find_element("css selector", ".layers")
        assert layers.get_attribute("data-kinds") == "model,optimizer,other"
        heads = [t.find_element("css selector", "th").text
                 for t in layers.find_elements("css selector", "table")]
        assert heads == ["model layer (model/)", "optimizer state", "other state"]
        tables = layers.find_elements("css selector", "table")
        model = [r.find_element("css selector", "td").text
                 for r in tables[0].find_elements("css selector", "tbody tr")]
        params = [r.find_elements("css selector", "td")[1].text
                  for r in tables[1].find_elements("css selector", "tbody tr")]
        assert model and all(not m.startswith("model/") for m in model)
        assert params and all(any(p.startswith(m + ".") for m in model) for p in params), \
            (model, params)
        browser.save_screenshot(str(shots / "commit-gif.png"))
        browser.execute_script("document.querySelector('.layers').scrollIntoView()")
        browser.save_screenshot(str(shots / "commit-layers.png"))

        open_view(browser, server.url + f"#/commit/{repo.resolve('base')}", "commit")
        assert not browser.find_elements("id", "eval-gif")  # no GIF for this one
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_first_paint_shows_the_runs_without_scripts(trained, browser, shots):
    """The page the server returns already holds the runs table: a screenshot taken
    without waiting for any script shows it, not "loading..."."""
    import urllib.request

    from PIL import Image

    server = serve(trained)
    try:
        page = urllib.request.urlopen(server.url, timeout=10).read().decode()
        assert "loading..." not in page and ">base</a>" in page and ">lr-high</a>" in page
        # as a user takes one (the scripts may or may not have run by then)...
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--window-size=1000,500", f"--screenshot={shots / 'first-paint.png'}",
                        server.url], capture_output=True, timeout=120, check=True)
        # ...and with scripts off: what the page shows before they run
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
        try:
            browser.get(server.url)
            assert "base" in browser.find_element("id", "first-paint").text
            browser.save_screenshot(str(shots / "first-paint-noscript.png"))
        finally:
            browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
            browser.get("about:blank")
    finally:
        server.shutdown()
        server.server_close()
    for name in ("first-paint.png", "first-paint-noscript.png"):
        image = Image.open(shots / name).convert("L")
        width, height = image.size
        pixels = image.load()
        # rows below the header bar holding dark text: a title, a line and a table of two
        # runs give dozens; "loading..." gives one line (about a dozen)
        text_rows = sum(any(pixels[x, y] < 128 for x in range(0, width, 2))
                        for y in range(50, height))
        assert text_rows > 40, (name, text_rows)


def test_hostile_names_and_messages_stay_text(browser, tmp_path, shots):
    """A branch named like a script and a commit message that is an image with an
    onerror handler: shown as text in every view and in the first paint, never run."""
    import numpy as np

    repo = Repo.init(tmp_path / "hostile")
    evil_msg = '<img src=x onerror="window.__pwned = 1">'
    evil_branch = "<script>window.__pwned=2</script>"
    weights = {"model/a.weight": np.ones((2, 2), np.float32)}
    repo.commit(weights, message=evil_msg, step=1, metrics={"charts/<b>x</b>": 1.0},
                hparams={"lr": 0.1, "note": "<svg onload=alert(1)>"})
    repo.branch(evil_branch, "main")
    repo.commit({"model/a.weight": np.full((2, 2), 2, np.float32)}, message=evil_msg, step=2,
                metrics={"charts/<b>x</b>": 2.0}, hparams={"lr": 0.2, "note": "<b>y</b>"},
                ref=f"refs/heads/{evil_branch}")
    server = serve(repo.workdir)
    try:
        browser.get_log("browser")
        for view, hash_ in [("graph", ""), ("scalars", "#/scalars"), ("compare", "#/compare"),
                            ("commit", f"#/commit/{repo.resolve(evil_branch)}")]:
            open_view(browser, server.url + hash_, view)
            text = browser.find_element("id", "main").text
            assert "<script>" in text or "<img" in text or "<b>x</b>" in text, view
            assert not browser.find_elements("css selector", "main img, main script, main b, "
                                                             "main svg svg"), view
            assert browser.execute_script("return window.__pwned") is None, view
        open_view(browser, server.url + "#/compare", "compare")
        assert evil_branch in browser.find_element("id", "scatter").text
        browser.execute_script("document.getElementById('scatter').scrollIntoView()")
        browser.save_screenshot(str(shots / "hostile-compare.png"))
        # the first paint, scripts off
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
        try:
            browser.get(server.url)
            assert evil_branch in browser.find_element("id", "first-paint").text
            assert not browser.find_elements("css selector", "main img, main script")
        finally:
            browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})
            browser.get("about:blank")
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_merge_shows_its_parents_and_recipe_on_its_page_and_in_the_graph(trained, browser,
                                                                            shots, tmp_path):
    ws = tmp_path / "runs"
    shutil.copytree(trained, ws)
    vrl_cli(ws, ["merge", "base", "lr-high", "--branch", "soup", "-m", "soup of two"])
    repo = Repo(ws)
    soup = repo.read_commit(repo.resolve("soup"))
    assert len(soup.parents) == 2
    server = serve(ws)
    try:
        browser.get_log("browser")
        open_view(browser, server.url + "#/commit/soup", "commit")
        recipe = browser.find_element("id", "merge-recipe").text
        base = soup.meta["merge"]["base"]
        for p, rev in zip(soup.parents, ("base", "lr-high"), strict=True):
            assert f"{p[:12]} ({rev})" in recipe
        assert f"base:     {base[:12]}" in recipe and "strategy: average" in recipe
        links = [a.get_attribute("href").rsplit("/", 1)[1]
                 for a in browser.find_elements("css selector", ".kv dd a.mono")]
        assert links[:2] == list(soup.parents)  # both parents, linked
        browser.save_screenshot(str(shots / "merge-commit.png"))
        # a commit with one parent lists no recipe
        open_view(browser, server.url + "#/commit/base", "commit")
        assert not browser.find_elements("id", "merge-recipe")
        # what a page leaves out (here the recipe and the GIF) is not shown as "null"
        assert "null" not in browser.find_element("id", "main").text.split()
        # the graph: the merge's row, and its parents' rows (base's head, lr-high's head)
        open_view(browser, server.url, "graph")
        rows = {r.get_attribute("data-id") for r in
                browser.find_elements("css selector", "#graph .row")}
        assert repo.resolve("soup") in rows and set(soup.parents) <= rows
        browser.save_screenshot(str(shots / "merge-graph.png"))
        assert console_errors(browser) == []
    finally:
        server.shutdown()
        server.server_close()
