"""Content-addressed object stores: on disk (the real one) and in memory (its test twin).

Writes are atomic (temp file, then rename into place), so an object is never visible
half-written; `sync()` makes everything written so far durable before a ref points at it.
Small objects written inside `batch()` go into one pack file (vrl/pack.py); everything
else is a loose file `objects/ab/cdef...`. Callers never see the difference: they ask for
objects by id.

`FileObjectStore` is made of three parts, one concept each: the loose objects and the
store's interface (here), the pack set with a batch's pack life cycle
(vrl/pack_set.py), and the merging of packs (vrl/pack_merge.py). Writing bytes to a
file, O_DIRECT included, is vrl/direct_io.py.
"""

from __future__ import annotations

import mmap
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from vrl import direct_io, pack, pack_set
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
from vrl.pack_merge import PackMerging
from vrl.pack_set import PackSet


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


if TYPE_CHECKING:  # (concurrent.futures imports logging: ~5-10 ms a read-only command)
    from concurrent.futures import Future, ThreadPoolExecutor


def _check_kind(oid: ObjectId, got: str, wanted: str | None) -> None:
    if wanted is not None and got != wanted:
        raise CorruptObjectError(f"object {oid[:12]} is a {got}, not a {wanted}; run `vrl fsck`")


class FileObjectStore(PackMerging, PackSet, ObjectStore):
    """Objects under a repository's `.vrl/objects`: loose files `ab/cdef...` and packs
    `pack/pack-<name>.pack` (the pack set: `PackSet`, merged by `PackMerging`)."""

    def __init__(self, root: Path, fsync: bool = True, verify_reads: bool = False,
                 fresh_for: float = 1800.0, direct: bool = False,
                 parallel_hashing: bool = True) -> None:
        self.root = Path(root)
        self._root = os.fspath(self.root)
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
        self._init_packs()

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
        if self._batching and size < pack_set.PACK_MAX:  # bound for the batch's pack
            if oid in self._staged or oid in self._landing or self._reuse_packed(oid):
                return False
        elif oid in self._staged or oid in self._landing or final in self._inflight or \
                self._touch(oid, refresh=False):
            return False
        if self._batching and size < pack_set.PACK_MAX:
            if self._staged_bytes + size > pack_set.PACK_SPILL:
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
        later = self._batching and sum(memoryview(c).nbytes for c in chunks) >= pack_set.PACK_MAX
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
            if self.direct and direct_io.write_direct(fd, chunks):
                with self._lock:
                    self.direct_writes += 1
            else:
                for chunk in chunks:
                    direct_io.write_all(fd, chunk)
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

    def touch(self, oid: ObjectId) -> bool:
        """Freshen an existing object's mtime; False if it does not exist."""
        return self._touch(oid, refresh=True)

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
        freed.update(self._delete_packed(wanted, older_than, dry_run))
        return len(freed), sum(freed.values())
