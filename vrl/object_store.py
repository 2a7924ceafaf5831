"""Content-addressed object stores: on disk (the real one) and in memory (its test twin).

Writes are atomic (temp file, then rename into place), so an object is never visible
half-written; `sync()` makes everything written so far durable before a ref points at it.
Small objects written inside `batch()` go into one pack file (vrl/pack.py); everything
else is a loose file `objects/ab/cdef...`. Callers never see the difference: they ask for
objects by id.
"""

from __future__ import annotations

import contextlib
import errno
import math
import mmap
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from vrl import pack
from vrl.durable import discard, fsync, fsync_dir, thread_pool
from vrl.errors import (
    CorruptObjectError,
    ObjectNotFoundError,
    VrlError,
    storage_error,
)
from vrl.objects import (
    HEADER_SIZE,
    ObjectId,
    hash_object,
    header,
    is_object_id,
    parse_header,
    tensor_header,
)


class ObjectStore(ABC):
    """The interface every object store implements (see tests/test_object_store.py)."""

    @abstractmethod
    def has(self, oid: ObjectId) -> bool: ...

    @abstractmethod
    def read(self, oid: ObjectId) -> tuple[str, bytes]:
        """Return (kind, payload); raise ObjectNotFoundError if absent."""

    @abstractmethod
    def write(self, kind: str, payload: bytes | memoryview, oid: ObjectId | None = None
              ) -> ObjectId:
        """Store an object (a no-op if present) and return its id.

        `oid`, when given, is a hash the caller already computed for these bytes.
        """

    @abstractmethod
    def delete(self, oid: ObjectId) -> None: ...

    @abstractmethod
    def ids(self) -> Iterator[ObjectId]: ...

    def sync(self) -> None:  # noqa: B027 - stores without durability need nothing
        """Make every object written so far durable."""

    def verify(self, oid: ObjectId) -> str:
        """Re-hash an object; return its kind or raise CorruptObjectError."""
        kind, payload = self.read(oid)
        if hash_object(kind, payload) != oid:
            raise CorruptObjectError(f"object {oid[:12]} is corrupted: its bytes do not match "
                                     "its id (run `vrl fsck`)")
        return kind

    def kind_and_size(self, oid: ObjectId) -> tuple[str, int]:
        kind, payload = self.read(oid)
        return kind, len(payload)

    def read_raw(self, oid: ObjectId) -> bytes:
        """The object exactly as stored and hashed: 64-byte header + payload."""
        kind, payload = self.read(oid)
        return header(kind, len(payload)) + payload

    def ids_with_prefix(self, prefix: str) -> list[ObjectId]:
        return sorted(o for o in self.ids() if o.startswith(prefix))

    def delete_many(self, ids: Iterable[ObjectId], older_than: float | None = None,
                    dry_run: bool = False) -> tuple[int, int]:
        """Delete objects (those written before `older_than`, a time.time(), if given);
        return (count, bytes). Objects that are absent are skipped."""
        count = size = 0
        for oid in ids:
            if self.has(oid):
                count += 1
                size += HEADER_SIZE + self.kind_and_size(oid)[1]
                if not dry_run:
                    self.delete(oid)
        return count, size

    def check(self) -> list[str]:
        """Problems of the store's containers (packs) that per-object checks cannot see."""
        return []

    def repack(self) -> tuple[int, int]:
        """Merge small objects into one pack; return (objects packed, files removed)."""
        return 0, 0


class MemoryObjectStore(ObjectStore):
    """A dict-backed twin of FileObjectStore for fast tests."""

    def __init__(self) -> None:
        self.objects: dict[ObjectId, tuple[str, bytes]] = {}

    def has(self, oid: ObjectId) -> bool:
        return oid in self.objects

    def read(self, oid: ObjectId) -> tuple[str, bytes]:
        try:
            return self.objects[oid]
        except KeyError:
            raise ObjectNotFoundError(f"object {oid[:12]} not found") from None

    def write(self, kind: str, payload: bytes | memoryview, oid: ObjectId | None = None
              ) -> ObjectId:
        oid = oid or hash_object(kind, payload)
        self.objects.setdefault(oid, (kind, bytes(payload)))
        return oid

    def delete(self, oid: ObjectId) -> None:
        self.objects.pop(oid, None)

    def ids(self) -> Iterator[ObjectId]:
        yield from list(self.objects)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (tests replace this to inject ENOSPC and crashes)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view[: 1 << 30])
        view = view[written:]


# O_DIRECT writes start and end on this boundary, in the file and in memory: a multiple of
# every logical block and DMA alignment a Linux block device has (512 or 4096 bytes).
DIRECT_ALIGN = 4096
DIRECT_MIN = 1 << 20  # bytes an object has at least before its bulk is written directly


def direct_offset(offset: int) -> int:
    """The first offset from `offset` at which a payload can be written with O_DIRECT
    (`FileObjectStore.direct`): the payload's bytes after the object's first block then
    start on a `DIRECT_ALIGN` boundary of memory (a mapping starts on one)."""
    return -(-(offset - HEADER_SIZE) // DIRECT_ALIGN) * DIRECT_ALIGN + HEADER_SIZE


def _address(view: memoryview) -> int:
    import numpy as np  # (numpy reads the address of a read-only buffer; ctypes cannot)

    return int(np.frombuffer(view, np.uint8).ctypes.data)


def _write_direct(fd: int, chunks: list[bytes | memoryview]) -> bool:
    """Write an object (its header, then its payload) into the empty file `fd`, the
    payload's block-aligned bulk through O_DIRECT: the device reads those bytes from the
    caller's memory, so the kernel neither copies them into the page cache (on a VM most
    of a big snapshot's CPU: each new page-cache page is fresh memory) nor evicts the
    trainer's pages for them. The first block and the tail are written as usual. False,
    with nothing written, where the payload is small or not at a `direct_offset` in memory,
    or the file system refuses O_DIRECT (the caller then writes it all as usual)."""
    direct = getattr(os, "O_DIRECT", 0)
    if len(chunks) != 2 or not direct:
        return False
    head, payload = bytes(chunks[0]), memoryview(chunks[1]).cast("B")
    first = DIRECT_ALIGN - len(head)  # the payload's bytes in the first block
    body = (payload.nbytes - first) // DIRECT_ALIGN * DIRECT_ALIGN
    if first <= 0 or payload.nbytes < DIRECT_MIN or \
            _address(payload) % DIRECT_ALIGN != len(head):
        return False
    import fcntl

    # (the same descriptor, switched: the temp file is read-only, it cannot be reopened)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # (a file system without O_DIRECT)
            return False
        raise
    done = 0
    try:
        while done < body:
            try:
                written = os.pwrite(fd, payload[first + done:first + body],
                                    DIRECT_ALIGN + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                break  # the device wants another alignment: the rest as usual
            done += written
            if not written or written % DIRECT_ALIGN:
                break
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    if not done:
        return False
    _pwrite_all(fd, b"".join((head, payload[:first])), 0)
    _pwrite_all(fd, payload[first + done:], DIRECT_ALIGN + done)
    return True


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write every byte at `offset`."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view[: 1 << 30], offset)
        view, offset = view[written:], offset + written


if TYPE_CHECKING:  # (concurrent.futures imports logging: ~5-10 ms a read-only command)
    from concurrent.futures import Future, ThreadPoolExecutor


PACK_MAX = 1 << 20
"""Objects with payloads smaller than this, written inside `batch()`, go into the batch's
pack. A loose file costs an open, a rename, an fsync and a directory fsync (about a
millisecond on a journalled disk), which is the time to write a MiB to the page cache:
below that, one pack is cheaper. Bigger tensors stay loose files. Tensors from
`repo.MMAP_MIN` up are memory-mapped on restore wherever they are (a pack maps too)."""
PACK_SPILL = 64 << 20
"""Staged bytes beyond this are written out as a pack at once (a commit of many
mid-sized tensors then writes several packs instead of holding them all in memory)."""
PACK_MIN_OBJECTS = 2  # a single small object is as cheap loose (one file, one fsync)
AUTO_MERGE = 32  # this many packs of one size class are merged after a commit
# called by a step that removes files once what it wrote, and the removal of what that
# replaces, are durable (Journal.maintaining)
Checkpoint = Callable[[], None]
MERGED_MAX = 8 << 20  # packs from this size up are never merged again (but by repack)
FRESH_MAX = 256 << 10  # the size class of one commit's pack of a small policy


# in FileObjectStore._freshened (names of packs freshened in the open batch): the pack
# tables were refreshed in this batch, so `put` does not look again
_TABLES_CHECKED = ""


def _check_kind(oid: ObjectId, got: str, wanted: str | None) -> None:
    if wanted is not None and got != wanted:
        raise CorruptObjectError(f"object {oid[:12]} is a {got}, not a {wanted}; run `vrl fsck`")


class FileObjectStore(ObjectStore):
    """Objects under a repository's `.vrl/objects`: loose files `ab/cdef...` and packs
    `pack/pack-<name>.pack`. The packs' indexes are kept in memory and re-read when the
    pack directory changes (another process committed, repacked or collected garbage)."""

    def __init__(self, root: Path, fsync: bool = True, verify_reads: bool = False,
                 fresh_for: float = 1800.0, direct: bool = False,
                 parallel_hashing: bool = True) -> None:
        self.root = Path(root)
        self._root = os.fspath(self.root)
        self._pack_dir = f"{self._root}/pack"
        # A reused object in a pack younger than this is kept alive by freshening the pack;
        # from an older pack it is written again instead (see _touch_packed).
        self.fresh_for = fresh_for
        self.fsync = fsync
        self.verify_reads = verify_reads
        # Write a big object's bulk with O_DIRECT where its payload sits at a
        # `direct_offset` in memory (the Snapshotter's committer lays out its shared memory
        # so). Off elsewhere: a commit's objects then stay in the page cache for a read.
        self.direct = direct
        # Whether a very large object may be hashed on several cores: not in the
        # Snapshotter's committer process, where a second thread would take the training
        # loop's core.
        self.parallel_hashing = parallel_hashing
        self.direct_writes = 0  # objects written so (a count for tests and benchmarks)
        self._dirty_dirs: set[str] = set()
        self._batching = False
        self._pending: list[Future] = []
        self._inflight: set[str] = set()
        self._staged: dict[ObjectId, bytes] = {}  # small objects of the open batch
        self._staged_bytes = 0
        self._lock = threading.Lock()  # guards the pack tables below
        self._packs: dict[str, pack.Entries] = {}  # pack file name -> its index
        self._bad_packs: dict[str, str] = {}  # pack file name -> why it cannot be used
        self._packed: dict[ObjectId, tuple[str, int, int]] = {}  # id -> (pack, offset, len)
        self._pack_dir_mtime: int | None = None
        self._freshened: set[str] = set()  # packs touched in the open batch (once is enough)
        self._touched: dict[str, float] = {}  # pack path -> when this process last freshened it
        # a deferred batch's staged objects (readable from `_staged` meanwhile) and pack,
        # registered by the flush that waits for its write
        self._deferred: tuple[dict[ObjectId, bytes], tuple[str, pack.Entries] | None] | None \
            = None
        # a sealed batch's pack (name, chunks, entries), waiting for the commit journal
        self._sealed: tuple[str, list[bytes | memoryview], pack.Entries] | None = None
        # the objects of a pack the journal holds durably but has not placed yet (it does
        # so in the background): read from memory meanwhile
        self._landing: dict[ObjectId, bytes] = {}
        self._pack_sizes: dict[str, int] = {}  # pack file name -> size (for consolidate)
        # (the packs looked at, their names by size class) as `_due` last worked them out
        self._classes: tuple[tuple[str, ...], tuple[list[str], list[str]]] | None = None
        # waits for that placing (installed by the repository: the journal's `wait`)
        self.barrier: Callable[[], None] | None = None

    def path(self, oid: ObjectId) -> Path:
        """Where the object's loose file is (or would be); packed objects have none."""
        return Path(self.fspath(oid))

    def fspath(self, oid: ObjectId) -> str:
        """The loose file path as a string (Path objects are slow in hot loops)."""
        if not is_object_id(oid):
            raise ObjectNotFoundError(f"{oid!r} is not an object id")
        return f"{self._root}/{oid[:2]}/{oid[2:]}"

    def loose_path(self, oid: ObjectId) -> Path | None:
        """The object's loose file, or None if it is packed or absent."""
        path = self.fspath(oid)
        return Path(path) if os.path.isfile(path) else None

    # ------------------------------------------------------------------ pack tables
    def _refresh(self, force: bool = True) -> None:
        """Bring the in-memory pack indexes up to date with objects/pack/.

        Unforced, it is skipped while the directory's mtime is unchanged; the mtime can
        miss a change within one clock tick, so only `has()` (where a stale answer just
        writes an object twice) uses that; reads that miss refresh for real.
        """
        try:
            mtime = os.stat(self._pack_dir).st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if not force and mtime == self._pack_dir_mtime:
            return
        with self._lock:  # (listed under it: a pack this process places is indexed too)
            try:
                # (pack.pack_name's test, inlined: after every commit of this process's own)
                names = {n for n in os.listdir(self._pack_dir)
                         if n.endswith(".pack") and n.startswith("pack-") and len(n) > 10}
            except FileNotFoundError:
                names = set()
            self._pack_dir_mtime = mtime
            known = set(self._packs) | set(self._bad_packs)
            if names == known:
                return
            gone = known - names
            for name in gone:
                self._packs.pop(name, None)
                self._bad_packs.pop(name, None)
            for name in sorted(names - known):
                try:
                    self._packs[name] = pack.read_index(f"{self._pack_dir}/{name}")
                except (CorruptObjectError, OSError) as exc:
                    self._bad_packs[name] = str(exc)
                    continue
                if not gone:
                    self._index_pack(name)
            if gone:  # rebuilt aside: readers on other threads never see it half-built
                packed: dict[ObjectId, tuple[str, int, int]] = {}
                for name, entries in self._packs.items():
                    for oid, (offset, length) in entries.items():
                        packed[oid] = (name, offset, length)
                self._packed = packed

    def _index_pack(self, name: str) -> None:
        for oid, (offset, length) in self._packs[name].items():
            self._packed[oid] = (name, offset, length)

    def _locate(self, oid: ObjectId, force: bool = True) -> tuple[str, int, int] | None:
        """(pack path, offset, length) of a packed object, or None."""
        where = self._packed.get(oid)
        if where is None:
            if self.barrier is not None and (force or oid in self._landing):
                # its pack may be being placed (by this process's background work, or a
                # commit of another one reported already): wait for it
                self.barrier()
            self._refresh(force)
            where = self._packed.get(oid)
            if where is None:
                return None
        return f"{self._pack_dir}/{where[0]}", where[1], where[2]

    def _read_packed(self, oid: ObjectId, length: int | None = None) -> bytes:
        """The raw bytes (or the first `length`) of a staged or packed object."""
        staged = self._staged.get(oid) or self._landing.get(oid)
        if staged is not None:
            return staged if length is None else staged[:length]
        for attempt in range(2):
            where = self._locate(oid)
            if where is None:
                break
            path, offset, size = where
            try:
                fd = os.open(path, os.O_RDONLY)  # (a file object costs 3 more syscalls)
                try:
                    return os.pread(fd, size if length is None else min(length, size), offset)
                finally:
                    os.close(fd)
            except FileNotFoundError:  # repacked or collected meanwhile: look again
                if attempt == 0:
                    self._refresh()
        raise self._not_found(oid)

    def _not_found(self, oid: ObjectId) -> VrlError:
        if self._bad_packs:  # it may well have been in the damaged pack
            name, why = sorted(self._bad_packs.items())[0]
            return CorruptObjectError(f"object {oid[:12]} not found, and pack {name} is "
                                      f"damaged ({why}); run `vrl fsck`")
        return ObjectNotFoundError(f"object {oid[:12]} not found in {self.root}")

    def is_packed(self, oid: ObjectId) -> bool:
        """Whether the object is in a pack this store has indexed (no disk access)."""
        return oid in self._packed

    def locate(self, oid: ObjectId) -> tuple[Path, int, int]:
        """(file, offset, length) of the object's bytes: its loose file, or its pack."""
        path = self.fspath(oid)
        try:
            return Path(path), 0, os.stat(path).st_size
        except FileNotFoundError:
            where = self._locate(oid)
            if where is None:
                raise self._not_found(oid) from None
            return Path(where[0]), where[1], where[2]

    # ------------------------------------------------------------------ reading
    def has(self, oid: ObjectId) -> bool:
        # dict lookups before any stat (a landing pack's objects before the pack tables,
        # where they are registered before they leave `_landing`)
        if oid in self._staged or oid in self._landing or oid in self._packed:
            return True
        path = self.fspath(oid)
        return path in self._inflight or os.path.isfile(path) or \
            self._locate(oid, force=False) is not None

    def staged_payload(self, oid: ObjectId) -> memoryview | None:
        """The payload of an object staged for the open batch's pack (a view of the
        immutable bytes the pack gets), or None."""
        raw = self._staged.get(oid) or self._landing.get(oid)
        return None if raw is None else memoryview(raw)[HEADER_SIZE:]

    def _loose(self, oid: ObjectId) -> str:
        """The loose file path, once a batched write of it (if any) is in place."""
        path = self.fspath(oid)
        if path in self._inflight:
            self.flush()
        return path

    def _try_packed(self, oid: ObjectId, length: int | None = None) -> bytes | None:
        """A known packed (or staged) object's bytes, looked up before its loose path
        (small objects are packed; the failed open of a loose path costs as much); None if
        it is not known packed, or its pack went meanwhile (repacked: it may be loose)."""
        if oid not in self._staged and oid not in self._landing and oid not in self._packed:
            return None
        try:
            return self._read_packed(oid, length)
        except VrlError:
            return None

    def read_raw(self, oid: ObjectId) -> bytes:
        raw = self._try_packed(oid)
        if raw is not None:
            return raw
        try:
            with open(self._loose(oid), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return self._read_packed(oid)

    def read(self, oid: ObjectId) -> tuple[str, bytes]:
        raw = self.read_raw(oid)
        kind, size = parse_header(raw, oid)
        payload = raw[HEADER_SIZE:]
        if len(payload) != size:
            raise CorruptObjectError(f"object {oid[:12]} is truncated ({len(payload)} of {size} "
                                     "bytes); run `vrl fsck`")
        if self.verify_reads and blake3.blake3(raw).hexdigest() != oid:
            raise CorruptObjectError(f"object {oid[:12]} is corrupted: its bytes do not match "
                                     "its id (run `vrl fsck`)")
        return kind, payload

    def kind_and_size(self, oid: ObjectId) -> tuple[str, int]:
        head = self._try_packed(oid, HEADER_SIZE)
        if head is not None:
            return parse_header(head, oid)
        try:
            with open(self._loose(oid), "rb") as f:
                return parse_header(f.read(HEADER_SIZE), oid)
        except FileNotFoundError:
            return parse_header(self._read_packed(oid, HEADER_SIZE), oid)

    def map_payload(self, oid: ObjectId, kind: str | None = None) -> memoryview:
        """The payload memory-mapped copy-on-write (private: writes never reach the store);
        with `kind`, an object of another kind is refused (a forged manifest may name it)."""
        staged = self._staged.get(oid) or self._landing.get(oid)
        if staged is not None:  # not on disk yet: a private copy
            _check_kind(oid, parse_header(bytes(staged[:HEADER_SIZE]), oid)[0], kind)
            return memoryview(bytearray(staged[HEADER_SIZE:]))
        fd, offset, size = self.open_payload(oid, kind)
        try:
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        finally:
            os.close(fd)
        return memoryview(mapped)[offset:offset + size]

    def map_loose_tensor(self, oid: ObjectId, nbytes: int) -> mmap.mmap | None:
        """The loose file of the `nbytes`-byte tensor `oid`, memory-mapped copy-on-write
        (its payload at HEADER_SIZE), or None where that is not the whole story (packed,
        being written, absent, a header that is not that tensor's): `open_payload` then
        sorts it out and says what is wrong. A restore's hot path: open, the header by
        pread (read through the map it would fault in a page the restore never needs),
        map, close - a few microseconds per tensor in all."""
        # (no regular expression: every id a manifest names was checked when it was
        # parsed; 64 letters and digits are enough to stay inside this folder)
        if oid in self._packed or len(oid) != 64 or not oid.isalnum():
            return None
        path = f"{self._root}/{oid[:2]}/{oid[2:]}"
        if path in self._inflight:
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.pread(fd, HEADER_SIZE, 0) != tensor_header(nbytes):
                return None
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        if len(mapped) != HEADER_SIZE + nbytes:
            mapped.close()
            return None
        return mapped

    def open_payload(self, oid: ObjectId, kind: str | None = None) -> tuple[int, int, int]:
        """(open fd, offset, size) of the payload in the object's loose file or pack, its
        header checked (kind and size); the caller closes the fd. Staged objects of an open
        batch are not on disk yet: ObjectNotFoundError (map_payload has them)."""
        try:
            if oid not in self._packed:
                raise FileNotFoundError  # not known packed: its loose file first
            fd, offset, length = self._open_packed(oid)
        except (FileNotFoundError, VrlError):  # (a known pack went meanwhile)
            try:
                fd = os.open(self._loose(oid), os.O_RDONLY)
                offset, length = 0, None
            except FileNotFoundError:
                fd, offset, length = self._open_packed(oid)
        try:
            size = os.fstat(fd).st_size if length is None else length
            if size < HEADER_SIZE:
                raise CorruptObjectError(f"object {oid[:12]} is truncated; run `vrl fsck`")
            # the header by pread: reading it through a map would fault in a page
            got, payload_size = parse_header(os.pread(fd, HEADER_SIZE, offset), oid)
            _check_kind(oid, got, kind)
            if payload_size != size - HEADER_SIZE:
                raise CorruptObjectError(f"object {oid[:12]} is truncated or the wrong size; "
                                         "run `vrl fsck`")
        except BaseException:
            os.close(fd)
            raise
        return fd, offset + HEADER_SIZE, payload_size

    def _open_packed(self, oid: ObjectId) -> tuple[int, int, int]:
        for attempt in range(2):
            where = self._locate(oid)
            if where is None:
                break
            try:
                return os.open(where[0], os.O_RDONLY), where[1], where[2]
            except FileNotFoundError:
                if attempt == 0:
                    self._refresh()
        raise self._not_found(oid)

    def ids(self) -> Iterator[ObjectId]:
        found: set[ObjectId] = set()
        if self.root.is_dir():
            for sub in self.root.iterdir():
                if len(sub.name) == 2 and sub.is_dir():
                    for f in sub.iterdir():
                        oid = sub.name + f.name
                        if is_object_id(oid):
                            found.add(ObjectId(oid))
        self._refresh()
        found.update(self._landing)
        found.update(self._packed)
        yield from sorted(found)

    def ids_with_prefix(self, prefix: str) -> list[ObjectId]:
        out: set[ObjectId] = set()
        folder = f"{self._root}/{prefix[:2]}"
        try:
            names = os.listdir(folder) if len(prefix) >= 2 else []
        except FileNotFoundError:
            names = []
        out.update(ObjectId(prefix[:2] + n) for n in names
                   if n.startswith(prefix[2:]) and is_object_id(prefix[:2] + n))
        self._refresh()
        out.update(o for o in self._landing if o.startswith(prefix))
        out.update(o for o in self._packed if o.startswith(prefix))
        return sorted(out)

    def mtime(self, oid: ObjectId) -> float:
        """When the object (for a packed one: its pack) was written or last reused."""
        try:
            return os.stat(self.fspath(oid)).st_mtime
        except FileNotFoundError:
            where = self._locate(oid)
            if where is None:
                raise ObjectNotFoundError(f"object {oid[:12]} not found") from None
            return os.stat(where[0]).st_mtime

    def verify(self, oid: ObjectId) -> str:
        try:
            f = open(self.fspath(oid), "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raw = self._read_packed(oid)
            problem = pack.check_raw(oid, raw)
            if problem:
                raise CorruptObjectError(f"object {oid[:12]} (packed) is corrupted: "
                                         f"{problem}") from None
            return parse_header(raw)[0]
        with f:
            kind, size = parse_header(f.read(HEADER_SIZE))
            hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
            hasher.update(header(kind, size))
            got = 0
            while chunk := f.read(1 << 24):
                hasher.update(chunk)
                got += len(chunk)
        if got != size:
            raise CorruptObjectError(f"object {oid[:12]} is truncated ({got} of {size} bytes)")
        if hasher.hexdigest() != oid:
            raise CorruptObjectError(f"object {oid[:12]} is corrupted: its bytes do not match "
                                     "its id")
        return kind

    # ------------------------------------------------------------------ writing
    def write(self, kind: str, payload: bytes | memoryview, oid: ObjectId | None = None
              ) -> ObjectId:
        oid = oid or hash_object(kind, payload, threads=self.parallel_hashing)
        self.put(kind, payload, oid)
        return oid

    def put(self, kind: str, payload: bytes | memoryview, oid: ObjectId) -> bool:
        """Store an object unless it is here (then it is freshened, as `touch` does);
        True if it was written now. A pack written by another process within the last
        clock tick may be missed, which only stores the object twice (harmless)."""
        size = memoryview(payload).nbytes
        final = self.fspath(oid)  # (checks the id)
        if self._batching and size < PACK_MAX:  # bound for the batch's pack
            if oid in self._staged or oid in self._landing or self._reuse_packed(oid):
                return False
        elif oid in self._staged or oid in self._landing or final in self._inflight or \
                self._touch(oid, refresh=False):
            return False
        if self._batching and size < PACK_MAX:
            if self._staged_bytes + size > PACK_SPILL:
                self._spill()
            self._staged[oid] = b"".join((header(kind, size), payload))  # one copy, not 2
            self._staged_bytes += HEADER_SIZE + size
            return True
        self.write_raw(final, [header(kind, size), payload], "object")
        return True

    def write_raw(self, final: str | Path, chunks: list[bytes | memoryview], what: str
                  ) -> None:
        """Atomically create `final` from chunks: temp file in the same directory, fsync,
        rename. Inside `batch()` the fsync and rename run on a worker thread, so flushing
        one object overlaps with writing the next; a big object's writes run there too,
        so they overlap with hashing the next one (the caller keeps `chunks` unchanged
        until the batch ends)."""
        final = os.fspath(final)
        folder = os.path.dirname(final)
        tmp = f"{folder}/.tmp-{os.getpid()}-{os.urandom(6).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            try:
                fd = os.open(tmp, flags, 0o444)
            except FileNotFoundError:  # first object in this fan-out directory
                os.makedirs(folder, exist_ok=True)
                # the new directory's own entry must be durable too (sync() fsyncs it)
                self._dirty_dirs.add(os.path.dirname(folder))
                fd = os.open(tmp, flags, 0o444)
        except OSError as exc:
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing {what} "
                                f"{os.path.basename(folder)}{os.path.basename(final)[:10]}"
                                ) from exc
        later = self._batching and sum(memoryview(c).nbytes for c in chunks) >= PACK_MAX
        if not later:
            self._fill(fd, tmp, final, what, chunks)
        if self._batching and (self.fsync or later):
            self._inflight.add(final)
            self._pending.append(self._executor().submit(
                self._finish, fd, tmp, final, what, chunks if later else ()))
        else:
            self._finish(fd, tmp, final, what)

    def _fill(self, fd: int, tmp: str, final: str, what: str,
              chunks: Iterable[bytes | memoryview]) -> None:
        """Write the chunks to the temp file; on failure close and remove it."""
        try:
            if self.direct and _write_direct(fd, chunks):
                with self._lock:
                    self.direct_writes += 1
            else:
                for chunk in chunks:
                    _write_all(fd, chunk)
        except OSError as exc:
            os.close(fd)
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing {what} "
                                f"{os.path.basename(os.path.dirname(final))}"
                                f"{os.path.basename(final)[:10]}") from exc
        except BaseException:
            os.close(fd)
            discard(Path(tmp))
            raise

    def _finish(self, fd: int, tmp: str, final: str, what: str,
                chunks: Iterable[bytes | memoryview] = ()) -> None:
        self._fill(fd, tmp, final, what, chunks)
        try:
            try:
                if self.fsync:
                    fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing {what} "
                                f"{os.path.basename(final)[:10]}") from exc
        self._dirty_dirs.add(os.path.dirname(final))

    def _executor(self) -> ThreadPoolExecutor:
        return thread_pool("vrl-fsync", 4)

    @contextlib.contextmanager
    def batch(self, defer: bool = False, seal: bool = False) -> Iterator[None]:
        """Write many objects as one: the small ones go into one pack, the fsyncs of the
        big ones overlap. Every object is in place on exit (durable after `sync()`); if
        the body raises, the small objects it wrote are dropped (nothing refers to them;
        any already spilled to a pack stay there, unreferenced, until gc).

        With `defer`, exit only starts the pack's write and fsync (on a worker thread):
        its objects stay readable from memory, and the next `flush()` (`sync()`,
        `take_unsynced_dirs()`, another batch) waits for it and re-raises its failure -
        the caller overlaps that fsync with work of its own.

        With `seal`, exit writes no pack: the small objects are laid out as one
        (`sealed()`), stay readable from memory, and are placed by `land_sealed()` once the
        commit journal holds them (or forgotten by `drop_sealed()`)."""
        opened = self.begin_batch(defer, seal)
        ok = False
        try:
            yield
            ok = True
        finally:
            self.end_batch(opened, ok)

    def begin_batch(self, defer: bool = False, seal: bool = False
                    ) -> tuple[bool, bool] | None:
        """`batch()` as two calls, for a hot path that spares the context manager: open a
        batch, and hand what this returns to `end_batch` (None: a batch was open already,
        which this one is part of)."""
        if self._batching:
            return None
        self.flush()  # a deferred batch before this one is in place first
        self._batching = True
        self._freshened.clear()
        return defer, seal

    def end_batch(self, opened: tuple[bool, bool] | None, ok: bool = True) -> None:
        """Close the batch `begin_batch` opened; `ok`: its body did not raise (else its
        small objects are dropped)."""
        if opened is None:
            return
        defer, seal = opened
        written = False
        packed = None
        staged, self._staged_bytes = self._staged, 0
        try:
            if ok and seal:
                self._sealed = pack.build(staged.items()) if staged else None
            else:
                # the pack's fsync overlaps those of the big objects still in flight
                packed = self._write_staged(staged) if ok else None
            written = True  # (a failed write is not deferred: it raises now)
        finally:
            self._batching = False
            self._freshened.clear()
            if ok and written and seal:
                pass  # staged objects stay readable until land_sealed / drop_sealed
            elif ok and written and defer and self._pending:
                self._deferred = (staged, packed)
            else:
                self._staged = {}
                self.flush()
        if packed and self._deferred is None:
            self._register_pack(*packed)

    def _spill(self) -> None:
        """Write the staged objects as a pack now, fsynced in this thread (so they stay
        readable without waiting for the batch); its directory entry is made durable by
        the next `sync()`, before anything that names them."""
        staged, self._staged, self._staged_bytes = self._staged, {}, 0
        if staged:
            self._batching = False
            try:
                written = self._write_pack_file(staged.items())
            finally:
                self._batching = True
            self._register_pack(*written)

    def take_sealed(self) -> tuple[str, list[bytes | memoryview], int, pack.Entries] | None:
        """Hand the sealed batch's pack to the commit journal: (file name, chunks, size,
        index), or None if it staged nothing. Its objects stay readable from memory until
        `land_sealed` (or `forget_landing`, if the journal never holds it)."""
        if self._sealed is None:
            return None
        name, chunks, entries = self._sealed
        self._sealed = None
        self._landing, self._staged = self._staged, {}
        return f"pack-{name}.pack", chunks, pack.file_size(entries), entries

    def land_sealed(self, sealed: tuple, placed: bool = False) -> None:
        """Put a pack from `take_sealed` into objects/pack/ WITHOUT fsync (the commit
        journal holds it durably) and index it; `placed`: it is there already. May run on
        another thread than the one committing (then its objects are read from memory
        until it is indexed)."""
        file, chunks, _, entries = sealed
        if not placed:
            tmp, _ = self.stage_pack(chunks)
            try:
                with self._lock:
                    before = os.stat(self._pack_dir).st_mtime_ns
                    self._publish(tmp, file)
                    if before == self._pack_dir_mtime:
                        # only this rename changed the folder since the last look (to the
                        # clock's tick, the precision `_refresh` already accepts): the
                        # next commit need not list it again for a pack it knows
                        self._pack_dir_mtime = os.stat(self._pack_dir).st_mtime_ns
            except OSError as exc:
                discard(Path(tmp))
                raise storage_error(exc, self.root.parent, f"writing pack {file[5:15]}"
                                    ) from exc
        self._register_pack(file, entries)
        self._landing = {}  # (after: a reader looks here before the pack tables)

    def forget_landing(self) -> None:
        """The journal did not take the pack from `take_sealed` (its commit failed)."""
        self._landing = {}

    def _publish(self, tmp: str, file: str) -> None:
        """Rename a staged pack into objects/pack/ (made there if it is missing: a
        repository older than `init` making it)."""
        try:
            os.replace(tmp, f"{self._pack_dir}/{file}")
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            os.makedirs(self._pack_dir, exist_ok=True)
            os.replace(tmp, f"{self._pack_dir}/{file}")

    def stage_pack(self, chunks: Iterable[bytes | memoryview], keep_open: bool = False
                   ) -> tuple[str, int | None]:
        """Write a pack's bytes to a temp file in objects/ (no fsync); return its path (to
        be renamed into objects/pack/ by the caller, or discarded if that never comes) and,
        with `keep_open`, an open fd of it (else None). Not in pack/ itself: only the
        rename then changes that folder, which `land_sealed` can vouch for."""
        tmp = f"{self._root}/.tmp-{os.getpid()}-{os.urandom(6).hex()}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        fd = -1
        try:
            fd = os.open(tmp, flags, 0o444)
            # one write call: a syscall per object cost more than the copy
            _write_all(fd, b"".join(chunks))
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, "writing a pack") from exc
        if keep_open:
            return tmp, fd
        os.close(fd)
        return tmp, None

    def drop_sealed(self) -> None:
        self._sealed = None
        self._staged = {}

    def reseal(self, drop: ObjectId, kind: str, payload: bytes) -> ObjectId | None:
        """Swap object `drop` of the sealed batch's pack, not handed to the journal yet,
        for a new one (a commit object re-parented before anything was written: the
        stale one would be left behind naming a parent that may be gone); return the new
        id, or None (nothing changed) if `drop` is not in such a pack."""
        if self._sealed is None or drop not in self._staged:
            return None
        oid = hash_object(kind, payload)
        staged = {k: v for k, v in self._staged.items() if k != drop}
        staged[oid] = header(kind, len(payload)) + payload
        self._staged, self._sealed = staged, pack.build(staged.items())
        return oid

    def place_pack(self, file: str, chunks: Iterable[bytes | memoryview],
                   keep_open: bool = False) -> int | None:
        """Write a pack file by temp file and rename (its name appears only once it is
        whole), without fsync: the commit journal holds its bytes durably, or (with
        `keep_open`, then its fd is returned) the caller fsyncs it with the journal's
        record, in the same round."""
        tmp, fd = self.stage_pack(chunks, keep_open)
        try:
            self._publish(tmp, file)
        except OSError as exc:
            if fd is not None:
                os.close(fd)
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing pack {file[5:15]}") from exc
        return fd

    def pack_bytes_equal(self, file: str, data: bytes | memoryview) -> bool:
        """Whether objects/pack/`file` holds exactly `data` (a replay's idempotence check)."""
        try:
            with open(f"{self._pack_dir}/{file}", "rb") as f:
                return f.read() == data
        except OSError:
            return False

    def pack_intact(self, file: str) -> bool:
        """Whether objects/pack/`file` is a whole pack whose every object matches its id."""
        return not pack.check(f"{self._pack_dir}/{file}")

    def _write_staged(self, staged: dict[ObjectId, bytes]) -> tuple[str, pack.Entries] | None:
        if len(staged) < PACK_MIN_OBJECTS:
            for oid, raw in staged.items():
                self.write_raw(self.fspath(oid), [raw], "object")
            return None
        return self._write_pack_file(staged.items())

    def _write_pack_file(self, objects: Iterable[tuple[ObjectId, bytes | memoryview]]
                         ) -> tuple[str, pack.Entries]:
        name, chunks, entries = pack.build(objects)
        file = f"pack-{name}.pack"
        # one write call: the objects are small, and a syscall each cost more than the copy
        self.write_raw(f"{self._pack_dir}/{file}", [b"".join(chunks)], "a pack")
        return file, entries

    def _register_pack(self, file: str, entries: pack.Entries) -> None:
        """Index a pack this process wrote (laid out by `pack.build`: its size follows)."""
        with self._lock:
            self._bad_packs.pop(file, None)
            if file not in self._packs:
                self._packs[file] = entries
                self._index_pack(file)
                self._pack_sizes[file] = pack.file_size(entries)  # (no stat for `_due`)

    def write_pack(self, objects: Iterable[tuple[ObjectId, bytes | memoryview]]) -> str:
        """Write (id, raw object bytes) pairs as one pack, now; return its file name."""
        file, entries = self._write_pack_file(objects)
        self.flush()
        self._register_pack(file, entries)
        return file

    def flush(self) -> None:
        """Wait for batched writes; re-raise the first failure."""
        pending, self._pending = self._pending, []
        deferred, self._deferred = self._deferred, None
        error = None
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        self._inflight.clear()
        if deferred is not None:
            staged, packed = deferred
            if packed and error is None:
                self._register_pack(*packed)
            if self._staged is staged:  # readable from the pack now (or lost with it)
                self._staged = {}
        if error is not None:
            raise error

    def _reuse_packed(self, oid: ObjectId) -> bool:
        """Whether a packed copy of `oid` is here, freshened (as `touch` does) for reuse.

        Looks in the pack tables only, refreshed at most once per batch: no system call
        per object. An object that exists only as a loose file, or in a pack that appeared
        meanwhile, is then stored again - harmless for the small objects a batch packs."""
        where = self._packed.get(oid)
        if where is None and _TABLES_CHECKED not in self._freshened:
            self._freshened.add(_TABLES_CHECKED)
            self._refresh(force=False)
            where = self._packed.get(oid)
        return where is not None and (where[0] in self._freshened or
                                      self._touch_packed(oid, refresh=False))

    def touch(self, oid: ObjectId) -> bool:
        """Freshen an existing object's mtime; False if it does not exist."""
        return self._touch(oid, refresh=True)

    def forget_stored(self) -> None:
        """A gc ran (vrl/gclock.py): forget the packs freshened a moment ago (taken as
        present without a look) and re-read the pack tables, so every later check of what
        is stored looks at the disk."""
        self._touched.clear()
        self._refresh()

    def _touch(self, oid: ObjectId, refresh: bool) -> bool:
        """`touch`; without `refresh`, a pack that appeared within the last clock tick
        may be missed (a false False)."""
        if oid in self._staged or oid in self._landing:
            return True  # (a pack about to be placed is young)
        where = self._packed.get(oid)
        if where is not None:  # packed, as most small objects are: no loose lookup
            if where[0] in self._freshened:
                return True  # its pack was freshened in this batch already: one utime
            if self._touch_packed(oid, refresh=False):
                return True
        path = self.fspath(oid)
        try:
            os.utime(path)
            return True
        except FileNotFoundError:
            pass
        except OSError:  # read-only: the object is there, and nothing can collect it
            if os.path.isfile(path):
                return True
        return self._touch_packed(oid, refresh)

    def _touch_packed(self, oid: ObjectId, refresh: bool = True) -> bool:
        """Freshen the pack holding `oid` (the whole pack then looks young to gc, which
        keeps every object in it); False if no pack holds it, or only an old one.

        An old pack may be mid-collection by a concurrent gc, and freshening it would also
        revive the unreachable objects in it (e.g. a commit whose parent, in another old
        pack, goes): the caller writes the object again instead, which for a small object
        costs next to nothing."""
        for force in (False, True) if refresh else (False,):
            where = self._locate(oid, force=force)
            if where is None:
                return False
            path = where[0]
            try:
                now = time.time()
                since = now - self._touched.get(path, -math.inf)
                # freshened by this process a moment ago (within a hundredth of fresh_for,
                # at most a second: a training loop's commits reuse the same pack's
                # objects every time): as young as a freshening would make it
                if since < min(1.0, self.fresh_for / 100):
                    if self._batching:
                        self._freshened.add(os.path.basename(path))
                    return True
                # less than fresh_for/2 ago: younger than fresh_for still, without a look
                if since >= self.fresh_for / 2 and \
                        os.stat(path).st_mtime < now - self.fresh_for:
                    return False
                os.utime(path)
                if len(self._touched) >= 1024:
                    self._touched.clear()
                self._touched[path] = now
                if self._batching:
                    self._freshened.add(os.path.basename(where[0]))
                return True
            except FileNotFoundError:
                # gc or repack replaced that pack: the object may be gone with it
                self._refresh()
            except OSError:
                return True  # read-only: nothing can collect it either
        return False

    @staticmethod
    def _freshen(path: str | Path) -> None:
        # A reused object must look young to a concurrent `gc`, which keeps young objects.
        try:
            os.utime(path)
        except OSError:
            pass

    def sync(self) -> None:
        self.flush()
        dirs, self._dirty_dirs = list(self._dirty_dirs), set()
        if not self.fsync or not dirs:
            return
        if len(dirs) == 1:
            fsync_dir(dirs[0])
        else:  # independent directories: their journal flushes can overlap
            list(self._executor().map(fsync_dir, dirs))

    def take_unsynced_dirs(self) -> list[str]:
        """Wait for batched writes and hand over the directories whose new entries are not
        durable yet (their files' contents are): the caller fsyncs them before anything
        names those objects - `RefStore.update(durable_first=...)` does, in the same round
        of fsyncs as the ref's own files. Empty without fsync."""
        self.flush()
        dirs, self._dirty_dirs = sorted(self._dirty_dirs), set()
        return dirs if self.fsync else []

    def temp_files(self) -> Iterator[tuple[Path, float]]:
        """Leftovers of interrupted writes (safe to delete once old)."""
        for f in [*self.root.glob(".tmp-*"), *self.root.glob("*/.tmp-*")]:
            try:
                yield f, f.stat().st_mtime
            except FileNotFoundError:
                continue

    # ------------------------------------------------------------------ deleting
    def delete(self, oid: ObjectId) -> None:
        self.delete_many([oid])

    def delete_many(self, ids: Iterable[ObjectId], older_than: float | None = None,
                    dry_run: bool = False) -> tuple[int, int]:
        """Delete objects, loose or packed; return (count, bytes freed).

        With `older_than`, an object written or reused (touched) since then is kept; for a
        packed object that is its pack's mtime, re-checked just before the pack is
        replaced, so a concurrent commit that reuses an object keeps it. A pack is rewritten
        without the deleted objects crash-safely: the new pack is durable before the old
        one is removed (a crash in between leaves duplicates, never a loss).
        """
        wanted = set(ids)
        freed: dict[ObjectId, int] = {}
        for oid in sorted(wanted):
            path = self.fspath(oid)
            try:
                st = os.stat(path)
                if older_than is None or st.st_mtime <= older_than:
                    if not dry_run:
                        os.unlink(path)
                    freed[oid] = st.st_size
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise storage_error(exc, self.root.parent, "deleting objects") from exc
        self._refresh()
        # every pack holding one (a crash between a rewrite and the removal of the pack it
        # replaced leaves an object in two packs)
        for name, entries in sorted(self._packs.items()):
            drop = [o for o in entries if o in wanted]
            if not drop:
                continue
            try:
                mtime = os.stat(f"{self._pack_dir}/{name}").st_mtime_ns
            except FileNotFoundError:
                continue
            if older_than is not None and mtime > older_than * 1e9:
                continue
            if dry_run or self._rewrite_pack(name, set(drop), mtime):
                freed.update((o, entries[o][1]) for o in drop)
        return len(freed), sum(freed.values())

    def _rewrite_pack(self, name: str, drop: set[ObjectId], mtime: int | None) -> bool:
        """Replace pack `name` by one without `drop`; False if it changed (was touched or
        removed) meanwhile, in which case nothing is removed."""
        path = f"{self._pack_dir}/{name}"
        entries = self._packs.get(name, {})
        keep = [o for o in entries if o not in drop]
        try:
            if keep:
                with open(path, "rb") as f:
                    objects = [(o, os.pread(f.fileno(), entries[o][1], entries[o][0]))
                               for o in keep]
                new = self.write_pack(objects)
                self.sync()
            else:
                new = None
            if mtime is not None and os.stat(path).st_mtime_ns != mtime:
                return False  # reused meanwhile: keep it (the new pack is a harmless copy)
            if new != name:
                os.unlink(path)
                self._dirty_dirs.add(self._pack_dir)
                self.sync()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, self.root.parent, "rewriting a pack") from exc
        self._refresh()
        return True

    # ------------------------------------------------------------------ maintenance
    def packs(self) -> list[str]:
        """The pack files present (usable or not)."""
        self._refresh()
        return sorted(set(self._packs) | set(self._bad_packs))

    def check(self) -> list[str]:
        """Every pack re-read: trailer, index and each object's bytes against its id."""
        problems = []
        for name in self.packs():
            problems += pack.check(f"{self._pack_dir}/{name}")
        return problems

    def repack(self, checkpoint: Checkpoint | None = None) -> tuple[int, int]:
        """Merge every pack and every small loose object into one pack, crash-safely (the
        new pack is durable before anything it replaces is removed; `checkpoint()` is
        called once the removals are durable too). Returns (objects in the new pack, files
        removed)."""
        self._refresh()
        packs = sorted(self._packs)
        loose = []
        for sub in self.root.iterdir() if self.root.is_dir() else []:
            if len(sub.name) == 2 and sub.is_dir():
                for f in sub.iterdir():
                    oid = sub.name + f.name
                    if is_object_id(oid) and f.stat().st_size < HEADER_SIZE + PACK_MAX:
                        loose.append(ObjectId(oid))
        if len(packs) + len(loose) < 2 or (len(packs) == 1 and not loose):
            return len(self._packed), 0
        return self._merge(packs, loose, checkpoint)

    def consolidate(self, checkpoint: Checkpoint | None = None) -> int:
        """Bound the number of packs a reader must index (one per commit otherwise): once
        AUTO_MERGE packs of one size class exist - below FRESH_MAX (commits' own packs), or
        from there to MERGED_MAX (merged ones) - merge them into one. Packs are merged by
        class so that a commit's bytes are rewritten about twice, not once per merge (a
        merged pack merged again with every 32 new ones rewrote it up to four times: most
        of a small commit's mean cost). Bigger packs are left alone. `checkpoint`: as
        for `repack`. Returns the number of packs merged (0 if nothing was due)."""
        self._refresh(force=False)
        merged = 0
        for _ in range(2):  # one merge per class at most
            due = self._due()
            if due is None:
                break
            self._merge(due, [], checkpoint)  # (a merged pack may complete the next)
            merged += len(due)
        return merged

    def merge_due(self) -> bool:
        """Whether `consolidate` has work once the pack being placed in the background
        (if any) is in place: the caller then waits for it (cheap: no system call)."""
        landing = sum(len(raw) for raw in self._landing.values()) if self._landing else None
        return self._due(landing) is not None

    def _due(self, landing: int | None = None) -> list[str] | None:
        """The packs of the first size class with AUTO_MERGE of them (counting a pack of
        `landing` bytes about to be placed), or None."""
        if len(self._packs) + (landing is not None) < AUTO_MERGE:
            return None  # the common case: not even a look at sizes
        # the packs' size classes, kept from the last look and extended by the packs
        # added since (every commit asks, and adds one); worked out afresh when one went
        packs = tuple(self._packs)  # (in the order they came: a new one is appended)
        cached = self._classes
        if cached is not None and packs[:len(cached[0])] == cached[0]:
            classes, added = cached[1], packs[len(cached[0]):]
        else:
            if len(self._pack_sizes) > 2 * len(self._packs) + AUTO_MERGE:  # merged away
                sizes = dict(self._pack_sizes)  # (copied at once: a placing thread adds)
                self._pack_sizes = {n: v for n, v in sizes.items() if n in self._packs}
            classes, added = ([], []), packs
        if added:
            classes = ([*classes[0]], [*classes[1]])
            gone = False
            for name in added:
                size = self._pack_sizes.get(name)
                if size is None:  # (a pack file never changes: its size is looked up once)
                    try:
                        size = self._pack_sizes[name] = \
                            os.stat(f"{self._pack_dir}/{name}").st_size
                    except FileNotFoundError:
                        gone = True  # (the tables are behind: a fresh look next time)
                        continue
                if size < MERGED_MAX:
                    classes[size >= FRESH_MAX].append(name)
            self._classes = None if gone else (packs, classes)
        extra = landing >= FRESH_MAX if landing is not None and landing < MERGED_MAX \
            else None
        for kind, names in enumerate(classes):
            if len(names) + (extra == kind) >= AUTO_MERGE:
                return sorted(names) + ([""] if extra == kind else [])
        return None

    def _merge(self, packs: list[str], loose: list[ObjectId],
               checkpoint: Checkpoint | None = None) -> tuple[int, int]:
        objects: dict[ObjectId, bytes] = {}
        for oid in loose:
            try:
                raw = self.path(oid).read_bytes()
            except FileNotFoundError:
                continue
            if pack.check_raw(oid, raw) is None:  # a damaged file stays for fsck to report
                objects[oid] = raw
        for name in packs:
            try:
                with open(f"{self._pack_dir}/{name}", "rb") as f:
                    for oid, (offset, length) in self._packs[name].items():
                        objects.setdefault(oid, os.pread(f.fileno(), length, offset))
            except FileNotFoundError:  # another repack or gc replaced it: do nothing
                return 0, 0
        new = self.write_pack(objects.items())
        self.sync()
        removed = 0
        for name in packs:
            if name != new:
                discard(Path(f"{self._pack_dir}/{name}"))
                removed += 1
        for oid in objects.keys() & set(loose):
            discard(self.path(oid))
            self._dirty_dirs.add(os.path.dirname(self.fspath(oid)))
            removed += 1
        self._dirty_dirs.add(self._pack_dir)
        self.sync()  # the removals durable: no name of a removed pack comes back empty
        if checkpoint is not None:
            checkpoint()
        self._refresh()
        return len(objects), removed
