"""Runs grouped by hyperparameters (`vrl compare --group-by`): per group, how many runs,
their steps and each metric's last and best values as mean +- std (a sweep's seeds pooled).
Plain data, as vrl/views.py."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from vrl.repo import Repo
from vrl.views import (
    ViewError,
    compare,
    lower_is_better,
    natural_key,
    number,
)

SWEEP_KEY = "sweep"
"""`compare_groups` key: a sweep's configuration, the branch name of a `vrl sweep` trial
without its seed (`sweep/lr/learning_rate=1e-4-s2` -> `lr/learning_rate=1e-4`)."""
_SWEEP_RUN = re.compile(r"^(?:[^/]+/)?sweep/(?P<config>[^/]+/.+)-s\d+$")


def sweep_config(name: str) -> str | None:
    """The configuration of a `vrl sweep` trial's branch (also a remote-tracking one), or
    None for a run that is no trial."""
    match = _SWEEP_RUN.match(name)
    return match.group("config") if match else None


def stats(values: Sequence[float]) -> dict[str, Any]:
    """{n, mean, std, min, max} of the finite values: std is the sample standard deviation
    (n - 1, as seed studies report it), None below two values; mean, min and max are None
    without values."""
    finite = [float(v) for v in values if math.isfinite(v)]
    n = len(finite)
    if not n:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    mean = math.fsum(finite) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else None
    return {"n": n, "mean": mean, "std": std, "min": min(finite), "max": max(finite)}


def compare_groups(repo: Repo, group_by: Sequence[str], revs: Sequence[str] | None = None,
                   metrics: Sequence[str] | None = None, sort: str | None = None,
                   all_tags: bool = False) -> dict[str, Any]:
    """The compare table of groups of runs: runs with the same values of the `group_by`
    keys (flattened hyperparameters, or `sweep`: a sweep trial's configuration, its seed
    left out) form one group.

    Returns {"group_by": keys, "metrics": names, "groups": [...]}; each group is {"key":
    {key: value (None where a run has none)}, "n": runs, "runs": [names], "steps": stats
    of the runs' last steps, "metrics": {name: {"last": stats, "best": stats}}} with the
    `stats()` of the runs' last and best values of each metric. Groups are in the order
    of their key values, or of `sort`: a metric's mean last value (best first) or a
    group-by key, `:asc`/`:desc` to choose.
    """
    keys = list(dict.fromkeys(k.strip() for k in group_by if k.strip()))
    if not keys:
        raise ViewError("give at least one key to group by")
    data = compare(repo, revs, metrics=metrics, all_tags=all_tags, all_params=True)
    rows = data["rows"]
    known = {k for row in rows for k in row["hparams"]}
    for key in keys:
        if key != SWEEP_KEY and key not in known and rows:
            differing = compare(repo, revs, metrics=metrics, all_tags=all_tags)["params"]
            raise ViewError(f"cannot group by {key!r}: no run has that hyperparameter; "
                            f"hyperparameters that differ: {', '.join(differing) or '(none)'}"
                            f" (or {SWEEP_KEY}: a sweep's configurations)")
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = {k: sweep_config(row["name"]) if k == SWEEP_KEY else row["hparams"].get(k)
               for k in keys}
        if SWEEP_KEY in key and key[SWEEP_KEY] is None:
            key[SWEEP_KEY] = row["name"]  # a run outside any sweep is a group of its own
        group = groups.setdefault(json.dumps(key, sort_keys=True), {"key": key, "rows": []})
        group["rows"].append(row)
    out = []
    for group in groups.values():
        members = group.pop("rows")
        summary: dict[str, Any] = {}
        for name in data["metrics"]:
            held = [row["metrics"][name] for row in members if name in row["metrics"]]
            summary[name] = {part: stats([v for v in (number(h[part]) for h in held)
                                          if v is not None])
                             for part in ("last", "best")}
        out.append({**group, "n": len(members), "runs": [row["name"] for row in members],
                    "steps": stats([row["step"] for row in members
                                    if isinstance(row["step"], (int, float))]),
                    "metrics": summary})
    out.sort(key=lambda g: [_value_order(g["key"][k]) for k in keys])
    if sort:
        out = _sorted_groups(out, sort, keys)
    return {"group_by": keys, "metrics": data["metrics"], "groups": out}


def _value_order(value: Any) -> tuple[int, Any]:
    """Numbers by value, then everything else by its JSON text, then missing values."""
    if value is None:
        return (2, "")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, natural_key(value) if isinstance(value, str) else
            json.dumps(value, sort_keys=True))


def _sorted_groups(groups: list[dict[str, Any]], sort: str, keys: list[str]
                   ) -> list[dict[str, Any]]:
    key, direction = sort, None
    if sort.rpartition(":")[2] in ("asc", "desc") and sort not in keys and \
            not any(sort in g["metrics"] for g in groups):
        key, _, direction = sort.rpartition(":")
    if key in keys:
        ordered = sorted(groups, key=lambda g: _value_order(g["key"][key]))
        return ordered[::-1] if direction == "desc" else ordered
    if not groups or key not in groups[0]["metrics"]:
        raise ViewError(f"cannot sort groups by {key!r}: it is no metric or group-by key "
                        "of these runs")
    if direction is None:
        direction = "asc" if lower_is_better(key) else "desc"
    present = [g for g in groups if g["metrics"][key]["last"]["mean"] is not None]
    missing = [g for g in groups if g["metrics"][key]["last"]["mean"] is None]
    present.sort(key=lambda g: g["metrics"][key]["last"]["mean"], reverse=direction == "desc")
    return present + missing
