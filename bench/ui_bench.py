"""`vrl ui` in a browser on a large history: first page, curves of 10 runs, the heatmap,
server memory; and `vrl report` on the same repository.

    python bench/ui_bench.py [--runs 3] [--out bench/out/ui_bench.json]

The repository is the views benchmark's (bench/views_bench.py): 10 branches, 1,000
commits, 31 metrics and 50 model layers (plus optimizer state) per commit. The server is
`vrl ui` in its own process (it reads every commit once before it answers, as the command
does); the browser is headless Chromium driven by Selenium (Debian's `chromium` and
`chromium-driver`).

Timings are taken in the page (`performance.now()`), from the navigation (or the click
that changes the view) until the view is drawn: the first page is the commit graph of all
1,000 commits, with the summary; curves are the default selection of 10 runs of one
metric, their API answers not cached yet; the heatmap is the longest branch (991 commits
x 50 layers). Each figure is the median of --runs fresh page loads. Memory is the
server's peak resident set (VmHWM) after all of it. `vrl ui` reads the layer statistics
in the background after it starts; `heatmap_api_cold_ms` is the heatmap's API answer
without that (the server side of a heatmap opened in the first second or two).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from views_bench import build  # noqa: E402  (the views benchmark's repository)

from vrl import views  # noqa: E402


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options,
                            service=Service(shutil.which("chromedriver") or "chromedriver"))


def wait(driver, script: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return ({script});")
        if value:
            return value
        if time.monotonic() > end:
            raise TimeoutError(script)
        time.sleep(0.01)


def start_server(root: Path) -> tuple[subprocess.Popen, str, float]:
    """`vrl ui --port 0` in its own process; its URL and how long it took to answer."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from vrl.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "ui", "--port", "0"],
        cwd=root, stderr=subprocess.PIPE, text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    line = proc.stderr.readline()
    match = re.search(r"(http://\S+/)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"vrl ui did not start: {line}{proc.stderr.read()}")
    return proc, match.group(1), time.perf_counter() - start


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def switch(driver, hash_: str, ready: str) -> float:
    """Milliseconds from changing the location hash to `ready` after the view drew."""
    driver.execute_script("window.__vrl.renderedAt = 0; window.__t0 = performance.now();"
                          f"location.hash = {hash_!r};")
    wait(driver, f"window.__vrl.renderedAt && ({ready})")
    return driver.execute_script("return window.__vrl.renderedAt - window.__t0;")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="bench/out/ui_bench.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "repo"
        repo = build(root)
        longest = max(repo.branches(), key=lambda b: len(views.History.of(repo).line(
            repo.resolve(b))))
        # the heatmap's answer on a fresh server that has not read the layer statistics
        # in the background yet (what `vrl ui` does at start): the cold case
        from vrl.ui.api import Api, open_repo

        cold = Api(open_repo(root))
        cold.get("graph", {})
        start = time.perf_counter()
        cold.get("heatmap", {"rev": [longest]})
        heatmap_api_cold = time.perf_counter() - start
        commits = len(views.graph(repo)["commits"])
        branches = len(repo.branches())
        proc, url, startup = start_server(root)
        driver = browser()
        first, curves, heat = [], [], []
        try:
            for _ in range(args.runs):
                driver.get("about:blank")
                driver.get(url)
                wait(driver, f"document.querySelectorAll('#graph .row').length === {commits}")
                first.append(wait(driver, "window.__vrl.renderedAt"))
                curves.append(switch(driver, "#/curves",
                                     "document.getElementById('chart').dataset.points && "
                                     "Object.keys(JSON.parse(document.getElementById('chart')"
                                     ".dataset.points)).length === 10"))
                heat.append(switch(driver, f"#/heatmap/{longest}",
                                   "document.querySelector('#heatmap canvas')"))
                shape = driver.execute_script(
                    "const c = document.querySelector('#heatmap canvas');"
                    "return [Number(c.dataset.layers), Number(c.dataset.commits)];")
            rss = peak_rss_mb(proc.pid)
        finally:
            driver.quit()
            proc.terminate()
            proc.wait(10)
        start = time.perf_counter()
        out = Path(tmp) / "report.html"
        subprocess.run([sys.executable, "-c", "import sys; from vrl.cli import main; "
                        "sys.exit(main(sys.argv[1:]))", "report", "-o", str(out)],
                       cwd=root, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                       check=True, capture_output=True)
        report_s = time.perf_counter() - start
        report_mb = out.stat().st_size / 1e6
    results = {
        "commits": commits, "branches": branches,
        "heatmap_shape": shape,
        "server_start_s": round(startup, 2),
        "first_page_ms": round(statistics.median(first)),
        "first_page_ms_all": [round(t) for t in first],
        "curves_10_runs_ms": round(statistics.median(curves)),
        "curves_10_runs_ms_all": [round(t) for t in curves],
        "heatmap_ms": round(statistics.median(heat)),
        "heatmap_ms_all": [round(t) for t in heat],
        "heatmap_api_cold_ms": round(1000 * heatmap_api_cold),
        "server_peak_rss_mb": round(rss, 1),
        "report_s": round(report_s, 2), "report_mb": round(report_mb, 1),
    }
    print(json.dumps(results, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
