"""Where runs came from: the run a branch forked from, the hyperparameters a commit changed,
and where two runs last shared a snapshot (what `vrl log`, `show` and `diff` print). Plain
data, as vrl/views.py, on the same runs and branch points."""

from __future__ import annotations

import heapq
from typing import Any

from vrl.history import History
from vrl.objects import Commit, ObjectId
from vrl.repo import Repo
from vrl.views import branch_points, changes, newest_first, ref_went_on, select_runs


def setting_changes(new: dict[str, Any], old: dict[str, Any]) -> list[dict[str, Any]]:
    """The flattened keys whose values differ from `old` to `new` ({key, value, old,
    status: added / removed / changed}); none where either side records nothing (a
    commit made without hyperparameters or environment leaves them unknown, not unset)."""
    if not new or not old or (new == old and _same_types(new, old)):  # most commits
        return []
    return [entry for entry in changes(new, old) if entry["status"] != "same"]


def _same_types(a: Any, b: Any) -> bool:
    """Whether two equal values (`a == b`) hold the same types throughout, so that they
    are `_same` too (1, 1.0 and True are equal in Python) - without JSON text, which cost
    `vrl log` more than reading the commits."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return all(_same_types(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    return True


def hparam_changes(repo: Repo, oid: ObjectId) -> list[dict[str, Any]]:
    """The hyperparameters commit `oid` changed against its first parent (see
    `setting_changes`; none for a root commit or a parent beyond a shallow history)."""
    history = History.of(repo)
    commit = history.commit(oid)
    if not commit.parents or not history.has(commit.parents[0]):
        return []
    return setting_changes(commit.hparams, history.commit(commit.parents[0]).hparams)


def forks(repo: Repo) -> dict[ObjectId, dict[str, Any]]:
    """The first commit of each run's own (after its branch point), with where it forked:
    {id: {"run": the run it starts, "from": the run it forked from, "id": the commit it
    forked at, "step": that commit's step}}. The runs and branch points are those of
    `runs()` (every local branch, and remote-tracking branches no local one shows), less
    the branches made at a snapshot of a run that then went on (a bookmark, or a fork
    not trained yet): no run forked from them."""
    history = History.of(repo)
    chosen = select_runs(repo, None, False)
    lines = {name: history.line(oid) for name, _, oid in chosen}
    places = {name: {oid: i for i, oid in enumerate(line)} for name, line in lines.items()}
    went_on = {name: ref_went_on(repo, ref, lines[name]) if ref is not None else None
               for name, ref, _ in chosen}
    runs = [(name, oid) for name, _, oid in chosen
            if not any(head != oid and oid in places[other] and
                       went_on[other] is not None and
                       went_on[other](places[other][oid])  # type: ignore[misc]
                       for other, _, head in chosen)]
    points = branch_points(history, [oid for _, oid in runs], [name for name, _ in runs],
                            [went_on[name] for name, _ in runs])
    out: dict[ObjectId, dict[str, Any]] = {}
    for (name, _), point in zip(runs, points, strict=True):
        if point is not None:
            out.setdefault(lines[name][point["index"] + 1],
                           {"run": name, "from": point["run"], "id": point["id"],
                            "step": point["step"]})
    return out




def common_ancestor(repo: Repo, a: ObjectId, b: ObjectId) -> ObjectId | None:
    """The newest commit (by time) that both `a` and `b` descend from or are, as git's
    merge base; None for unrelated histories."""

    history = History.of(repo)
    ours = set(history.reachable([a]))
    seen = {b}
    ready = [(newest_first(history.commit(b).time), b)] if history.has(b) else []
    while ready:
        _, oid = heapq.heappop(ready)
        if oid in ours:
            return oid
        for p in history.commit(oid).parents:
            if p not in seen and history.has(p):
                seen.add(p)
                heapq.heappush(ready, (newest_first(history.commit(p).time), p))
    return None


def merge_lines(c: Commit) -> list[str]:
    """A merge commit's parents (with the revisions merged), base and recipe, one line each
    as `vrl show` and the UI's commit page list them; none for a commit with one parent."""
    if len(c.parents) < 2:
        return []
    recipe: dict[str, Any] = c.meta.get("merge") or {}
    if not isinstance(recipe, dict):
        recipe = {}
    revs = recipe.get("revs") if isinstance(recipe.get("revs"), list) else []
    lines = ["Merge:  " + " ".join(p[:12] for p in c.parents)]
    for i, p in enumerate(c.parents):
        name = f" ({revs[i]})" if i < len(revs) else ""
        lines.append(f"  parent {i + 1}: {p[:12]}{name}")
    base = recipe.get("base")
    lines.append(f"  base:     {base[:12] if isinstance(base, str) else 'none'}")
    for key, label in (("strategy", "strategy"), ("optimizer", "optimizer"),
                       ("hparams_differ", "hparams differing")):
        value = recipe.get(key)
        if isinstance(value, list):
            value = ", ".join(map(str, value)) or "none"
        if value is not None:
            lines.append(f"  {label}: {value}")
    counts = recipe.get("tensors")
    if isinstance(counts, dict):
        lines.append("  tensors:  " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                for k, v in counts.items()))
    return lines
