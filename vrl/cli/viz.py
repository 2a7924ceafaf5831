"""Commands that show runs side by side: compare (a table) and plot (curves, heatmap).

They read commits only (vrl.views): no tensor data, no torch, so they work on a
metadata-only clone. `plot` needs matplotlib (the `plots` extra).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any

import click

from vrl.cli._common import echo_json, fmt_num, json_option, pass_repo, plural, safe, short, table
from vrl.repo import Repo
from vrl.returns import default_returns

DEFAULT_METRICS = 4  # shown in the table when --metrics is not given and no return is known
CELL_MAX = 32


def _split(names: str | None) -> list[str] | None:
    if names is None:
        return None
    out = [n.strip() for n in names.split(",") if n.strip()]
    if not out:
        raise click.BadParameter("give at least one metric name", param_hint="--metrics")
    return out


def _cell(value: Any) -> str:
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = fmt_num(value)
    return text if len(text) <= CELL_MAX else text[:CELL_MAX - 3] + "..."


def _branch_point(row: dict[str, Any]) -> str:
    point = row["branch_point"]
    if point is None:
        return "-"
    where = f"step {point['step']}" if point["step"] is not None else short(point["id"])[:8]
    return f"{point['run']} ({where})"


def _table_metrics(data: dict[str, Any], chosen: list[str] | None) -> list[str]:
    if chosen is not None:
        return chosen
    names = data["metrics"]
    return default_returns(names) or names[:DEFAULT_METRICS]


@click.command()
@click.argument("revs", nargs=-1)
@click.option("--all-tags", is_flag=True, help="Also show every tag as a run.")
@click.option("--metrics", "metric_names", default=None, metavar="A,B",
              help="Metrics to show (default: the return, else the first few).")
@click.option("--sort", default=None, metavar="NAME[:asc|:desc]",
              help="Order rows by a metric (best first), a hyperparameter or a column "
                   "(step, snapshots, own, time, name).")
@click.option("--all-params", is_flag=True,
              help="Show every hyperparameter, not only those that differ.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (every metric unless --metrics).")
@click.option("--group-by", "group_by", default=None, metavar="KEY[,KEY]",
              help="One row per group of runs with the same values of these hyperparameters "
                   "(or 'sweep': a sweep's configurations, seeds pooled): runs, mean steps, "
                   "mean +- std of the last and best metric values.")
@json_option
@pass_repo
def compare(repo: Repo, revs: tuple[str, ...], all_tags: bool, metric_names: str | None,
            sort: str | None, all_params: bool, as_csv: bool, group_by: str | None,
            as_json: bool) -> None:
    """Compare runs: one row per branch head (or REV), the hyperparameters that differ,
    the last and best value of metrics, step, snapshots and where each run branched.

    A REV with * ? or [ names the branches it matches ('sweep/lr/*'); --group-by pools
    runs (seeds) into one row per group with mean +- std.

    A run is its first-parent line: `snapshots` counts it all, `own` those after the
    branch point; best is the largest value, the smallest for losses and errors.
    """
    if as_csv and as_json:
        raise click.UsageError("choose one of --csv and --json")
    chosen = _split(metric_names)
    from vrl import views

    if group_by is not None:
        if all_params:
            raise click.UsageError("--all-params shows runs: leave it out with --group-by")
        keys = [k.strip() for k in group_by.split(",") if k.strip()]
        if not keys:
            raise click.BadParameter("give at least one key", param_hint="--group-by")
        from vrl.groups import compare_groups

        found = compare_groups(repo, keys, list(revs) or None, metrics=chosen, sort=sort,
                               all_tags=all_tags)
        _show_groups(found, chosen, as_json, as_csv)
        return
    data = views.compare(repo, list(revs) or None, metrics=chosen, sort=sort,
                         all_tags=all_tags, all_params=all_params)
    if as_json:
        echo_json(data)
        return
    if as_csv:
        click.echo(_csv(data), nl=False)
        return
    if not data["rows"]:
        click.echo("No runs yet: commit a snapshot first")
        return
    metrics = _table_metrics(data, chosen)
    # one run shows all its hyperparameters: as columns they made one line of hundreds of
    # characters, so they go below the table, one per line
    params = data["params"] if len(data["rows"]) > 1 else []
    headers = ["run", "commit", "step", "snapshots", "branched from", *params]
    for m in metrics:
        headers += [m, f"{m}:best"]
    rows = []
    for row in data["rows"]:
        cells = [row["name"], short(row["id"])[:8], fmt_num(row["step"]),
                 f"{row['snapshots']}" + (f" (+{row['own']})" if row["branch_point"] else ""),
                 _branch_point(row)]
        cells += [_cell(row["hparams"][k]) if k in row["hparams"] else "-" for k in params]
        for m in metrics:
            summary = row["metrics"].get(m)
            cells += [_cell(summary["last"]) if summary else "-",
                      _cell(summary["best"]) if summary and summary["best"] is not None
                      else "-"]
        rows.append(cells)
    text = table(headers, rows)
    if sys.stdout.isatty():  # the header line in bold
        first, _, rest = text.partition("\n")
        text = click.style(first, bold=True) + "\n" + rest
    click.echo(text)
    if data["params"] and not params:
        hparams = data["rows"][0]["hparams"]
        width = max(len(safe(k, True)) for k in data["params"])
        click.echo("\nhyperparameters:\n" + "\n".join(
            f"  {safe(k, True).ljust(width)}  {_cell(hparams[k]) if k in hparams else '-'}"
            for k in data["params"]))
    hidden = len(data["metrics"]) - len(metrics)
    if hidden > 0:
        click.echo(f"({len(metrics)} of {len(data['metrics'])} metrics shown; choose with "
                   "--metrics a,b, list them with --json)", err=True)


def _mean_std(stats: dict[str, Any], n: int) -> str:
    """"12.5 +- 0.7" (no std for one value; "(k)" when only k of the group's n runs have
    the metric); "-" without values."""
    if stats["mean"] is None:
        return "-"
    text = fmt_num(stats["mean"])
    if stats["std"] is not None:
        text += f" +- {fmt_num(stats['std'])}"
    return text + (f" ({stats['n']})" if stats["n"] != n else "")


def _show_groups(data: dict[str, Any], chosen: list[str] | None, as_json: bool,
                 as_csv: bool) -> None:
    if as_json:
        echo_json(data)
        return
    keys, groups = data["group_by"], data["groups"]
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        head = [*keys, "runs", "steps"]
        for m in data["metrics"]:
            head += [f"{m}:mean", f"{m}:std", f"{m}:n", f"{m}:best:mean", f"{m}:best:std"]
        writer.writerow(head)
        for g in groups:
            cells = [_cell(g["key"][k]) if g["key"][k] is not None else "" for k in keys]
            cells += [g["n"], g["steps"]["mean"]]
            for m in data["metrics"]:
                last, best = g["metrics"][m]["last"], g["metrics"][m]["best"]
                cells += [last["mean"], last["std"], last["n"], best["mean"], best["std"]]
            writer.writerow(["" if c is None else c for c in cells])
        click.echo(out.getvalue(), nl=False)
        return
    if not groups:
        click.echo("No runs yet: commit a snapshot first")
        return
    metrics = _table_metrics(data, chosen)
    headers = [*keys, "runs", "steps"]
    for m in metrics:
        headers += [m, f"{m}:best"]
    rows = []
    for g in groups:
        cells = [_cell(g["key"][k]) for k in keys]
        cells += [str(g["n"]), fmt_num(g["steps"]["mean"])]
        for m in metrics:
            cells += [_mean_std(g["metrics"][m]["last"], g["n"]),
                      _mean_std(g["metrics"][m]["best"], g["n"])]
        rows.append(cells)
    text = table(headers, rows)
    if sys.stdout.isatty():
        first, _, rest = text.partition("\n")
        text = click.style(first, bold=True) + "\n" + rest
    click.echo(text)
    hidden = len(data["metrics"]) - len(metrics)
    click.echo("mean +- sample std over the runs of each group (last and best values)"
               + (f"; {len(metrics)} of {len(data['metrics'])} metrics shown (--metrics a,b)"
                  if hidden > 0 else ""), err=True)


def _csv(data: dict[str, Any]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    head = ["run", "id", "step", "time", "snapshots", "own", "branch_point_run",
            "branch_point_id", *data["params"]]
    for m in data["metrics"]:
        head += [m, f"{m}:best", f"{m}:last_step", f"{m}:best_step"]
    writer.writerow(head)

    def value(v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, (dict, list)):
            return json.dumps(v, sort_keys=True)
        return safe(v, one_line=True)

    for row in data["rows"]:
        point = row["branch_point"] or {}
        cells = [row["name"], row["id"], row["step"], row["time"], row["snapshots"], row["own"],
                 point.get("run"), point.get("id")]
        cells += [row["hparams"].get(k) for k in data["params"]]
        for m in data["metrics"]:
            s = row["metrics"].get(m, {})
            cells += [s.get("last"), s.get("best"), s.get("last_step"), s.get("best_step")]
        writer.writerow([value(c) for c in cells])
    return out.getvalue()


def _size(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        w, h = (float(v) for v in text.lower().split("x"))
        if not (0 < w <= 100 and 0 < h <= 100):
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{text!r} is not WIDTHxHEIGHT in inches (e.g. 10x6)",
                                 param_hint="--size") from None
    return w, h


@click.command()
@click.argument("metric", required=False)
@click.argument("revs", nargs=-1)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Image to write (.png or .svg; default curves.png or layers.png).")
@click.option("--smooth", "weight", type=float, default=0.0, metavar="W",
              help="TensorBoard-like smoothing weight in [0, 1), e.g. 0.9.")
@click.option("--svg", is_flag=True, help="Write SVG instead of PNG.")
@click.option("--x", "x_axis", type=click.Choice(["step", "time"]), default="step",
              help="Horizontal axis: training step or wall time.")
@click.option("--all-tags", is_flag=True, help="Also plot every tag as a run.")
@click.option("--layers", "layers_rev", default=None, metavar="REV",
              help="Draw the layer-change heatmap along REV's history instead.")
@click.option("--limit", type=int, default=None, metavar="N",
              help="Heatmap: the last N snapshots only.")
@click.option("--prefix", default=None,
              help="Heatmap: layers whose names start with this (default: the model's).")
@click.option("--size", default=None, metavar="WxH", help="Figure size in inches.")
@pass_repo
def plot(repo: Repo, metric: str | None, revs: tuple[str, ...], output: str | None,
         weight: float, svg: bool, x_axis: str, all_tags: bool, layers_rev: str | None,
         limit: int | None, prefix: str | None, size: str | None) -> None:
    """Plot METRIC (default: the return) against the step for every branch (or REV...),
    overlaid; or, with --layers REV, how much every layer moved at every snapshot (frozen
    layers marked).
    """
    from vrl import plots, views

    figure_size = _size(size)
    if layers_rev is not None:
        if metric is not None or revs:
            raise click.UsageError("--layers REV draws one heatmap: give no METRIC or REV")
        output = output or ("layers.svg" if svg else "layers.png")
        plots.image_format(output, svg)  # a bad name fails before any work
        heat = views.layer_heatmap(repo, layers_rev, limit=limit, prefix=prefix)
        fmt = plots.plot_heatmap(heat, output, svg=svg, size=figure_size)
        click.echo(f"wrote {safe(output, True)} ({fmt.upper()}): {len(heat['layers'])} "
                   f"layers x {len(heat['commits'])} snapshots of {safe(layers_rev, True)}")
        return
    if metric is None:  # the return, as compare and the UI show by default
        metric = next(iter(default_returns(views.metric_names(repo))), None)
        if metric is None:
            raise click.UsageError("give a METRIC to plot (`vrl compare --json` lists them), "
                                   "or --layers REV")
    if limit is not None or prefix is not None:
        raise click.UsageError("--limit and --prefix apply to --layers only")
    output = output or ("curves.svg" if svg else "curves.png")
    plots.image_format(output, svg)
    views.smooth([], weight)
    runs = views.curves(repo, metric, list(revs) or None, all_tags=all_tags)
    fmt = plots.plot_curves(runs, metric, output, weight=weight, x=x_axis, svg=svg,
                            **({"size": figure_size} if figure_size else {}))
    points = sum(len(r["points"]) for r in runs)
    click.echo(f"wrote {safe(output, True)} ({fmt.upper()}): {safe(metric, True)} of "
               f"{plural(len(runs), 'run')}, {plural(points, 'point')}")


COMMANDS = [compare, plot]
