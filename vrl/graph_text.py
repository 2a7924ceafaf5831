"""`vrl log --graph`'s drawing: git's text graph (`*`, `|`, `/`, `\\`, `|\\`, `|/`, `*-.`)
of commits given in display order, and the order itself (pure: no repository, no I/O).

Each commit owns a column while an edge waits for it. On its row it is drawn `*` (an
octopus `*-.`); a merge then fans its extra parents out to the right (`|\\`) or joins a
column already waiting for one (`|/|`), and edges that now wait for the same commit
collapse leftwards into one column (`|/`), so no column ever holds the same commit twice.
Columns are two characters apart.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

Id = TypeVar("Id", bound=Hashable)


@dataclass(frozen=True)
class GraphRow:
    """The drawing for one commit: `before` (a gap under a line that ended, an octopus
    making room to its right), the commit's own line (`commit`, padded so that its text
    lines up), `after` (its merge's edges and the collapses it causes) and `padding` (the
    columns beside any further line of the commit's text)."""

    before: tuple[str, ...]
    commit: str
    after: tuple[str, ...]
    padding: str


def _line(cells: dict[int, str]) -> str:
    if not cells:
        return ""
    out = [" "] * (max(cells) + 1)
    for pos, ch in cells.items():
        out[pos] = ch
    return "".join(out)


def layout(commits: Sequence[tuple[Id, Sequence[Id]]],
           more_below: Collection[Id] = ()) -> list[GraphRow]:
    """One `GraphRow` per (id, parents) in `commits`, which must list every child before
    its parents (see `topo_order`).

    A parent that is not in `commits` ends its edge at the child (a shallow or partial
    history: nothing below to join), unless it is in `more_below` (history that goes on
    past the commits shown, e.g. past `-n`): that edge stays open to the bottom."""
    shown = {oid for oid, _ in commits}
    columns: list[Id] = []
    rows = []
    ended = -1  # the column whose line ended on the row above (a root, or a shallow end)
    for oid, all_parents in commits:
        parents = list(dict.fromkeys(p for p in all_parents if p in shown or p in more_below))
        before = []
        if oid in columns:
            i = columns.index(oid)
        else:  # a new branch head: a new column at the right, as git puts it
            i = len(columns)
            columns.append(oid)
            if i == ended:  # right under a line that ended: a gap, or they read as one
                before.append(_line({2 * j: "|" for j in range(i)}))
        right = range(i + 1, len(columns))
        # A merge's extra parent that a column on its left already waits for is joined
        # there (`|/|`, as git skews such a merge left), one waiting right beside it is
        # joined at once (`|\|`); the others fan out to new columns on its right.
        joins_left = [columns.index(p) for p in parents[1:] if p in columns[:i]]
        fanned = [p for p in parents[1:] if p not in columns[:i]]
        join_right = len(fanned) == 1 and i + 1 < len(columns) and columns[i + 1] == fanned[0]
        if join_right:
            fanned = []
        n = len(fanned)
        # an octopus shifts the columns to its right by 2 per fanned parent: the rows
        # before and the commit line take them part of the way, one character a row
        shift = 2 * (n - 1) if n > 1 else 0
        for r in range(1, shift if right else 0):
            before.append(_line({**{2 * j: "|" for j in range(i + 1)},
                                 **{2 * j + r: "\\" for j in right}}))
        cells = {2 * j: "|" for j in range(i)}
        cells[2 * i] = "*"
        if n > 1:  # git's octopus: `*-.`, `*---.`
            for k in range(1, shift):
                cells[2 * i + k] = "-"
            cells[2 * i + shift] = "."
        for j in right:
            cells[2 * j + shift] = "\\" if n > 1 else "|"
        commit_line = _line(cells)
        after = []
        if len(parents) > 1:  # the merge's edges: `|\`, `|\ \`, `|/|`, `|\|`
            fan = {2 * j: "|" for j in range(i + 1)}
            for j in right:
                fan[2 * j + 2 * n - 1 if n else 2 * j] = "\\" if n else "|"
            for k in range(1, n + 1):
                fan[2 * i + 2 * k - 1] = "\\"
            if join_right:
                fan[2 * i + 1] = "\\"
            for t in joins_left:
                fan[2 * i - 1] = "/"
                for under in range(2 * t + 1, 2 * i - 1, 2):
                    fan.setdefault(under, "_")
            after.append(_line(fan))
        # (waiting for, position) of each column once this commit's edges are drawn
        expanded: list[tuple[Id, int]] = [(columns[j], 2 * j) for j in range(i)]
        expanded += [(p, 2 * (i + k)) for k, p in enumerate(parents[:1] + fanned)]
        # a commit without parents here leaves a gap that the columns to its right close
        expanded += [(columns[j], 2 * (j + n)) for j in right]
        index: dict[Id, int] = {}  # each waited-for commit's column: its leftmost edge's
        for want, _ in expanded:
            index.setdefault(want, len(index))
        merged = list(index)
        collapse: dict[int, str] = {}
        for want, pos in expanded:
            target = 2 * index[want]
            if pos == target:
                collapse[pos] = "|"
            else:  # towards the left: `/`, over further columns `_`
                collapse[pos - 1] = "/"
                for under in range(target + 1, pos - 1, 2):
                    collapse.setdefault(under, "_")
        if any(ch != "|" for ch in collapse.values()):
            after.append(_line(collapse))
        ended = i if not parents and i == len(merged) else -1
        columns = merged
        padding = _line({2 * j: "|" for j in range(len(columns))})
        width = max(len(line) + 1 for line in (commit_line, *before, *after, padding))
        width += width % 2  # whole columns
        rows.append(GraphRow(tuple(before), commit_line.ljust(width), tuple(after),
                             padding.ljust(width)))
    return rows


def draw(commits: Sequence[tuple[Id, Sequence[Id]]], texts: Sequence[Sequence[str]],
         more_below: Collection[Id] = ()) -> list[str]:
    """The graph beside each commit's lines of text (`texts[k]`: the k-th commit's, its
    first on the commit's row), as `git log --graph` writes them: a merge's fan-out and a
    collapse take the rows of the commit's next lines, or rows of their own when it has
    none (`--oneline`). Trailing blanks are trimmed."""
    out: list[str] = []
    for row, lines in zip(layout(commits, more_below), texts, strict=True):
        out.extend(row.before)
        lines = list(lines) or [""]
        out.append(row.commit + lines[0])
        graph = list(row.after)
        for text in lines[1:]:
            out.append((graph.pop(0).ljust(len(row.padding)) if graph else row.padding)
                       + text)
        out.extend(graph)
    return [line.rstrip() for line in out]


def topo_order(heads: Iterable[Id], parents: Callable[[Id], Sequence[Id]],
               time: Callable[[Id], str]) -> list[Id]:
    """Every commit reachable from `heads` through `parents` (which lists only the
    parents that exist), each after all of its children; among those ready, the newest
    by `time` (ISO 8601 text, compared as text) first, then the first reached."""
    order: dict[Id, int] = {}
    children: dict[Id, int] = {}
    stack = list(heads)
    stack.reverse()
    while stack:
        oid = stack.pop()
        if oid in order:
            continue
        order[oid] = len(order)
        children.setdefault(oid, 0)
        for p in parents(oid):
            children[p] = children.get(p, 0) + 1
            if p not in order:
                stack.append(p)
    # newest first: rank the times once instead of negating text
    rank = {t: r for r, t in enumerate(sorted({time(oid) for oid in order}, reverse=True))}
    ready = [(rank[time(oid)], order[oid], oid) for oid in order if children[oid] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, _, oid = heapq.heappop(ready)
        out.append(oid)
        for p in parents(oid):
            children[p] -= 1
            if children[p] == 0:
                heapq.heappush(ready, (rank[time(p)], order[p], p))
    return out
