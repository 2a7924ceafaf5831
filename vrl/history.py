"""A repository's commits as the views read them: each parsed once, without the per-layer
statistics that make up most of a commit's bytes unless asked for, and first-parent lines
walked once (vrl/views.py builds runs, curves, the heatmap and the graph on this)."""

from __future__ import annotations

import json
import math
import re
import weakref
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from vrl.errors import ObjectNotFoundError, VrlError
from vrl.objects import Commit, ObjectId
from vrl.refs import short_ref

if TYPE_CHECKING:
    from vrl.repo import Repo


# The tail of a canonical commit: its keys are sorted, so the statistics (most of its
# bytes: a dict per layer) come last but for the step and the time.
_TAIL = re.compile(rb',"step":(?:-?[0-9]+|null),"time":"[^"\\]*"\}\Z')
_STATS_KEY = b'],"stats":'  # after the parents list
_FIELDS = tuple(f',"{name}":'.encode() for name in ("author", "env", "format", "hparams",
                                                      "manifest", "message", "meta",
                                                      "metrics", "parents"))


def seconds(time: str) -> float | None:
    """Seconds since the epoch of a commit's ISO 8601 UTC time (None if unreadable)."""
    try:
        return datetime.fromisoformat(time.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def split_stats(payload: bytes) -> tuple[bytes, bytes] | None:
    """(the commit without its statistics, the statistics' JSON) of a canonical commit
    payload, or None where its bytes are not laid out that way.

    Parsing a commit without its statistics is several times faster, and only the
    heatmap and a commit's details need them. The cut is taken at the last `],"stats":`
    before the tail: a match inside a nested value leaves brackets unclosed (the tail
    closes one level), so a commit the cut misreads is never valid JSON - the caller
    then parses it whole, as it does bytes that are not canonical.
    """
    tail = _TAIL.search(payload)
    if tail is None:
        return None
    key = payload.rfind(_STATS_KEY, 0, tail.start())
    if key < 0:
        return None
    start = key + len(_STATS_KEY)
    stats = payload[start:tail.start()]
    # A commit's field after its statistics would be cut away with them: never in a
    # canonical commit (sorted keys), so such bytes (even a layer so named) are read whole
    if any(field in stats for field in _FIELDS):
        return None
    return payload[:start] + b"{}" + payload[tail.start():], stats


class History:
    """Commits as the views read them: each object read and parsed once, without its
    layer statistics (`layers` reads those for the heatmap); first-parent lines walked
    once. Kept per open repository (commits never change), so a long-lived server that
    holds its `Repo` reads each commit once in all."""

    _by_repo: weakref.WeakKeyDictionary[Repo, History] = weakref.WeakKeyDictionary()

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self._commits: dict[ObjectId, Commit] = {}
        self._layers: dict[tuple[ObjectId, str], dict[str, tuple[float | None, bool]]] = {}
        self._lines: dict[ObjectId, list[ObjectId]] = {}
        # {metrics asked for: {commit: (last, best) up to it}}, see _metric_summary
        self.summaries: dict[frozenset[str] | None, dict[ObjectId, tuple[dict, dict]]] = {}

    @classmethod
    def of(cls, repo: Repo) -> History:
        history = cls._by_repo.get(repo)
        if history is None:
            history = cls._by_repo[repo] = cls(repo)
        return history

    def _payload(self, oid: ObjectId) -> bytes | None:
        try:
            kind, payload = self.repo.objects.read(oid)
        except VrlError:  # missing (a lazy fetch), corrupt: the full read says why
            return None
        return payload if kind == "commit" else None

    def commit(self, oid: ObjectId) -> Commit:
        """The commit `oid` (its `stats` empty: see `layers`)."""
        commit = self._commits.get(oid)
        if commit is None:
            payload = self._payload(oid)
            parts = split_stats(payload) if payload is not None else None
            try:
                commit = Commit.from_bytes(parts[0]) if parts else None
            except VrlError:
                commit = None
            if commit is None:  # not canonical, or not readable here: the full path
                full = self.repo.read_commit(oid)
                commit = Commit(**{**full.__dict__, "stats": {}})
            self._commits[oid] = commit
        return commit

    def remember(self, commits: Iterable[tuple[ObjectId, Commit]]) -> None:
        """Commits the caller has read already (`vrl log`'s), so that they are not read
        and parsed again; kept without their statistics, as `commit` keeps them."""
        for oid, commit in commits:
            if oid not in self._commits:
                self._commits[oid] = commit if not commit.stats else \
                    Commit(**{**commit.__dict__, "stats": {}})

    def stats(self, oid: ObjectId) -> dict[str, Any]:
        """The commit's stored statistics (parsed on each call: they are large)."""
        payload = self._payload(oid)
        parts = split_stats(payload) if payload is not None else None
        if parts is not None:
            try:
                stats = json.loads(parts[1])
            except (ValueError, RecursionError):
                stats = None
            if isinstance(stats, dict):
                return stats
        return self.repo.read_commit(oid).stats

    def layers(self, oid: ObjectId, prefix: str = "") -> dict[str, tuple[float | None, bool]]:
        """{layer: (relative change against the first parent or None, material)} of the
        layers whose names start with `prefix`, as the commit stores them ({} where it
        stores none against its first parent)."""
        key = (oid, prefix)
        if key not in self._layers:
            commit = self.commit(oid)
            stats = self.stats(oid)
            out: dict[str, tuple[float | None, bool]] = {}
            layers = stats.get("layers")
            parent = commit.parents[0] if commit.parents else None
            if isinstance(layers, dict) and stats.get("parent") == parent:
                isfinite = math.isfinite
                for name, entry in layers.items():
                    # the hot loop (layers x commits): type tests, not isinstance
                    if entry.__class__ is not dict or not name.startswith(prefix):
                        continue
                    rel = entry.get("rel")
                    cls = rel.__class__
                    ok = (cls is float and isfinite(rel)) or cls is int
                    out[name] = (rel if ok else None, entry.get("material") is True)
            self._layers[key] = out
        return self._layers[key]

    def has(self, oid: ObjectId) -> bool:
        try:
            self.commit(oid)
        except ObjectNotFoundError:  # beyond a shallow history
            return False
        return True

    def line(self, head: ObjectId) -> list[ObjectId]:
        """The first-parent line ending at `head`, oldest first."""
        if head not in self._lines:
            out = [head]
            parents = self.commit(head).parents
            while parents and self.has(parents[0]):
                out.append(parents[0])
                parents = self.commit(parents[0]).parents
            out.reverse()
            self._lines[head] = out
        return self._lines[head]

    def reachable(self, heads: Iterable[ObjectId]) -> list[ObjectId]:
        """Every commit reachable from `heads` (all parents), in no particular order."""
        seen: set[ObjectId] = set()
        stack = [h for h in heads if self.has(h)]
        out = []
        while stack:
            oid = stack.pop()
            if oid in seen:
                continue
            seen.add(oid)
            out.append(oid)
            stack.extend(p for p in self.commit(oid).parents if p not in seen and self.has(p))
        return out


def ref_names(repo: Repo) -> dict[ObjectId, list[str]]:
    """Commit id -> the short names of the refs at it (`main`, `tag: best`, `origin/exp`)."""
    out: dict[ObjectId, list[str]] = {}
    for ref, oid in repo.refs.list().items():
        name = short_ref(ref)
        out.setdefault(oid, []).append(f"tag: {name}" if ref.startswith("refs/tags/")
                                       else name)
    return out


def refs_token(repo: Repo) -> str:
    """A short digest of every ref and HEAD: it changes exactly when one moves (a new
    commit, branch or tag), so a viewer can poll it cheaply to know when to refresh."""
    import hashlib

    refs = repo.refs.list()
    text = json.dumps([repo.refs.read_raw("HEAD"), sorted(refs.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]
