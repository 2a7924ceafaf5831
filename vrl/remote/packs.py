"""Packs on a remote: what they hold, and reading objects out of them.

A push sends the small objects it needs as one new pack (`objects/pack/pack-<name>.pack`,
byte-identical to a local pack: vrl/pack.py), big tensors as loose objects. A remote may
hold both (older pushes, or a local repository used as a remote), so a reader asks the
packs first and falls back to the loose key.

What the packs hold is learnt from one listing of `objects/pack/` and, for each pack not
seen before, one ranged read of its tail (index + trailer). A pack's name is the checksum
of its index, so indexes are cached by name under `.vrl/cache/packs/` (checked again on
every use; a damaged cache file is ignored) and a pack is read once per repository.

Nothing read from a remote is trusted: an index must pass `pack.parse_tail` (checksum,
name, entries inside the pack and not overlapping), every range is checked against the
listed size and the caller's size limit before it is requested, and every object is
hash-verified by the caller before it is stored. A damaged pack is skipped (its objects
count as missing, and the error naming a missing object names the damaged pack).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vrl import pack
from vrl.errors import CorruptObjectError
from vrl.objects import HEADER_SIZE, ObjectId, is_object_id
from vrl.remote.base import PACK_PREFIX, KeyMissing, RemoteStore, object_key, pack_key, redact

TAIL_READ = 64 << 10  # the first read of a pack's tail: the whole index of ~1300 objects
WHOLE_PACK_MAX = 8 << 20  # a pack this small is read whole when any object in it is needed
WHOLE_PACK_MIN = 1 << 20  # ... and a bigger one when at least half its bytes are wanted
CACHE_MAX = 256 << 20  # whole packs kept in memory by one reader, at most
GAP = 64 << 10  # wanted objects this close together are read in one range


def _pool_map(func: Callable, items: Iterable, jobs: int) -> list:
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        return [func(i) for i in items]
    with ThreadPoolExecutor(max_workers=min(jobs, len(items))) as pool:
        return list(pool.map(func, items))


class RemotePacks:
    """The packs of one remote and their indexes: `where(oid)` finds an object."""

    def __init__(self, store: RemoteStore, cache_dir: Path | None = None, jobs: int = 8
                 ) -> None:
        self.store = store
        self.cache_dir = cache_dir
        self.jobs = jobs
        self.sizes: dict[str, int] = {}  # pack key -> size
        self.bad: dict[str, str] = {}  # pack key -> why it cannot be used
        self.entries: dict[str, pack.Entries] = {}  # pack key -> index
        self._where: dict[ObjectId, tuple[str, int, int]] = {}
        self.loose: set[ObjectId] | None = None  # loose ids, when listed (`load(loose=True)`)
        self.loaded = False
        self._lock = threading.Lock()

    def ensure(self) -> RemotePacks:
        """Load once (the first question loads; later ones use what was learnt)."""
        if not self.loaded:
            with self._lock:
                if not self.loaded:
                    self.load()
        return self

    # ------------------------------------------------------------------ learning
    def load(self, loose: bool = False) -> RemotePacks:
        """List the packs (with `loose`, every object key: one listing for both) and read
        the index of each pack not cached. Returns self."""
        listing = self.store.list_sizes("objects/" if loose else PACK_PREFIX)
        if loose:
            self.loose = set()
            for key in listing:
                oid = key[8:10] + key[11:]
                if len(key) == 8 + 2 + 1 + 62 and key[10] == "/" and is_object_id(oid):
                    self.loose.add(ObjectId(oid))
        self.sizes = {k: n for k, n in listing.items()
                      if k.startswith(PACK_PREFIX) and "/" not in k[len(PACK_PREFIX):]
                      and pack.pack_name(k)}
        todo = [k for k in sorted(self.sizes) if k not in self.entries and k not in self.bad]
        for key, got in zip(todo, _pool_map(self._index, todo, self.jobs), strict=True):
            if isinstance(got, str):
                self.bad[key] = got
            else:
                self.entries[key] = got
        self._where = {}
        for key in sorted(self.entries):
            if key in self.sizes:
                for oid, (offset, length) in self.entries[key].items():
                    self._where.setdefault(oid, (key, offset, length))
        self.loaded = True
        return self

    def _index(self, key: str) -> pack.Entries | str:
        """A pack's entries (from the cache, or its tail), or why it cannot be used."""
        size = self.sizes[key]
        name = pack.pack_name(key)
        label = f"{os.path.basename(key)} on {redact(self.store.url)}"
        cached = self._cached(name, size, label)
        if cached is not None:
            return cached
        try:
            tail = self.store.get_range(key, max(0, size - TAIL_READ), size)
            if len(tail) < pack.TRAILER.size:
                raise CorruptObjectError(f"pack {label} is truncated")
            span = pack.index_span(tail[-pack.TRAILER.size:], size, label)
            if span > len(tail):
                tail = self.store.get_range(key, size - span, size)
            tail = tail[-span:]
            entries = pack.parse_tail(tail, size, label, name)
        except KeyMissing:
            return f"pack {label} vanished while being read"
        except CorruptObjectError as exc:
            return str(exc)
        self._save(name, tail)
        return entries

    def _cached(self, name: str, size: int, label: str) -> pack.Entries | None:
        if self.cache_dir is None:
            return None
        try:
            tail = (self.cache_dir / name).read_bytes()
            return pack.parse_tail(tail, size, label, name)
        except (OSError, CorruptObjectError):
            return None  # absent, or damaged: read the pack again

    def _save(self, name: str, tail: bytes) -> None:
        """Cache an index (atomically, not fsynced: a lost or torn one is just re-read)."""
        if self.cache_dir is None:
            return
        with contextlib.suppress(OSError):
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_dir / f".tmp-{os.getpid()}-{secrets.token_hex(6)}"
            tmp.write_bytes(tail)
            os.replace(tmp, self.cache_dir / name)

    def add(self, name: str, data: bytes, entries: pack.Entries) -> None:
        """Record a pack this client just uploaded (its index is cached, never re-read)."""
        key = pack_key(name)
        self.sizes[key] = len(data)
        self.entries[key] = entries
        for oid, (offset, length) in entries.items():
            self._where.setdefault(oid, (key, offset, length))
        span = len(entries) * pack.ENTRY.size + pack.TRAILER.size
        self._save(name, data[-span:])

    # ------------------------------------------------------------------ answering
    def where(self, oid: ObjectId) -> tuple[str, int, int] | None:
        """(pack key, offset, length) of a packed object, or None."""
        return self.ensure()._where.get(oid)

    def packed(self) -> set[ObjectId]:
        return set(self.ensure()._where)

    def damage_note(self) -> str:
        """Why objects may be missing: the damaged packs ("" if none)."""
        if not self.bad:
            return ""
        key, why = sorted(self.bad.items())[0]
        more = f" (and {len(self.bad) - 1} more)" if len(self.bad) > 1 else ""
        return f"; a pack there is damaged{more}: {why}"


class PackReader:
    """Reads objects from a remote: from its packs (whole small packs, or ranges of big
    ones) or from loose keys. Returns raw, unverified bytes: callers verify them."""

    def __init__(self, store: RemoteStore, packs: RemotePacks, jobs: int = 8) -> None:
        self.store = store
        self.packs = packs
        self.jobs = jobs
        self._whole: dict[str, bytes] = {}  # pack key -> its bytes (small packs)
        self._got: dict[ObjectId, bytes] = {}  # prefetched objects
        self._cached = 0
        self._lock = threading.Lock()
        self._pack_locks: dict[str, threading.Lock] = {}

    def _too_big(self, oid: ObjectId, length: int, limit: int | None, what: str) -> None:
        if limit is not None and what == "tensor" and length != limit:  # an exact size
            raise CorruptObjectError(
                f"tensor {oid[:12]} from {redact(self.store.url)} has {length - HEADER_SIZE} "
                f"bytes but its manifest says {limit - HEADER_SIZE}; nothing was written")
        if limit is not None and length > limit:
            raise CorruptObjectError(
                f"{what} {oid[:12]} in a pack on {redact(self.store.url)} claims {length} "
                f"bytes, over the {limit} a {what} may have; refusing it (the remote is "
                "damaged)")

    def get(self, oid: ObjectId, limit: int | None = None, what: str = "object",
            limit_loose: bool = True) -> bytes:
        """The raw bytes of `oid` (header + payload); `limit` caps its total length
        (checked before reading; for a loose object only with `limit_loose`). Raises
        KeyMissing if the remote does not have it."""
        with self._lock:
            got = self._got.pop(oid, None)
        if got is not None:
            return got
        where = self.packs.where(oid)
        if where is None:
            return self._loose(oid, limit if limit_loose else None, what)
        key, offset, length = where
        self._too_big(oid, length, limit, what)
        data = self._whole_pack(key)
        if data is not None:
            return data[offset:offset + length]
        return self._range(key, offset, offset + length)

    def _loose(self, oid: ObjectId, limit: int | None, what: str) -> bytes:
        key = object_key(oid)
        return self.store.get_small(key, limit, what) if limit else self.store.get(key)

    def loose_fallback(self, oid: ObjectId, limit: int | None, what: str) -> bytes | None:
        """The loose copy of a packed object whose packed bytes were bad (or None)."""
        if self.packs.where(oid) is None:
            return None
        try:
            return self._loose(oid, limit, what)
        except KeyMissing:
            return None

    def _range(self, key: str, start: int, end: int) -> bytes:
        data = self.store.get_range(key, start, end)
        if len(data) != end - start:
            raise CorruptObjectError(f"pack {os.path.basename(key)} on "
                                     f"{redact(self.store.url)} is shorter than its index "
                                     "says; repair the remote with `vrl push --repair` from "
                                     "a repository that holds a good copy")
        return data

    def _whole_pack(self, key: str, limit: int = WHOLE_PACK_MAX) -> bytes | None:
        """A pack's bytes (downloaded once) if it is at most `limit` bytes and fits in the
        cache, else None."""
        size = self.packs.sizes.get(key, 0)
        if size > limit:
            return None
        with self._lock:
            if key in self._whole:
                return self._whole[key]
            if self._cached + size > CACHE_MAX:
                return None
            lock = self._pack_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._whole:
                data = self._range(key, 0, size)
                with self._lock:
                    self._whole[key] = data
                    self._cached += size
            return self._whole[key]

    def prefetch(self, ids: Iterable[ObjectId], limits: dict[ObjectId, int],
                 what: str = "object") -> None:
        """Read the packed ones of `ids` in few requests: a pack whole when it is small or
        mostly wanted, otherwise ranges of nearby objects. `limits` caps each length
        (checked first; for `what` "tensor" it is the exact length); ids not in a pack are
        left for `get` (loose keys)."""
        by_pack: dict[str, list[tuple[int, int, ObjectId]]] = {}
        for oid in ids:
            where = self.packs.where(oid)
            if where is None or oid in self._got:
                continue
            key, offset, length = where
            self._too_big(oid, length, limits.get(oid), what)
            by_pack.setdefault(key, []).append((offset, length, oid))
        reads: list[tuple[str, int, int, list[tuple[int, int, ObjectId]]]] = []
        whole: list[tuple[str, list[tuple[int, int, ObjectId]]]] = []
        for key, wanted in by_pack.items():
            size = self.packs.sizes[key]
            want = sum(length for _, length, _ in wanted)
            if key in self._whole or size <= WHOLE_PACK_MIN or \
                    (size <= WHOLE_PACK_MAX and 2 * want >= size):
                whole.append((key, wanted))
                continue
            wanted.sort()
            group = [wanted[0]]
            for item in wanted[1:]:
                last = group[-1]
                if item[0] - (last[0] + last[1]) <= GAP:
                    group.append(item)
                else:
                    reads.append((key, group[0][0], group[-1][0] + group[-1][1], group))
                    group = [item]
            reads.append((key, group[0][0], group[-1][0] + group[-1][1], group))

        def read(job: tuple[str, int, int, list[tuple[int, int, ObjectId]]]) -> None:
            key, start, end, members = job
            data = self._range(key, start, end)
            with self._lock:
                for offset, length, oid in members:
                    self._got[oid] = data[offset - start:offset - start + length]

        def read_whole(job: tuple[str, list[tuple[int, int, ObjectId]]]) -> None:
            key, members = job
            data = self._whole_pack(key, max(WHOLE_PACK_MAX, WHOLE_PACK_MIN))
            if data is None:  # the cache is full: read just these
                start, end = min(m[0] for m in members), max(m[0] + m[1] for m in members)
                return read((key, start, end, members))
            with self._lock:
                for offset, length, oid in members:
                    self._got[oid] = data[offset:offset + length]
            return None

        _pool_map(read_whole, whole, self.jobs)
        _pool_map(read, reads, self.jobs)


def cache_dir(vrl_dir: Path) -> Path:
    """Where a repository caches remote pack indexes (by pack name, shared by remotes)."""
    return Path(vrl_dir) / "cache" / "packs"
