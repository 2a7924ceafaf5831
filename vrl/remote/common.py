"""What push, fetch and clone share (the design: vrl.remote.transfer): the results and
progress they report, the threads they fan out on, walks of the history, and the
checks that an object moved is what its id says (what a push sends, hashed first;
what a fetch downloads, verified before it is written)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import blake3

from vrl.errors import CorruptObjectError, VrlError
from vrl.objects import HEADER_SIZE, ObjectId, parse_header
from vrl.remote.base import (
    KeyMissing,
    RemoteStore,
    redact,
)
from vrl.remote.errors import RemoteObjectMissingError
from vrl.remote.packs import PackReader, RemotePacks, cache_dir
from vrl.repo import Repo

DEFAULT_JOBS = 8


class Progress(Protocol):
    """What transfers report to (the CLI passes a tqdm bar; the library default is silent)."""

    def begin(self, label: str, total_bytes: int, total_objects: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def end(self) -> None: ...


class NoProgress:
    def begin(self, label: str, total_bytes: int, total_objects: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class RefUpdate:
    """One ref a transfer looked at: `status` is new, fast-forward, forced or up-to-date."""

    ref: str
    old: ObjectId | None
    new: ObjectId | None
    status: str


@dataclass
class TransferResult:
    """What moved: objects per kind and bytes, plus the refs touched."""

    updates: list[RefUpdate] = field(default_factory=list)
    objects: dict[str, int] = field(default_factory=lambda: {"tensor": 0, "manifest": 0,
                                                             "commit": 0})
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"updates": [u.__dict__ for u in self.updates], "objects": self.objects,
                "bytes": self.bytes}


# ------------------------------------------------------------------------------ helpers


def _pool_map(func: Callable[[Any], Any], items: Iterable[Any], jobs: int) -> list[Any]:
    """`[func(i) for i in items]` on up to `jobs` threads. The first failure stops the
    rest: a remote that names 100,000 objects it does not have is refused at the first
    one, not after asking for every one (nor after queueing a future for each)."""
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        return [func(i) for i in items]
    results: list[Any] = [None] * len(items)
    failed: list[BaseException] = []
    order = itertools.count()  # next() on it is atomic: each index is taken once

    def work() -> None:
        while not failed:
            i = next(order)
            if i >= len(items):
                return
            try:
                results[i] = func(items[i])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                failed.append(exc)

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(min(jobs, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return results


def ancestors(repo: Repo, tips: Iterable[ObjectId]) -> set[ObjectId]:
    """Every commit reachable from `tips` that this repository has (tips included)."""
    seen: set[ObjectId] = set()
    stack = [t for t in tips if t]
    while stack:
        oid = stack.pop()
        if oid in seen or not repo.objects.has(oid):
            continue
        seen.add(oid)
        try:
            stack.extend(repo.read_commit(oid).parents)
        except VrlError:
            continue
    return seen


def is_ancestor(repo: Repo, old: ObjectId, new: ObjectId) -> bool:
    """True if `old` is `new` or one of its ancestors (as far as this repository knows)."""
    if old == new:
        return True
    if not repo.objects.has(old):
        return False
    return old in ancestors(repo, [new])

def _verify(oid: ObjectId, raw: bytes, where: str, kind: str | None = None) -> str:
    """Check that downloaded bytes hash to their id; return the object's kind."""
    if blake3.blake3(raw, max_threads=blake3.blake3.AUTO if len(raw) > (1 << 22) else 1
                     ).hexdigest() != oid:
        raise CorruptObjectError(f"object {oid} from {where} is corrupted (its bytes do not "
                                 "hash to its id); nothing was written; repair the remote "
                                 "with `vrl push --repair` from a repository that holds "
                                 "a good copy")
    got, size = parse_header(raw)
    if len(raw) - HEADER_SIZE != size or (kind and got != kind):
        raise CorruptObjectError(f"object {oid} from {where} is not a valid {kind or 'object'}"
                                 "; nothing was written")
    return got


def _reader(repo: Repo, store: RemoteStore, jobs: int) -> PackReader:
    """Reads objects from `store`'s packs and loose keys (its pack indexes cached here)."""
    return PackReader(store, RemotePacks(store, cache_dir(repo.vrl_dir), jobs), jobs)


def _download(reader: PackReader, oid: ObjectId, kind: str | None = None,
              limit: int | None = None, what: str = "object", limit_loose: bool = True
              ) -> bytes:
    """One object, verified. A packed copy that fails verification is replaced by a loose
    copy of the same id when the remote has one (a remote may hold both)."""
    where = redact(reader.store.url)
    try:
        raw = reader.get(oid, limit, what, limit_loose)
    except KeyMissing:
        raise RemoteObjectMissingError(f"object {oid[:12]} is missing on {where}"
                                       + reader.packs.damage_note()) from None
    try:
        _verify(oid, raw, where, kind)
    except CorruptObjectError:
        other = reader.loose_fallback(oid, limit if limit_loose else None, what)
        if other is None:
            raise
        _verify(oid, other, where, kind)
        raw = other
    return raw


def _store_raw(repo: Repo, oid: ObjectId, raw: bytes) -> None:
    kind, _ = parse_header(raw)
    repo.objects.write(kind, memoryview(raw)[HEADER_SIZE:], oid)


def _hashes_to(oid: ObjectId, data: bytes | memoryview) -> bool:
    threads = blake3.blake3.AUTO if len(data) > (1 << 22) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest() == oid


def damaged_here(oid: ObjectId, kind: str, remote: str) -> CorruptObjectError:
    """The error of a push that found a damaged object in this repository."""
    return CorruptObjectError(
        f"{kind} {oid[:12]} in this repository is damaged (its bytes do not match its "
        f"id); the push sent nothing damaged and moved no ref on {remote}; run `vrl fsck`, "
        "then restore the object from a good copy (e.g. `vrl fetch` from a remote that "
        "holds it intact) and push again")


def verified_raw(repo: Repo, oid: ObjectId, kind: str, remote: str) -> bytes:
    """An object's stored bytes (header + payload), hashed to its id first: what a push
    sends is never damage it would spread to every clone."""
    try:
        raw = repo.objects.read_raw(oid)
    except CorruptObjectError:
        raise damaged_here(oid, kind, remote) from None
    if not _hashes_to(oid, raw):
        raise damaged_here(oid, kind, remote)
    return raw


def verify_file(oid: ObjectId, path: Path, kind: str, remote: str) -> None:
    """Hash a loose object file (through a read-only map, on several cores when big)
    before it is uploaded from that file. Objects are immutable: the file read again for
    the upload holds the bytes just hashed."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    try:
        if path.stat().st_size:
            hasher.update_mmap(path)
    except OSError:
        raise damaged_here(oid, kind, remote) from None
    if hasher.hexdigest() != oid:
        raise damaged_here(oid, kind, remote)


def _topo_order(commits: Iterable[ObjectId],
                parents: Callable[[ObjectId], Iterable[ObjectId]]) -> list[ObjectId]:
    """Parents before children (only parents within `commits` count)."""
    members = set(commits)
    order: list[ObjectId] = []
    done: set[ObjectId] = set()
    opened: set[ObjectId] = set()  # a cycle (impossible with intact hashes) cannot loop
    for start in sorted(members):
        stack: list[tuple[ObjectId, bool]] = [(start, False)]
        while stack:
            oid, expanded = stack.pop()
            if oid in done:
                continue
            if expanded:
                done.add(oid)
                order.append(oid)
                continue
            if oid in opened:
                continue
            opened.add(oid)
            stack.append((oid, True))
            stack.extend((p, False) for p in parents(oid) if p in members and p not in done)
    return order

