"""Helpers shared by the command modules: opening the repo, printing tables and JSON."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

import click

from vrl.errors import MetadataError
from vrl.repo import Repo

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def pass_repo(func: Callable) -> Callable:
    """Open the repository around the current directory and pass it first."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return func(Repo("."), *args, **kwargs)

    return wrapper


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


# C0 controls except tab and newline, DEL, C1 controls (0x9b is a one-byte CSI), and the
# bidirectional overrides that can make text read differently from what it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def safe(text: Any, one_line: bool = False) -> str:
    """Repository data made safe to print: escape sequences and control characters (from
    commit messages, ref names, authors, remotes...) are shown escaped (`\\x1b`), never
    sent raw to the terminal. `one_line` also escapes newlines and tabs."""
    pattern = _UNSAFE_LINE if one_line else _UNSAFE
    return pattern.sub(lambda m: repr(m[0])[1:-1] if ord(m[0]) < 0x100
                       else f"\\u{ord(m[0]):04x}", str(text))


def short(oid: str | None) -> str:
    return oid[:12] if oid else "-" * 12


def first_line(text: Any) -> str:
    text = str(text) if text is not None else ""
    return safe(text.splitlines()[0], one_line=True) if text else ""


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (stable output for tests and pipes)."""
    cells = [[safe(h, True) for h in headers]] + [[safe(c, True) for c in row] for row in rows]
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
    return safe(value, one_line=True)


def parse_assignments(items: Sequence[str], what: str) -> dict[str, Any]:
    """`key=value` pairs; values parsed as YAML 1.2 values (3e-4 is a float), else strings."""
    out: dict[str, Any] = {}
    if not items:  # (PyYAML's import costs a command ~10-30 ms)
        return out
    from vrl.yaml12 import parse_scalar

    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not key=value", param_hint=what)
        out[key] = parse_scalar(value)
    return out


def parse_metrics(items: Sequence[str], what: str = "--metric") -> dict[str, float | int]:
    """`name=number` pairs: ints, floats (3e-4, 1_000.5), and nan / inf / -inf."""
    out: dict[str, float | int] = {}
    for name, value in parse_assignments(items, what).items():
        if isinstance(value, str):
            try:  # Python's float() also reads nan, inf, -inf, Infinity
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MetadataError(f"{what} {name}: a metric must be a number (int, float, nan "
                                f"or inf), not {value!r}")
        out[name] = value
    return out


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    return ", ".join("x".join(str(d) for d in s) or "scalar" for s in shapes)


def render_diff(diff: Any, only_changed: bool = False) -> str:
    """The layer table(s) and the summary line. A training snapshot gets three tables:
    model layers, optimizer state by parameter, and other state (not counted as layers)."""
    def stats(layer: Any) -> list[str]:
        return [shapes_text(layer.shapes), layer.status,
                "-" if layer.rel is None else f"{layer.rel:.3e}",
                f"{layer.max_abs:.3e}" if layer.status == "changed" and layer.rel is not None
                else "-",
                "yes" if layer.material else "no"]

    def shown(layers: Any) -> list[Any]:
        return [lc for lc in layers if not (only_changed and lc.status == "unchanged")]

    head = ["shape", "status", "rel change", "max abs", "material"]
    layout = diff.layout
    if layout.model_prefix is None:
        text = table(["layer", *head], [[lc.layer, *stats(lc)] for lc in shown(diff.layers)])
        return f"{text}\n{diff.summary()}"
    prefix = layout.model_prefix
    blocks = [table([f"model layer ({prefix})", *head],
                    [[lc.layer[len(prefix):], *stats(lc)]
                     for lc in shown(diff.section("model"))])]
    optim = shown(diff.section("optimizer"))
    if optim:
        blocks.append(table(["optimizer state", "parameter", *head],
                            [[lc.layer, layout.parameter(lc.layer) or "?", *stats(lc)]
                             for lc in optim]))
    other = shown(diff.section("other"))
    if other:
        blocks.append(table(["other state (not a layer)", "shape", "status"],
                            [[lc.layer, *stats(lc)[:2]] for lc in other]))
    return "\n\n".join(blocks) + f"\n{diff.summary()}"
