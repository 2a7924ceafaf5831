"""Where a run left another: the branch points of runs, from the commit graph and, where
kept, the reflogs of their refs. Used by the views (a run's fork point, the runs
table) and by `vrl/lineage.py` (what `log`, `show` and `diff` say about forks)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vrl.history import History, seconds
from vrl.objects import ObjectId
from vrl.repo import Repo


def branch_points(history: History, heads: list[ObjectId], names: list[str],
                   went_on: Sequence[Callable[[int], bool] | None] | None = None
                   ) -> list[dict[str, Any] | None]:
    """Where each run left the run it was branched from.

    Two lines share a prefix; after their last common commit both may continue. The one
    whose next snapshot came later is the branch (the other was there first); a line
    that ends at a commit of another line continued nothing. The newest such point wins
    (a branch of a branch points at the branch it came from, not at the trunk); of runs
    that left one point, the one that went on from it first was there first (the trunk a
    third run left too). `went_on[r](i)`, where a run's reflog tells (see `ref_went_on`):
    whether run r went on from its snapshot at i rather than leaving another run there;
    it decides before the times do."""
    lines = [history.line(h) for h in heads]
    positions = [{oid: i for i, oid in enumerate(line)} for line in lines]
    out: list[dict[str, Any] | None] = []
    for r, line in enumerate(lines):
        best: tuple[int, str, int] | None = None  # (index in line, its next time, run)
        for s, other in enumerate(positions):
            if s == r or lines[s][-1] == line[-1]:
                continue
            i = len(line) - 1
            while i >= 0 and line[i] not in other:
                i -= 1
            if i < 0 or i == len(line) - 1:  # unrelated, or wholly inside the other
                continue
            j = other[line[i]]
            theirs = ""  # (a line that ends there continued nothing: it comes first)
            if j + 1 < len(lines[s]):  # both continue: the later one branched
                mine = history.commit(line[i + 1]).time
                theirs = history.commit(lines[s][j + 1]).time
                ours, other_on = (went_on[r], went_on[s]) if went_on else (None, None)
                if ours is not None and other_on is not None and ours(i) != other_on(j):
                    if ours(i):
                        continue  # r's ref was there and went on: s left it
                elif (mine, names[r]) < (theirs, names[s]):
                    continue
            if best is None or i > best[0] or (i == best[0] and theirs < best[1]):
                best = (i, theirs, s)
        if best is None:
            out.append(None)
        else:
            i, _, s = best
            oid = line[i]
            commit = history.commit(oid)
            out.append({"id": oid, "run": names[s], "step": commit.step, "index": i,
                        "seconds": seconds(commit.time)})
    return out


def ref_went_on(repo: Repo, ref: str, line: list[ObjectId]) -> Callable[[int], bool] | None:
    """Whether the run of `ref` (its first-parent `line`) went on from its snapshot at
    index i, rather than forking there (as a function of i).

    The graph alone cannot tell a run that forked from another's last snapshot from one
    that went on past a branch made at its snapshot. The run's reflog can: a run whose
    ref was made before that snapshot, or by committing it, went on; one made there or
    later (as `vrl train --from` makes a fork, or a clone) forked there; so did one moved
    onto this line (a reset, a PBT exploit): from the reflog's entry with which it came
    onto the line. None where the reflog does not tell (none kept): the times decide."""
    places = {oid: k for k, oid in enumerate(line)}
    arrived = None  # the entry with which the ref came onto this line: made, or moved here
    for entry in repo.refs.reflog(ref):  # newest first
        if entry.new not in places:
            break
        arrived = entry
    if arrived is None:
        return None
    born = places[arrived.new]
    by_commit = arrived.reason.startswith("commit")
    return lambda i: born < i or (born == i and by_commit)
