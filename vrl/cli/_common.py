"""Helpers shared by the command modules: opening the repo, printing tables and JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

import click

from vrl.repo import Repo

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def pass_repo(func: Callable) -> Callable:
    """Open the repository around the current directory and pass it first."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        repo = Repo(".")
        if repo.config.get("core", "promisor") or repo.config.sections('remote "'):
            # the remote layer installs its fetchers (lazy and pruned-snapshot downloads)
            # into every open repository; the core never imports it itself
            import vrl.remote  # noqa: F401
        return func(repo, *args, **kwargs)

    return wrapper


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


def short(oid: str | None) -> str:
    return oid[:12] if oid else "-" * 12


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (stable output for tests and pipes)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    return "\n".join(lines)


def color(text: str, fg: str) -> str:
    return click.style(text, fg=fg) if sys.stdout.isatty() else text


def fmt_num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def parse_assignments(items: Sequence[str], what: str) -> dict[str, Any]:
    """`key=value` pairs; values parsed as YAML scalars (numbers, booleans, strings)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=what)
        try:
            out[key] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            out[key] = value
    return out


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes)


def render_diff(diff: Any, only_changed: bool = False) -> str:
    """The layer table and its summary line."""
    rows = []
    for layer in diff.layers:
        if only_changed and layer.status == "unchanged":
            continue
        rows.append([layer.layer, shapes_text(layer.shapes), layer.status,
                     "-" if layer.rel is None else f"{layer.rel:.3e}",
                     f"{layer.max_abs:.3e}" if layer.status == "changed" and layer.rel is not None
                     else "-",
                     "yes" if layer.material else "no"])
    text = table(["layer", "shape", "status", "rel change", "max abs", "material"], rows)
    return f"{text}\n{diff.summary()}"
