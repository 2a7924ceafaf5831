"""Content-addressed object stores: on disk (the real one) and in memory (its test twin).

Writes are atomic (temp file, then rename into place), so an object is never visible
half-written; `sync()` makes everything written so far durable before a ref points at it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import blake3

from vrl.errors import CorruptObjectError, ObjectNotFoundError, StorageError
from vrl.objects import HEADER_SIZE, ObjectId, hash_object, header, is_object_id, parse_header


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


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard(path: Path) -> None:
    """Remove a temp file if it is there, never raising: on a read-only filesystem even a
    file that does not exist gives EROFS, which must not hide the error being reported."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def storage_error(exc: OSError, root: Path, doing: str) -> StorageError:
    """Turn a low-level OSError into a one-line StorageError that says what to do."""
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return StorageError(f"disk full while {doing} in {root}: nothing was changed; "
                            "free some space (or run `vrl gc`) and retry")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StorageError(f"repository {root} is read-only ({os.strerror(exc.errno)}) "
                            f"while {doing}; use a writable copy or fix its permissions")
    return StorageError(f"I/O error while {doing} in {root}: {exc.strerror or exc}")


class FileObjectStore(ObjectStore):
    """Objects as files `objects/ab/cdef...` under a repository's `.vrl` directory."""

    def __init__(self, root: Path, fsync: bool = True, verify_reads: bool = False) -> None:
        self.root = Path(root)
        self._root = os.fspath(self.root)
        self.fsync = fsync
        self.verify_reads = verify_reads
        self._dirty_dirs: set[str] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._batching = False
        self._pending: list[Future] = []
        self._inflight: set[str] = set()

    def path(self, oid: ObjectId) -> Path:
        return Path(self.fspath(oid))

    def fspath(self, oid: ObjectId) -> str:
        """The object's file path as a string (Path objects are slow in hot loops)."""
        if not is_object_id(oid):
            raise ObjectNotFoundError(f"{oid!r} is not an object id")
        return f"{self._root}/{oid[:2]}/{oid[2:]}"

    def has(self, oid: ObjectId) -> bool:
        return os.path.isfile(self.fspath(oid))

    def read(self, oid: ObjectId) -> tuple[str, bytes]:
        try:
            raw = self.path(oid).read_bytes()
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {oid[:12]} not found in {self.root}") from None
        kind, size = parse_header(raw)
        payload = raw[HEADER_SIZE:]
        if len(payload) != size:
            raise CorruptObjectError(f"object {oid[:12]} is truncated ({len(payload)} of {size} "
                                     "bytes); run `vrl fsck`")
        if self.verify_reads and blake3.blake3(raw).hexdigest() != oid:
            raise CorruptObjectError(f"object {oid[:12]} is corrupted: its bytes do not match "
                                     "its id (run `vrl fsck`)")
        return kind, payload

    def kind_and_size(self, oid: ObjectId) -> tuple[str, int]:
        try:
            with open(self.path(oid), "rb") as f:
                return parse_header(f.read(HEADER_SIZE))
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {oid[:12]} not found in {self.root}") from None

    def write(self, kind: str, payload: bytes | memoryview, oid: ObjectId | None = None
              ) -> ObjectId:
        oid = oid or hash_object(kind, payload, threads=True)
        final = self.fspath(oid)
        if final in self._inflight:
            return oid
        if os.path.exists(final):
            self._freshen(final)
            return oid
        self.write_raw(final, [header(kind, memoryview(payload).nbytes), payload], "object")
        return oid

    def write_raw(self, final: str | Path, chunks: list[bytes | memoryview], what: str
                  ) -> None:
        """Atomically create `final` from chunks: temp file in the same directory, fsync,
        rename. Inside `batch()` the fsync and rename run on a worker thread, so flushing
        one object overlaps with writing the next."""
        final = os.fspath(final)
        folder = os.path.dirname(final)
        tmp = f"{folder}/.tmp-{os.getpid()}-{secrets.token_hex(6)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        try:
            try:
                fd = os.open(tmp, flags, 0o444)
            except FileNotFoundError:  # first object in this fan-out directory
                os.makedirs(folder, exist_ok=True)
                # the new directory's own entry must be durable too (sync() fsyncs it)
                self._dirty_dirs.add(os.path.dirname(folder))
                fd = os.open(tmp, flags, 0o444)
            try:
                for chunk in chunks:
                    _write_all(fd, chunk)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing {what} "
                                f"{os.path.basename(folder)}{os.path.basename(final)[:10]}"
                                ) from exc
        except BaseException:
            discard(Path(tmp))
            raise
        if self._batching and self.fsync:
            self._inflight.add(final)
            self._pending.append(self._executor().submit(self._finish, fd, tmp, final, what))
        else:
            self._finish(fd, tmp, final, what)

    def _finish(self, fd: int, tmp: str, final: str, what: str) -> None:
        try:
            try:
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            discard(Path(tmp))
            raise storage_error(exc, self.root.parent, f"writing {what} "
                                f"{os.path.basename(final)[:10]}") from exc
        self._dirty_dirs.add(os.path.dirname(final))

    def _executor(self) -> ThreadPoolExecutor:
        # One pool for the store's lifetime: starting threads per commit cost more than
        # the small snapshots they flushed.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(4, thread_name_prefix="vrl-fsync")
        return self._pool

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Overlap the fsyncs of many object writes; every object is in place on exit."""
        if self._batching or not self.fsync:
            yield
            return
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self.flush()

    def flush(self) -> None:
        """Wait for batched writes; re-raise the first failure."""
        pending, self._pending = self._pending, []
        error = None
        for future in pending:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        self._inflight.clear()
        if error is not None:
            raise error

    def touch(self, oid: ObjectId) -> bool:
        """Freshen an existing object's mtime; False if it does not exist."""
        path = self.fspath(oid)
        if not os.path.isfile(path):
            return False
        self._freshen(path)
        return True

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
            _fsync_dir(dirs[0])
        else:  # independent directories: their journal flushes can overlap
            list(self._executor().map(_fsync_dir, dirs))

    def delete(self, oid: ObjectId) -> None:
        self.path(oid).unlink(missing_ok=True)

    def ids(self) -> Iterator[ObjectId]:
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if len(sub.name) == 2 and sub.is_dir():
                for f in sorted(sub.iterdir()):
                    oid = sub.name + f.name
                    if is_object_id(oid):
                        yield ObjectId(oid)

    def mtime(self, oid: ObjectId) -> float:
        return self.path(oid).stat().st_mtime

    def temp_files(self) -> Iterator[tuple[Path, float]]:
        """Leftovers of interrupted writes (safe to delete once old)."""
        for f in self.root.glob("*/.tmp-*"):
            try:
                yield f, f.stat().st_mtime
            except FileNotFoundError:
                continue

    def verify(self, oid: ObjectId) -> str:
        path = self.path(oid)
        try:
            with open(path, "rb") as f:
                kind, size = parse_header(f.read(HEADER_SIZE))
                hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
                hasher.update(header(kind, size))
                got = 0
                while chunk := f.read(1 << 24):
                    hasher.update(chunk)
                    got += len(chunk)
        except FileNotFoundError:
            raise ObjectNotFoundError(f"object {oid[:12]} not found") from None
        if got != size:
            raise CorruptObjectError(f"object {oid[:12]} is truncated ({got} of {size} bytes)")
        if hasher.hexdigest() != oid:
            raise CorruptObjectError(f"object {oid[:12]} is corrupted: its bytes do not match "
                                     "its id")
        return kind
