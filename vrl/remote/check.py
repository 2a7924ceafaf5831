"""Checking a remote for damage (`vrl fsck --remote`) and repairing it (`vrl push --repair`).

A remote promises that every commit a ref points to is complete there: its ancestors,
manifests and tensors, each hashing to its id. `check_remote` walks everything its refs
reach and reads every object back the way a fetch would (a packed copy first, then a
loose copy of the same id), hashing each; an object no good copy of which is there is
missing or damaged. Big objects are hashed in ranges, so a check holds at most a few
ranges per job in memory, however big the tensors.

`repair_remote` re-sends each such object from this repository as a loose object,
hashed here first. A loose copy is what every reader falls back to when the packed one
is damaged, so a damaged pack needs no rewrite (and its good objects stay served). A
ref's history is walked on through the local copy of a damaged commit or manifest, so
one repair finds and fixes everything behind it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import blake3

from vrl.errors import CorruptObjectError, VrlError
from vrl.objects import HEADER_SIZE, Commit, ObjectId, parse_header
from vrl.refs import short_ref
from vrl.remote.base import KeyMissing, RemoteStore, object_key, redact
from vrl.remote.common import (
    DEFAULT_JOBS,
    NoProgress,
    Progress,
    _pool_map,
    verified_raw,
    verify_file,
)
from vrl.remote.fetching import (
    FETCH_BATCH,
    MAX_COMMIT_BYTES,
    MAX_MANIFEST_BYTES,
    _chunks,
    parse_remote,
)
from vrl.remote.packs import PackReader, RemotePacks, cache_dir
from vrl.repo import Repo

STREAM_ABOVE = 16 << 20  # a loose object bigger than this is hashed a range at a time
RANGE = 16 << 20


@dataclass
class RemoteProblem:
    """One object a ref on the remote needs that no good copy of is there."""

    oid: ObjectId
    kind: str  # commit, manifest or tensor (as the object naming it says)
    problem: str  # "missing" or "damaged"
    detail: str  # why, in a few words

    def message(self, remote: str) -> str:
        return f"{self.kind} {self.oid[:12]} on {remote} is {self.problem}" + \
            (f" ({self.detail})" if self.detail else "")


@dataclass
class RemoteReport:
    """What `check_remote` found: `ok` when every object the refs need is there intact."""

    remote: str
    refs: int = 0
    objects: int = 0  # objects checked
    problems: list[RemoteProblem] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # history no copy could be walked

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"remote": self.remote, "ok": self.ok, "refs": self.refs,
                "objects": self.objects, "unchecked": self.unchecked,
                "problems": [{"id": p.oid, "kind": p.kind, "problem": p.problem,
                              "message": p.message(self.remote)} for p in self.problems]}


class _Checker:
    def __init__(self, repo: Repo, store: RemoteStore, jobs: int) -> None:
        self.repo = repo
        self.store = store
        self.jobs = jobs
        self.where = redact(store.url)
        self.packs = RemotePacks(store, cache_dir(repo.vrl_dir), jobs)
        self.reader = PackReader(store, self.packs, jobs)
        self.sizes: dict[str, int] = {}  # loose key -> size, from one listing

    # ------------------------------------------------------------------ one object
    def read(self, oid: ObjectId, kind: str, limit: int | None = None
             ) -> tuple[bytes | None, str]:
        """(a good copy's bytes, "") - for a big tensor (None, ""): hashed in ranges,
        not kept - or (None, why there is no good copy): "missing", or the damage."""
        why = ""
        where = self.packs.where(oid)
        if where is not None:
            key, offset, length = where
            if limit is not None and length > limit:
                why = f"its packed copy claims {length} bytes, over the {limit} a {kind} " \
                      "may have"
            elif length > STREAM_ABOVE and kind == "tensor":
                why = self._hash_ranges(oid, key, offset, length)
                if not why:
                    return None, ""
            else:
                try:
                    raw = self.reader.get(oid)
                    why = _problem(oid, raw)
                    if not why:
                        return raw, ""
                except KeyMissing:
                    why = "its pack vanished while being read"
                except CorruptObjectError as exc:
                    why = str(exc)
            why = f"packed copy: {why}"
        key = object_key(oid)
        size = self.sizes.get(key)
        if size is None and not self.store.exists(key):  # (a repository's own packs)
            return None, why or "missing"
        if size is not None and limit is not None and size > limit:
            return None, f"it is {size} bytes, over the {limit} a {kind} may have"
        if size is not None and size > STREAM_ABOVE and kind == "tensor":
            problem = self._hash_ranges(oid, key, 0, size)
            return None, problem
        try:
            raw = self.store.get(key)
        except KeyMissing:
            return None, why or "missing"
        problem = _problem(oid, raw)
        return (None, problem) if problem else (raw, "")

    def _hash_ranges(self, oid: ObjectId, key: str, offset: int, length: int) -> str:
        """Why the `length` bytes at `offset` of `key` are not `oid` ("" if they are),
        read and hashed a range at a time."""
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        head = b""
        for start in range(offset, offset + length, RANGE):
            end = min(offset + length, start + RANGE)
            data = self.store.get_range(key, start, end)
            if len(data) != end - start:
                return "it is shorter than listed"
            head = head or data[:HEADER_SIZE]
            hasher.update(data)
        try:
            _, payload = parse_header(head)
        except CorruptObjectError:
            return "its header is not a vrl object header"
        if payload != length - HEADER_SIZE:
            return "it is truncated or too long"
        return "" if hasher.hexdigest() == oid else "its bytes do not match its id"

    # ------------------------------------------------------------------ the walk
    def check(self, report: RemoteReport) -> None:
        refs = self.store.list_refs()
        report.refs = len(refs)
        self.sizes = self.store.list_sizes("objects/")
        self.packs.load()
        named = {oid: f"ref {short_ref(ref)}" for ref, oid in refs.items()}
        commits: dict[ObjectId, Commit] = {}
        wave = list(dict.fromkeys(refs.values()))
        while wave:
            nxt: dict[ObjectId, None] = {}
            for oid, commit in self._metadata(wave, "commit", MAX_COMMIT_BYTES, report,
                                              named):
                commits[oid] = commit
                for parent in commit.parents:
                    if parent not in named:
                        named[parent] = f"parent of {oid[:12]}"
                        nxt[parent] = None
            wave = list(nxt)
        manifests = list(dict.fromkeys(c.manifest for c in commits.values()))
        for oid, commit in commits.items():
            named.setdefault(commit.manifest, f"manifest of {oid[:12]}")
        tensors: dict[ObjectId, int] = {}
        for _, manifest in self._metadata(manifests, "manifest", MAX_MANIFEST_BYTES, report,
                                          named):
            for entry in manifest.data_entries().values():
                tensors.setdefault(entry.id, entry.nbytes)
        report.objects += len(tensors)
        for chunk in _chunks(list(tensors), self.packs, FETCH_BATCH):
            small = [o for o in chunk if (w := self.packs.where(o)) and w[2] <= STREAM_ABOVE]
            self.reader.prefetch(small, {})
            for oid, (_, why) in zip(chunk, _pool_map(lambda o: self.read(o, "tensor"),
                                                      chunk, self.jobs), strict=True):
                if why:
                    report.problems.append(_problem_of(oid, "tensor", why))

    def _metadata(self, ids: list[ObjectId], kind: str, limit: int, report: RemoteReport,
                  named: dict[ObjectId, str]) -> list[tuple[ObjectId, Any]]:
        """Commits or manifests, parsed: the remote's copy where it is good, else this
        repository's (hashed), so the walk goes on behind a damaged one; every problem
        of the remote's copies is recorded."""
        report.objects += len(ids)
        out = []
        for oid, (raw, why) in zip(ids, _pool_map(lambda o: self.read(o, kind, limit), ids,
                                                  self.jobs), strict=True):
            if why:
                report.problems.append(_problem_of(oid, kind, why))
            parsed, bad = self._parse(oid, raw, kind)
            if bad:  # hashes right, yet no valid `kind`
                report.problems.append(RemoteProblem(oid, kind, "damaged", f"its hash is "
                                                     f"right but it is not a valid {kind}: "
                                                     f"{bad}"[:200]))
            if parsed is None and self.repo.objects.has(oid):
                with contextlib.suppress(VrlError):
                    parsed, _ = self._parse(oid, verified_raw(self.repo, oid, kind, ""), kind)
            if parsed is None:
                report.unchecked.append(f"what {kind} {oid[:12]} ({named.get(oid, kind)}) "
                                        "leads to: no good copy here either")
            else:
                out.append((oid, parsed))
        return out

    def _parse(self, oid: ObjectId, raw: bytes | None, kind: str) -> tuple[Any, str]:
        """(the parsed commit or manifest, "") or (None, why it is none: "" for no bytes),
        within the memory a fetch allows (`parse_remote`)."""
        if raw is None:
            return None, ""
        try:
            got = parse_header(raw)[0]
            if got != kind:
                return None, f"it is a {got}"
            return parse_remote(oid, raw, kind, self.where), ""
        except VrlError as exc:
            return None, str(exc)


def _problem(oid: ObjectId, raw: bytes) -> str:
    """Why `raw` is not a good copy of `oid` ("" when it is)."""
    try:
        _, size = parse_header(raw)
    except CorruptObjectError:
        return "its header is not a vrl object header"
    if len(raw) != HEADER_SIZE + size:
        return "it is truncated or too long"
    threads = blake3.blake3.AUTO if len(raw) > (1 << 22) else 1
    if blake3.blake3(raw, max_threads=threads).hexdigest() != oid:
        return "its bytes do not match its id"
    return ""


def _problem_of(oid: ObjectId, kind: str, why: str) -> RemoteProblem:
    if why == "missing":
        return RemoteProblem(oid, kind, "missing", "")
    return RemoteProblem(oid, kind, "damaged", why[:200])


def check_remote(repo: Repo, store: RemoteStore, name: str = "", *,
                 jobs: int = DEFAULT_JOBS) -> RemoteReport:
    """Every object the remote's refs reach, read back and hashed: which are missing or
    damaged there (a damaged ref raises RemoteError)."""
    report = RemoteReport(name or redact(store.url))
    _Checker(repo, store, jobs).check(report)
    return report


@dataclass
class RepairResult:
    """What `repair_remote` re-sent, and what it could not (absent or damaged here)."""

    report: RemoteReport
    sent: list[RemoteProblem] = field(default_factory=list)
    unrepaired: list[RemoteProblem] = field(default_factory=list)


def repair_remote(repo: Repo, store: RemoteStore, name: str = "", *,
                  jobs: int = DEFAULT_JOBS, progress: Progress | None = None) -> RepairResult:
    """Check the remote, then re-send every missing or damaged object from this
    repository (each hashed here first) as a loose object. Objects this repository lacks
    or holds damaged are left in `unrepaired`."""
    progress = progress or NoProgress()
    report = check_remote(repo, store, name, jobs=jobs)
    result = RepairResult(report)
    where = redact(store.url)
    todo = []
    for problem in report.problems:
        (todo if repo.objects.has(problem.oid) else result.unrepaired).append(problem)
    progress.begin(f"repair {where}", 0, len(todo))

    def send(problem: RemoteProblem) -> bool:
        oid = problem.oid
        try:
            path = repo.objects.loose_path(oid)
            if path is not None:
                verify_file(oid, path, problem.kind, where)
                store.put_file(object_key(oid), path)
            else:
                store.put(object_key(oid), verified_raw(repo, oid, problem.kind, where))
        except CorruptObjectError:
            return False
        progress.advance(0)
        return True

    try:
        for problem, ok in zip(todo, _pool_map(send, todo, jobs), strict=True):
            (result.sent if ok else result.unrepaired).append(problem)
    finally:
        progress.end()
    return result
