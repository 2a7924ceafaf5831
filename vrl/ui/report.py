"""`vrl report`: the views of `vrl ui` as one self-contained HTML file.

The page, its script, uPlot and every API answer the page can ask for (for the chosen
runs: summary, graph, compare, each metric's curve per run, each run's heatmap, the
details of the commits shown (of a long history: the labelled ones, branch points and the
newest of each run), and the diff of each run against the first) are inlined,
so the file opens offline, from an e-mail or an issue, with no server.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from vrl import views
from vrl.history import History
from vrl.repo import Repo
from vrl.ui.api import Api
from vrl.ui.server import asset

MAX_COMMIT_PAGES = 300


def _key(route: str, **params: Any) -> str:
    """The key the page's `api()` builds: route?name=value&... in the page's order."""
    from urllib.parse import quote

    parts = [f"{quote(k, safe='')}={quote(str(v), safe='')}" for k, v in params.items()]
    return route + ("?" + "&".join(parts) if parts else "")


def bundle(repo: Repo, revs: Sequence[str]) -> dict[str, Any]:
    """Every API answer the page needs for runs `revs` (all runs when empty)."""
    api = Api(repo, live=False)
    runs = views.runs(repo, list(revs) or None, metrics=[])
    names = [r["name"] for r in runs]
    summary = api.summary({})
    summary["branches"] = {r["name"]: r["id"] for r in runs}
    summary["metrics"] = views.metric_names(repo, [r["id"] for r in runs]) if runs else []
    summary["default_metric"] = next((m for m in views.RETURN_METRICS
                                      if m in summary["metrics"]),
                                     summary["metrics"][0] if summary["metrics"] else None)
    if summary["current_branch"] not in summary["branches"]:
        summary["current_branch"] = names[0] if names else None
    out: dict[str, Any] = {"summary": summary}
    graph = api.graph({})
    keep = set(History.of(repo).reachable(r["id"] for r in runs))
    graph["commits"] = [c for c in graph["commits"] if c["id"] in keep]
    out["graph"] = graph
    compare = views.compare(repo, names) if names else {"params": [], "metrics": [], "rows": []}
    out["compare"] = Api.compare_shape(compare)
    for metric in summary["metrics"]:
        stored: list[tuple[str, list]] = []
        for name in names:
            curve = api.get("curves", {"metric": [metric], "rev": [name]})
            key = _key("curves", metric=metric, rev=name)
            out[key] = _share_prefix(curve, stored)
            stored.append((key, curve["points"]))
    for name in names:
        out[_key("heatmap", rev=name)] = api.get("heatmap", {"rev": [name]})
    for oid in _commit_pages(repo, graph["commits"], [r["id"] for r in runs]):
        out[_key("commit", rev=oid)] = api.get("commit", {"rev": [oid]})
    for name in names[1:]:
        out[_key("diff", a=names[0], b=name)] = api.get("diff", {"a": [names[0]], "b": [name]})
    return out


def _share_prefix(curve: dict[str, Any], stored: list[tuple[str, list]]) -> dict[str, Any]:
    """A run branched from another repeats that run's points up to the branch point: keep
    them once. The longest common prefix with a curve stored before becomes
    `{"prefix": {"key": its key, "n": length}}` plus the remaining points (the page puts
    them back together)."""
    points = curve["points"]
    best_key, best_n = None, 0
    for key, other in stored:
        lo, hi = 0, min(len(points), len(other))
        while lo < hi:  # the longest k with points[:k] == other[:k] (prefixes nest)
            mid = (lo + hi + 1) // 2
            if points[:mid] == other[:mid]:
                lo = mid
            else:
                hi = mid - 1
        if lo > best_n:
            best_key, best_n = key, lo
    if best_key is None:
        return curve
    return {**curve, "points": points[best_n:], "prefix": {"key": best_key, "n": best_n}}


def _commit_pages(repo: Repo, commits: list[dict[str, Any]], heads: list[str]) -> list[str]:
    """The commits whose pages a report holds: all of a small history; of a large one the
    labelled commits (heads, tags), branch points and the first snapshot after each, then
    the newest of each run, up to MAX_COMMIT_PAGES (a page is ~1-30 kB)."""
    if len(commits) <= MAX_COMMIT_PAGES:
        return [c["id"] for c in commits]
    children: dict[str, int] = {}
    for c in commits:
        for p in c["parents"]:
            children[p] = children.get(p, 0) + 1
    forks = {oid for oid, n in children.items() if n > 1}
    chosen = dict.fromkeys(c["id"] for c in commits if c["refs"] or c["id"] in forks or
                           any(p in forks for p in c["parents"][:1]))
    history = History.of(repo)
    lines = [list(reversed(history.line(h))) for h in heads]
    depth = 0
    while len(chosen) < MAX_COMMIT_PAGES and any(depth < len(line) for line in lines):
        for line in lines:
            if depth < len(line) and len(chosen) < MAX_COMMIT_PAGES:
                chosen.setdefault(line[depth])
        depth += 1
    return list(chosen)[:MAX_COMMIT_PAGES]


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no `</script>`, no `<!--`, no line separators
    that old parsers end a script on."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _inline_js(code: str) -> str:
    return re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE)


def render(repo: Repo, revs: Sequence[str]) -> str:
    """The report as one HTML document."""
    data = {"created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "api": bundle(repo, revs)}
    page = asset("index.html").decode()
    css = asset("vendor/uPlot.min.css").decode() + "\n" + asset("app.css").decode()
    css = css.replace("</", "<\\/")
    licence = asset("vendor/uPlot.LICENSE").decode()
    page = page.replace('<link rel="stylesheet" href="/static/uPlot.min.css">\n'
                        '<link rel="stylesheet" href="/static/app.css">',
                        f"<style>\n{css}\n</style>")
    scripts = ('<script src="/static/uPlot.iife.min.js"></script>\n'
               '<script src="/static/app.js"></script>')
    inline = (f'<script id="vrl-data" type="application/json">{_script_json(data)}</script>\n'
              f"<!-- uPlot (MIT licence):\n{licence.replace('--', '- -')}\n-->\n"
              f"<script>{_inline_js(asset('vendor/uPlot.iife.min.js').decode())}</script>\n"
              f"<script>{_inline_js(asset('app.js').decode())}</script>")
    if scripts not in page:
        raise AssertionError("index.html changed: update vrl.ui.report")
    return page.replace(scripts, inline)
