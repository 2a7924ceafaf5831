"""Figures of the views: metric curves of several runs, and the layer-change heatmap.

matplotlib comes with the `plots` extra and is imported only here, on first use (with the
Agg canvas: no display, no pyplot state). A figure is written to a temporary file and
renamed into place, so a failed plot never leaves half a file.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vrl.views import ViewError, smooth

DPI = 100
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise ViewError("plotting needs matplotlib: pip install 'vrl[plots]' (or "
                        "pip install matplotlib)") from None
    return matplotlib


def image_format(path: str | Path, svg: bool = False) -> str:
    """"svg" or "png": from `--svg` or the file's suffix (PNG by default)."""
    suffix = Path(path).suffix.lower()
    if svg and suffix not in ("", ".svg"):
        raise ViewError(f"{path} names a {suffix[1:].upper()} file but --svg asks for SVG; "
                        "name it .svg or drop --svg")
    if suffix not in ("", ".png", ".svg"):
        raise ViewError(f"cannot write {suffix} images: name the file .png or .svg")
    return "svg" if svg or suffix == ".svg" else "png"


def _save(fig: Any, path: str | Path, fmt: str) -> None:
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ViewError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=DPI)
            # mkstemp makes the file 0600; an image is for sharing: the mode a plain
            # open() would give it (0644 under the usual umask 022)
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process's umask; read from /proc where it can be, since os.umask can only
    read it by setting it (for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _text(text: str) -> str:
    """Repository text as a literal label: `$` would start matplotlib's math mode (and an
    odd number of them fails the drawing); control characters are shown escaped."""
    text = _CONTROL.sub(lambda m: repr(m[0])[1:-1], str(text))
    return text.replace("$", r"\$")


def _figure(size: tuple[float, float]) -> Any:
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def plot_curves(runs: Sequence[dict[str, Any]], metric: str, path: str | Path, *,
                weight: float = 0.0, x: str = "step", svg: bool = False,
                size: tuple[float, float] = (10.0, 6.0)) -> str:
    """Overlay each run's curve of `metric` (the data of `views.curves`) and write it to
    `path`; return the format written. With `weight` > 0 the curve is TensorBoard's
    debiased moving average, drawn over the raw values (faint). A branch's curve starts
    at its branch point (the history before it is its parent's curve); x is the step, or
    hours since the first point with `x="time"`."""
    fmt = image_format(path, svg)
    smooth([], weight)  # checks the weight before any work
    if x not in ("step", "time"):
        raise ViewError(f"x must be step or time, not {x!r}")
    fig = _figure(size)
    ax = fig.add_subplot()
    t0 = min((p[1] for run in runs for p in run["points"] if p[1] is not None), default=0.0)
    cycle = _colors(len(runs))
    drawn = 0
    for color, run in zip(cycle, runs, strict=False):
        xs, ys, shown, start = curve_series(run, weight, x, t0)
        if not xs:
            continue
        point = run.get("branch_point")
        label = _text(run["name"] + (f" (from {point['run']})" if point else ""))
        if weight:
            ax.plot(xs[start:], ys[start:], color=color, alpha=0.25, linewidth=1)
        ax.plot(xs[start:], shown[start:], color=color, linewidth=1.8, label=label)
        if point is not None and start < len(xs):
            ax.plot([xs[start]], [shown[start]], "o", color=color, markersize=4)
        drawn += 1
    if not drawn:
        raise ViewError(f"no run has points of {metric!r} to plot")
    ax.set_xlabel("step" if x == "step" else "wall time (hours)")
    ax.set_ylabel(_text(metric))
    title = _text(metric) + (f"  (smoothed {weight:g})" if weight else "")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    _save(fig, path, fmt)
    return fmt


def curve_series(run: dict[str, Any], weight: float = 0.0, x: str = "step",
                 t0: float = 0.0) -> tuple[list[float], list[float], list[float], int]:
    """What `plot_curves` draws for one run: (x values, raw values, shown values - smoothed
    over the whole line, so a branch's curve continues its parent's - and the index its
    drawing starts at: its branch point, where it joins the parent's curve)."""
    points = run["points"]
    if x == "time":
        points = [p for p in points if p[1] is not None]
        xs = [(p[1] - t0) / 3600 for p in points]
    else:
        xs = [p[0] for p in points]
    ys = [p[2] for p in points]
    shown = smooth(ys, weight) if weight else list(ys)
    start = 0
    point = run.get("branch_point")
    if point is not None:
        at = point["step"] if x == "step" else \
            ((point["seconds"] - t0) / 3600 if point.get("seconds") is not None else None)
        if at is not None:  # the last point at or before it: the curves join there
            start = max((i for i, v in enumerate(xs) if v <= at), default=0)
    return xs, ys, shown, start


def _colors(n: int) -> list[Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def plot_heatmap(heat: dict[str, Any], path: str | Path, *, svg: bool = False,
                 size: tuple[float, float] | None = None) -> str:
    """Draw `views.layer_heatmap` data: layers (rows) x snapshots (columns), colour = the
    relative change against the previous snapshot on a log scale; unchanged cells dark,
    not comparable (added, reshaped, no statistics) light grey, frozen layers (dirty-layer
    training) hatched in red. Return the format written."""
    fmt = image_format(path, svg)
    layers, values, commits = heat["layers"], heat["values"], heat["commits"]
    if not layers or not commits:
        raise ViewError(f"{heat['name']} has no layer statistics to draw (no layers match, "
                        "or no snapshots)")
    mpl = _matplotlib()
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Patch, Rectangle

    grid = np.array([[math.nan if v is None else v for v in row] for row in values],
                    dtype=float)
    positive = grid[np.isfinite(grid) & (grid > 0)]
    if size is None:
        size = (min(20.0, max(8.0, 2.5 + len(commits) * 0.08)),
                min(20.0, max(3.0, 1.5 + len(layers) * 0.22)))
    fig = _figure(size)
    ax = fig.add_subplot()
    cmap = mpl.colormaps["viridis"].with_extremes(bad="#d9d9d9", under="#1a1a1a")
    if positive.size:
        top = float(positive.max())
        bottom = max(float(positive.min()), top / 1e6)
        if bottom >= top:
            bottom = top / 10
        norm = LogNorm(vmin=bottom, vmax=top, clip=False)
    else:  # nothing moved: every cell is "unchanged"
        norm = LogNorm(vmin=1e-6, vmax=1.0)
    shown = np.where(grid > 0, grid, np.where(np.isfinite(grid), norm.vmin / 10, np.nan))
    image = ax.imshow(np.ma.masked_invalid(shown), aspect="auto", interpolation="nearest",
                      cmap=cmap, norm=norm)
    legend = [Patch(facecolor="#1a1a1a", label="unchanged"),
              Patch(facecolor="#d9d9d9", label="not comparable")]
    # frozen cells keep their colour (a frozen layer should not move) under a red hatch:
    # one rectangle per run of consecutive frozen snapshots
    segments = 0
    for i, cols in enumerate(heat["frozen"]):
        for start, stop in _runs(cols):
            ax.add_patch(Rectangle((start - 0.5, i - 0.5), stop - start, 1, fill=False,
                                   hatch="///", edgecolor="#e41a1c", linewidth=0))
            segments += 1
    if segments:
        legend.insert(0, Patch(facecolor="white", hatch="///", edgecolor="#e41a1c",
                               label="frozen (dirty-layer training)"))
    bar = fig.colorbar(image, ax=ax, extend="min", pad=0.01)
    bar.set_label("relative change (log scale)")
    prefix = os.path.commonprefix(layers) if len(layers) > 1 else ""
    prefix = prefix[:prefix.rfind("/") + 1]
    labels = [_text(name[len(prefix):]) for name in layers]
    every = max(1, math.ceil(len(layers) / 60))
    ax.set_yticks(range(0, len(layers), every), labels[::every],
                  fontsize="small" if len(layers) <= 30 else "x-small")
    ticks = _ticks(len(commits))
    ax.set_xticks(ticks, [str(commits[i]["step"]) if commits[i]["step"] is not None else str(i)
                          for i in ticks])
    ax.set_xlabel("snapshot (step), oldest left")
    ax.set_ylabel(_text(f"layer{f' ({prefix[:-1]})' if prefix else ''}"))
    ax.set_title(_text(f"layer change along {heat['name']} ({len(commits)} snapshots)"))
    fig.legend(handles=legend, loc="outside lower left", ncol=3, fontsize="small",
               frameon=False)
    _save(fig, path, fmt)
    return fmt


def _runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5, 6] -> [(0, 3), (5, 7)]: runs of consecutive indices, end exclusive."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _ticks(n: int, most: int = 12) -> list[int]:
    if n <= most:
        return list(range(n))
    step = math.ceil(n / most)
    return list(range(0, n, step))
