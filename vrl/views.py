"""Plain-data views of a repository's history: runs, the compare table, metric curves, the
layer-change heatmap, the commit graph, a commit's details and a diff.

What `vrl compare`, `vrl plot`, `vrl ui` and `vrl report` show. Every function returns
JSON-serialisable data (dicts, lists, str, int, float, bool, None; never NaN or infinity:
a non-finite metric is the string it is stored as, "nan", "inf" or "-inf", and a curve
skips it). Only commit objects are read (manifests for `diff`, when a commit holds no
statistics for the pair): never tensor data and never torch, so all of it works on a
metadata-only clone.

A *run* is a line of snapshots: a branch head (by default every local branch, and every
remote-tracking branch that no local branch of its name or at its commit shows) or any
revision, followed back along first parents to the root. Its metrics, curves and heatmap
are along that line.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from vrl.errors import ObjectNotFoundError, PrunedError, VrlError
from vrl.forks import branch_points, ref_went_on  # noqa: F401 - part of the views API
from vrl.history import (  # noqa: F401 - part of the views API
    History,
    ref_names,
    refs_token,
    seconds,
    split_stats,
)
from vrl.objects import ObjectId
from vrl.refs import short_ref
from vrl.repo import Repo

# shown by default where present, the trainer's return first (vrl/returns.py: what each is)
from vrl.returns import RETURN_METRICS, default_returns  # noqa: F401 - part of the views API

# Metrics whose smaller values are better (matched on the last part of the name, so that
# `losses/explained_variance` is not a loss); every other metric is better when larger.
_LOWER_IS_BETTER = re.compile(r"loss|error|(^|_)err$|regret|cost|penalty|latency|duration|"
                              r"(^|_)time($|_)|(^|_)kl($|_)|perplexity|_s$|_ms$|seconds",
                              re.IGNORECASE)


class ViewError(VrlError, ValueError):
    """A view was asked for something the repository does not hold (a metric, a column)."""


@functools.lru_cache(maxsize=4096)
def lower_is_better(metric: str) -> bool:
    """Whether the best value of `metric` is its smallest (losses, errors, KL, times)."""
    return _LOWER_IS_BETTER.search(metric.rpartition("/")[2]) is not None


# ---------------------------------------------------------------------------- values


def number(value: Any) -> float | int | None:
    """A metric value as a number: ints and floats as they are, "nan"/"inf"/"-inf" (how
    commits store non-finite values) as floats; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if value in ("nan", "inf", "-inf"):
        return float(value)
    return None


def _json_safe(value: Any) -> Any:
    """A value fit for JSON: non-finite floats become their strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys: {"a": {"b": 1}} -> {"a.b": 1}. Lists and
    empty dicts are values."""
    out: dict[str, Any] = {}
    if isinstance(data, dict) and not data and not prefix:
        return out
    stack = [(prefix, data)]
    while stack:
        key, value = stack.pop()
        if isinstance(value, dict) and value:
            stack.extend((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
        else:
            out[key] = value
    return dict(sorted(out.items()))


def _same(a: Any, b: Any) -> bool:
    """Equal as stored JSON (1 and 1.0 and True differ, as they do in a config)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def natural_key(text: str) -> list[Any]:
    """Sort key putting `layer.2` before `layer.10`."""
    return [(0, int(part)) if part.isdigit() else (1, part)
            for part in re.split(r"(\d+)", text) if part]


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def select_runs(repo: Repo, revs: Sequence[str] | None, all_tags: bool
                 ) -> list[tuple[str, str | None, ObjectId]]:
    """(name, full ref or None, commit id) of every run asked for."""
    out: list[tuple[str, str | None, ObjectId]] = []
    if revs:
        branches = repo.branches()
        for rev in revs:
            if is_pattern(rev):
                out += matching_branches(repo, rev)
                continue
            oid = repo.resolve(rev)
            out.append((rev, f"refs/heads/{rev}" if rev in branches else None, oid))
        out = list({name: (name, ref, oid) for name, ref, oid in out}.values())
    else:
        local = repo.refs.list("refs/heads/")
        for ref, oid in sorted(local.items()):
            out.append((short_ref(ref), ref, oid))
        # a clone has one local branch, the others are remote-tracking: shown unless a
        # local branch of that name (or at that commit) already is
        local_names = {short_ref(ref) for ref in local}
        local_ids = set(local.values())
        for ref, oid in sorted(repo.refs.list("refs/remotes/").items()):
            name = short_ref(ref)
            if oid not in local_ids and name.partition("/")[2] not in local_names and \
                    not ref.endswith("/HEAD"):
                out.append((name, ref, oid))
        if not out and repo.head() is not None:  # detached HEAD, no branch
            out.append(("HEAD", None, repo.head()))
    if all_tags:
        named = {name for name, _, _ in out}
        for ref, oid in sorted(repo.refs.list("refs/tags/").items()):
            name = short_ref(ref)
            out.append((name if name not in named else f"tag: {name}", ref, oid))
    return out


_GLOB = re.compile(r"[*?\[]")


def is_pattern(rev: str) -> bool:
    """Whether `rev` is a pattern of branch names (no ref name holds * ? or [)."""
    return bool(_GLOB.search(rev))


def matching_branches(repo: Repo, pattern: str) -> list[tuple[str, str | None, ObjectId]]:
    """The branches (local, then remote-tracking) whose short names match the shell-style
    `pattern` (`*` also matches '/', as in `git branch --list`), sorted by name."""
    import fnmatch

    found = []
    for prefix in ("refs/heads/", "refs/remotes/"):
        for ref, oid in sorted(repo.refs.list(prefix).items()):
            name = short_ref(ref)
            if fnmatch.fnmatchcase(name, pattern) and not ref.endswith("/HEAD"):
                found.append((name, ref, oid))
    if not found:
        raise ViewError(f"no branch matches {pattern!r}")
    return found


def _metric_summary(history: History, line: list[ObjectId], names: Iterable[str] | None
                    ) -> dict[str, dict[str, Any]]:
    """Per metric along a line: the last value (and its step) and the best finite value
    (and its step); best is the largest, or the smallest for lower-is-better metrics.

    Runs share the history before their branch points: the summary up to each commit is
    kept, so a shared prefix is summed up once."""
    wanted = frozenset(names) if names is not None else None
    memo = history.summaries.setdefault(wanted, {})
    start = len(line)
    while start and line[start - 1] not in memo:
        start -= 1
    last, best = (dict(d) for d in memo[line[start - 1]]) if start else ({}, {})
    for oid in line[start:]:
        commit = history.commit(oid)
        for name, raw in commit.metrics.items():
            if wanted is not None and name not in wanted:
                continue
            value = number(raw)
            if value is None:
                continue
            last[name] = (value, commit.step)
            if not math.isfinite(value):
                continue
            held = best.get(name)
            if held is None or (value < held[0] if lower_is_better(name)
                                else value > held[0]):
                best[name] = (value, commit.step)
        memo[oid] = (dict(last), dict(best))
    return {name: {"last": _json_safe(value), "last_step": step,
                   "best": best[name][0] if name in best else None,
                   "best_step": best[name][1] if name in best else None}
            for name, (value, step) in sorted(last.items())}


def runs(repo: Repo, revs: Sequence[str] | None = None, all_tags: bool = False,
         metrics: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One dict per run: name, ref, id, step, time, message, snapshots (commits on its
    first-parent line), own (those after its branch point), branch_point ({id, run, step,
    index on the line, seconds} or None), hparams (flattened), metrics ({name: {last,
    last_step, best, best_step}}: all metrics unless `metrics` names some)."""
    history = History.of(repo)
    chosen = select_runs(repo, revs, all_tags)
    heads = [oid for _, _, oid in chosen]
    went_on = [ref_went_on(repo, ref, history.line(oid)) if ref else None
               for _, ref, oid in chosen]
    points = branch_points(history, heads, [name for name, _, _ in chosen], went_on)
    out = []
    for (name, ref, oid), point in zip(chosen, points, strict=True):
        commit = history.commit(oid)
        line = history.line(oid)
        out.append({
            "name": name, "ref": ref, "id": oid, "step": commit.step, "time": commit.time,
            "message": first_line(commit.message), "snapshots": len(line),
            "own": len(line) - 1 - point["index"] if point else len(line),
            "branch_point": point, "hparams": flatten(commit.hparams),
            "metrics": _metric_summary(history, line, metrics),
        })
    return out


# ---------------------------------------------------------------------------- compare


BUILTIN_COLUMNS = ("name", "step", "snapshots", "own", "time", "id")


def _sort_value(row: dict[str, Any], key: str) -> tuple[str, Any]:
    if key in row["metrics"]:
        value = number(row["metrics"][key]["last"])
        return ("metric", value if value is not None and math.isfinite(value) else None)
    if key in BUILTIN_COLUMNS:
        return ("column", row[key])
    return ("param", row["all_hparams"].get(key))


def compare(repo: Repo, revs: Sequence[str] | None = None, metrics: Sequence[str] | None = None,
            sort: str | None = None, all_tags: bool = False, all_params: bool = False
            ) -> dict[str, Any]:
    """The compare table: {"params": [keys], "metrics": [names], "rows": [...]}.

    `params` are the (flattened) hyperparameters whose values differ between the rows -
    every one with a single row or `all_params`; a key missing from a row differs. Each
    row is a `runs()` dict whose `hparams` holds those keys only (a missing key is
    absent) and whose `metrics` holds the chosen metrics (all by default; a metric no run
    has is an error). `sort` orders the rows by a metric's last value (best first), a
    hyperparameter or a column (name, step, snapshots, own, time), with `:asc` or
    `:desc` to choose the direction; rows without a value come last.
    """
    rows = runs(repo, revs, all_tags, metrics)
    names = sorted({m for row in rows for m in row["metrics"]}, key=natural_key)
    if metrics is not None:
        unknown = [m for m in metrics if m not in names]
        if unknown and rows:
            known = metric_names(repo, [row["id"] for row in rows])
            raise ViewError(f"no run has metric {unknown[0]!r}; metrics: "
                            f"{', '.join(known[:20]) or '(none)'}"
                            f"{' ...' if len(known) > 20 else ''}")
        names = list(dict.fromkeys(metrics))
    keys = sorted({k for row in rows for k in row["hparams"]}, key=natural_key)
    differing = [k for k in keys if all_params or len(rows) == 1 or
                 any(k not in row["hparams"] or not _same(row["hparams"][k],
                                                          rows[0]["hparams"].get(k))
                     for row in rows)]
    for row in rows:
        row["all_hparams"] = row["hparams"]
    if sort:
        rows = _sorted(rows, sort)
    for row in rows:
        every = row.pop("all_hparams")
        row["hparams"] = {k: every[k] for k in differing if k in every}
    return {"params": differing, "metrics": names, "rows": rows}


def _sorted(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    key, direction = sort, None
    if sort.rpartition(":")[2] in ("asc", "desc") and not _known(rows, sort):
        key, _, direction = sort.rpartition(":")
    if not _known(rows, key):
        raise ViewError(f"cannot sort by {key!r}: it is no metric, hyperparameter or "
                        f"column ({', '.join(BUILTIN_COLUMNS)}) of these runs")
    kind = next(_sort_value(row, key)[0] for row in rows)
    if direction is None:  # metrics best first; everything else ascending
        direction = "desc" if kind == "metric" and not lower_is_better(key) else "asc"
    present = [row for row in rows if _sort_value(row, key)[1] is not None]
    missing = [row for row in rows if _sort_value(row, key)[1] is None]

    def order(row: dict[str, Any]) -> tuple[int, Any]:
        value = _sort_value(row, key)[1]
        # mixed types (a hyperparameter that is a number here and a string there)
        # sort by their JSON text after all the numbers
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return (0, value)
        return (1, json.dumps(value, sort_keys=True))

    present.sort(key=order, reverse=direction == "desc")
    return present + missing


def _known(rows: list[dict[str, Any]], key: str) -> bool:
    return key in BUILTIN_COLUMNS or any(key in row["metrics"] or key in row["all_hparams"]
                                         for row in rows)


# ---------------------------------------------------------------------------- curves


def metric_names(repo: Repo, revs: Sequence[str] | None = None) -> list[str]:
    """Every numeric metric recorded by a commit reachable from `revs` (default: the runs
    `runs()` shows, tags included), sorted naturally."""
    history = History.of(repo)
    heads = [repo.resolve(r) for r in revs] if revs else \
        [oid for _, _, oid in select_runs(repo, None, all_tags=True)]
    names: set[str] = set()
    for oid in history.reachable(heads):
        for name, value in history.commit(oid).metrics.items():
            if name not in names and number(value) is not None:
                names.add(name)
    return sorted(names, key=natural_key)


def curves(repo: Repo, metric: str, revs: Sequence[str] | None = None,
           all_tags: bool = False) -> list[dict[str, Any]]:
    """Per run: {"name", "id", "branch_point", "points": [[step, seconds, value], ...]}
    along its first-parent line, oldest first. `step` is the commit's training step (its
    index on the line where it has none), `seconds` its wall-clock time since the epoch;
    commits without a finite value of `metric` are skipped. An error if no run has it."""
    history = History.of(repo)
    chosen = select_runs(repo, revs, all_tags)
    points = branch_points(history, [oid for _, _, oid in chosen],
                            [name for name, _, _ in chosen])
    out = []
    for (name, ref, oid), point in zip(chosen, points, strict=True):
        series = []
        for index, cid in enumerate(history.line(oid)):
            commit = history.commit(cid)
            value = number(commit.metrics.get(metric))
            if value is None or not math.isfinite(value):
                continue
            series.append([commit.step if commit.step is not None else index,
                           seconds(commit.time), value])
        out.append({"name": name, "ref": ref, "id": oid, "branch_point": point,
                    "points": series})
    if chosen and not any(run["points"] for run in out):
        known = metric_names(repo, [oid for _, _, oid in chosen])
        raise ViewError(f"no run has metric {metric!r}; metrics: "
                        f"{', '.join(known[:20]) or '(none)'}{' ...' if len(known) > 20 else ''}")
    return out


METRIC_GROUPS = ("charts", "losses", "env", "eval")
"""The dashboard's first groups, in this order (the trainer's prefixes, as TensorBoard
shows them); other prefixes follow by name, metrics without a prefix last."""


def metric_groups(names: Iterable[str]) -> list[dict[str, Any]]:
    """Metric names grouped by their prefix (the part before the first '/'):
    [{"group": prefix, or "" for metrics without one, "metrics": [names]}], in the order
    of `METRIC_GROUPS`, then other prefixes by name, then "" (ungrouped)."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names, key=natural_key):
        prefix, slash, _ = name.partition("/")
        groups.setdefault(prefix if slash else "", []).append(name)

    def order(group: str) -> tuple[int, Any]:
        if group in METRIC_GROUPS:
            return (0, METRIC_GROUPS.index(group))
        return (2, "") if group == "" else (1, natural_key(group))

    return [{"group": g, "metrics": groups[g]} for g in sorted(groups, key=order)]


def all_curves(repo: Repo, revs: Sequence[str] | None = None,
               metrics: Sequence[str] | None = None) -> dict[str, Any]:
    """Every metric of every run in one pass over each run's line (the dashboard's data),
    by column: {"metrics": [names, sorted naturally], "groups": `metric_groups()`,
    "runs": [{"name", "id", "steps": [...], "seconds": [...], "values": {metric:
    [value or None per commit]}}]}, one entry per commit of the run's first-parent line,
    oldest first (`steps` as in `curves()`: the index where a commit has no step).
    Non-finite values are None (a gap); `metrics` limits the names (default: all); a run
    without a metric has no column for it."""
    history = History.of(repo)
    wanted = frozenset(metrics) if metrics is not None else None
    names: set[str] = set()
    out = []
    # runs share their history before a branch point: each commit is read once
    made: dict[ObjectId, tuple[int | None, float | None, dict[str, float]]] = {}
    for name, _, oid in select_runs(repo, revs, False):
        line = history.line(oid)
        rows = []
        for cid in line:
            held = made.get(cid)
            if held is None:
                commit = history.commit(cid)
                values = {}
                for metric, raw in commit.metrics.items():
                    value = number(raw)
                    if value is not None and (wanted is None or metric in wanted):
                        values[metric] = value if math.isfinite(value) else None
                held = made[cid] = (commit.step, seconds(commit.time), values)
            rows.append(held)
        mine: set[str] = set()
        for _, _, values in rows:
            mine.update(values)
        names.update(mine)
        out.append({"name": name, "id": oid,
                    "steps": [r[0] if r[0] is not None else i for i, r in enumerate(rows)],
                    "seconds": [r[1] for r in rows],
                    "values": {m: [r[2].get(m) for r in rows]
                               for m in sorted(mine, key=natural_key)}})
    ordered = sorted(names, key=natural_key)
    return {"metrics": ordered, "groups": metric_groups(ordered), "runs": out}


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: an exponential moving average with weight `weight` in
    [0, 1), debiased (divided by 1 - weight**n) so the first points are not pulled to 0."""
    if not 0 <= weight < 1:
        raise ViewError(f"smoothing weight {weight} is not in [0, 1); try 0.6 or 0.9")
    out, last, n = [], 0.0, 0
    for value in values:
        n += 1
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** n) if weight else value)
    return out


# ---------------------------------------------------------------------------- heatmap


def _is_frozen(layer: str, frozen: set[str]) -> bool:
    # the trainer records module names (`actor.0`), the store layers under the snapshot's
    # tree (`model/actor.0`)
    return layer in frozen or layer.rpartition("/")[2] in frozen or \
        any(layer.endswith("/" + f) for f in frozen if "/" in f)


def layer_heatmap(repo: Repo, rev: str = "HEAD", limit: int | None = None,
                  prefix: str | None = None) -> dict[str, Any]:
    """Layers x commits of relative change along `rev`'s first-parent line (oldest first;
    the last `limit` commits), from the statistics each commit stores against its first
    parent.

    {"name", "id", "layers": [...], "commits": [{id, step, time, message}],
     "values": [[rel or None per commit] per layer], "frozen": [[commit indices] per
     layer], "material": [[commit indices] per layer], "threshold", "max"}. None means not
    comparable (added, reshaped) or no statistics. `prefix` picks layers by name (default:
    `model/` where the snapshots are training states, else all).
    """
    history = History.of(repo)
    head = repo.resolve(rev)
    line = history.line(head)
    if limit is not None:
        if limit < 1:
            raise ViewError(f"limit must be at least 1, not {limit}")
        line = line[-limit:]
    if prefix is None:  # a training snapshot: the model's layers, not optimizer state
        layers = history.stats(head).get("layers")
        prefix = "model/" if isinstance(layers, dict) and \
            any(name.startswith("model/") for name in layers) else ""
    stats = [history.layers(oid, prefix) for oid in line]
    seen: set[str] = set()
    for layers in stats:
        seen.update(layers)
    names = sorted(seen, key=natural_key)
    values: list[list[float | None]] = [[] for _ in names]
    material: list[list[int]] = [[] for _ in names]
    frozen: list[list[int]] = [[] for _ in names]
    top = 0.0
    frozen_rows: dict[tuple[str, ...], list[int]] = {}  # runs freeze the same layers often
    missing = (None, False)
    for c, (oid, layers) in enumerate(zip(line, stats, strict=True)):
        held = history.commit(oid).meta.get("frozen_layers")
        held = tuple(f for f in held if isinstance(f, str)) if isinstance(held, list) else ()
        if held not in frozen_rows:
            frozen_rows[held] = [i for i, name in enumerate(names)
                                 if _is_frozen(name, set(held))]
        for i in frozen_rows[held]:
            frozen[i].append(c)
        for i, name in enumerate(names):
            rel, is_material = layers.get(name, missing)
            values[i].append(rel)
            if rel is not None and rel > top:
                top = rel
            if is_material:
                material[i].append(c)
    commits = []
    for oid in line:
        commit = history.commit(oid)
        commits.append({"id": oid, "step": commit.step, "time": commit.time,
                        "message": first_line(commit.message)})
    return {"name": rev, "id": head, "layers": names, "commits": commits, "values": values,
            "frozen": frozen, "material": material,
            "threshold": repo.threshold, "max": top}


# ---------------------------------------------------------------------------- graph


def graph(repo: Repo) -> dict[str, Any]:
    """Every commit reachable from a ref, newest first in topological order (a commit
    after all its children), with lanes for a `git log --graph`-like drawing.

    {"head": id or None, "branch": current branch or None, "lanes": width, "commits":
    [{id, parents, row, lane, parent_lanes, refs, time, step, message, author}]}.
    `lane` is the commit's column; `parent_lanes[k]` is the column the edge to
    `parents[k]` runs down (reserved from the row below until the parent's row, so
    edges never pass through another commit): draw it from (row, lane) to (row + 1,
    parent_lanes[k]), straight down, then into the parent.
    """
    history = History.of(repo)
    labels = ref_names(repo)
    heads = list(labels)
    head = repo.head()
    if head is not None:
        heads.append(head)
    commits = history.reachable(heads)
    children: dict[ObjectId, int] = dict.fromkeys(commits, 0)
    for oid in commits:
        for p in history.commit(oid).parents:
            if p in children:
                children[p] += 1
    import heapq

    ready = [(newest_first(history.commit(c).time), c) for c in commits if children[c] == 0]
    heapq.heapify(ready)
    lanes: list[ObjectId | None] = []
    out = []
    while ready:
        _, oid = heapq.heappop(ready)
        commit = history.commit(oid)
        waiting = [i for i, want in enumerate(lanes) if want == oid]
        if waiting:
            lane = waiting[0]
            for i in waiting[1:]:
                lanes[i] = None  # edges from other children end here
        else:
            lane = lanes.index(None) if None in lanes else len(lanes)
            if lane == len(lanes):
                lanes.append(None)
        parents = [p for p in commit.parents if p in children]
        parent_lanes = []
        lanes[lane] = parents[0] if parents else None
        if parents:
            parent_lanes.append(lane)
        for p in parents[1:]:
            if p in lanes:
                parent_lanes.append(lanes.index(p))
            else:
                free = lanes.index(None) if None in lanes else len(lanes)
                if free == len(lanes):
                    lanes.append(None)
                lanes[free] = p
                parent_lanes.append(free)
        while lanes and lanes[-1] is None:
            lanes.pop()
        out.append({"id": oid, "parents": parents, "row": len(out), "lane": lane,
                    "parent_lanes": parent_lanes, "refs": labels.get(oid, []),
                    "time": commit.time, "step": commit.step,
                    "message": first_line(commit.message), "author": commit.author})
        for p in parents:
            children[p] -= 1
            if children[p] == 0:
                heapq.heappush(ready, (newest_first(history.commit(p).time), p))
    width = max((max([c["lane"], *c["parent_lanes"]]) for c in out), default=-1) + 1
    return {"head": head, "branch": repo.current_branch(), "lanes": width, "commits": out}


def newest_first(time: str) -> tuple[int, ...]:
    """A heap key that pops the newest commit time first."""
    # newest first from a min-heap, on the ISO text (sorts as time does)
    return tuple(-ord(ch) for ch in time)


# ---------------------------------------------------------------------------- details


def changes(new: dict[str, Any], old: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Flattened key/value pairs of `new` against `old`: status added / removed / changed
    / same (every key `same` where there is nothing to compare with)."""
    new_flat = flatten(new)
    old_flat = flatten(old) if old is not None else None
    keys = sorted(set(new_flat) | set(old_flat or {}), key=natural_key)
    out = []
    for key in keys:
        entry: dict[str, Any] = {"key": key, "value": new_flat.get(key)}
        if old_flat is None:
            entry["status"] = "same"
        elif key not in old_flat:
            entry["status"] = "added"
        elif key not in new_flat:
            entry["status"], entry["old"] = "removed", old_flat[key]
        else:
            entry["old"] = old_flat[key]
            entry["status"] = "same" if _same(new_flat[key], old_flat[key]) else "changed"
        out.append(entry)
    return out


def commit_detail(repo: Repo, rev: str = "HEAD") -> dict[str, Any]:
    """One commit: id, parents, refs, message, author, time, step, hparams (flattened,
    each with its change against the first parent), metrics, env (flattened), meta,
    frozen layers, and its layer table against the first parent as `DiffResult.to_json`
    gives it, each layer also marked `frozen` (from the statistics it stores; recomputed
    from tensor data only where it stores none, and None when that data is not here)."""
    oid = repo.resolve(rev)
    commit = repo.read_commit(oid)
    parent = None
    if commit.parents:
        try:
            parent = repo.read_commit(commit.parents[0])
        except ObjectNotFoundError:
            parent = None
    layers: dict[str, Any] | None
    try:
        layers = repo.diff(oid).to_json()
    except (PrunedError, ObjectNotFoundError):
        layers = None
    frozen = commit.meta.get("frozen_layers")
    frozen = [f for f in frozen if isinstance(f, str)] if isinstance(frozen, list) else []
    if layers is not None:
        for name, entry in layers["layers"].items():
            entry["frozen"] = _is_frozen(name, set(frozen))
    return {
        "id": oid, "parents": list(commit.parents), "refs": ref_names(repo).get(oid, []),
        "message": commit.message, "author": commit.author, "time": commit.time,
        "step": commit.step,
        "hparams": changes(commit.hparams, parent.hparams if parent else None),
        "metrics": changes(commit.metrics, parent.metrics if parent else None),
        "env": flatten(commit.env), "meta": flatten(commit.meta),
        "frozen_layers": frozen, "diff": layers,
    }


def diff(repo: Repo, a: str, b: str, threshold: float | None = None) -> dict[str, Any]:
    """Two commits: the `vrl diff` layer table from `a` to `b` (None, with `error` set,
    when tensor data it needs is not here), and their hyperparameter and metric changes."""
    old_id, new_id = repo.resolve(a), repo.resolve(b)
    old, new = repo.read_commit(old_id), repo.read_commit(new_id)
    out: dict[str, Any] = {"a": old_id, "b": new_id,
                           "hparams": changes(new.hparams, old.hparams),
                           "metrics": changes(new.metrics, old.metrics)}
    try:
        out["diff"], out["error"] = repo.diff(old_id, new_id, threshold=threshold).to_json(), \
            None
    except (PrunedError, ObjectNotFoundError) as exc:
        out["diff"], out["error"] = None, str(exc)
    return out
