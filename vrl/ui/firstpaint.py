"""The first paint of `vrl ui` (and of a report): the runs table as HTML in the page the
server returns, so that a browser (or `chromium --headless --screenshot`) shows the
repository before any script has run; the script then draws the view asked for over it.

Everything from the repository (branch names, ids, values) is escaped here: ref names
and messages are untrusted.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from vrl.ui.api import Api

PLACEHOLDER = '<main id="main"><p class="muted">loading...</p></main>'


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _td(markup: str, numeric: bool = False) -> str:
    return f'<td class="num">{markup}</td>' if numeric else f"<td>{markup}</td>"


def _cell(value: Any) -> str:
    """A value as an escaped table cell (numbers right-aligned, as the page does)."""
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    return _td(escape(_num(value) if numeric or value is None else
                      value if isinstance(value, str) else json.dumps(value)), numeric)


def runs_html(summary: dict[str, Any], data: dict[str, Any]) -> str:
    """The summary and runs table (run, step, snapshots, branched from, the hyperparameters
    that differ, the return's last and best value) of the API's `summary` and `compare`
    answers as HTML, every value escaped."""
    rows = data["rows"]
    if not rows:
        return '<h1>vrl</h1><p class="muted">No runs yet.</p>'
    metrics = [m for m in summary.get("return_metrics") or [summary.get("default_metric")]
               if m in data["metrics"]][:2]
    head = ["run", "step", "snapshots", "branched from", *data["params"]]
    for m in metrics:
        head += [m, f"{m} (best)"]
    out = [f'<h1>Runs of {escape(summary["repo"])}</h1>',
           f'<p class="muted">{len(rows)} run{"s" if len(rows) != 1 else ""}, '
           f'{len(summary["metrics"])} metrics</p>',
           '<div class="scroll"><table class="grid" id="first-paint"><thead><tr>',
           "".join(f"<th>{escape(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for r in rows:
        cells = [_td(f'<a href="#/commit/{escape(r["id"])}">{escape(r["name"])}</a>'),
                 _cell(r["step"]), _cell(r["snapshots"]), _cell(r["branch_point"])]
        cells += [_cell(r["hparams"].get(k)) for k in data["params"]]
        for m in metrics:
            last, best = r["metrics"].get(m) or [None, None]
            cells += [_cell(last), _cell(best)]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def page(index: str, api: Api | None = None, summary: dict[str, Any] | None = None,
         compare: dict[str, Any] | None = None) -> str:
    """`index` (the packaged index.html) with the runs table in place of "loading...":
    of `api`'s answers, or of `summary` and `compare` (a report's). Left as it is when the
    repository cannot be read: the script then says why."""
    try:
        if api is not None:
            summary, compare = api.get("summary", {}), api.get("compare", {})
        if summary is None or compare is None:
            return index
        body = runs_html(summary, compare)
        title = escape(f"vrl \u00b7 {summary['repo']}")
    except Exception:  # any failure: the script shows the error, the page still loads
        return index
    return (index.replace(PLACEHOLDER, f'<main id="main">{body}</main>', 1)
            .replace("<title>vrl</title>", f"<title>{title}</title>", 1))
