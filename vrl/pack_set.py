"""The pack set of a file object store: the packs under objects/pack/ and their indexes,
kept in memory; and the life cycle of a batch's pack - its small objects staged in memory,
then written as a pack (or sealed for the commit journal, then landed by it) and indexed.

`PackSet` is a part of `FileObjectStore` (vrl/object_store.py), not a store of its own: it
shares the store's state (the open batch, the writes in flight, the fsync setting, loose
paths), and the store's hot paths (`has`, `put`, reads) look at its tables directly rather
than through a call per object.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from vrl import direct_io, pack
from vrl.durable import discard
from vrl.errors import CorruptObjectError, ObjectNotFoundError, VrlError, storage_error
from vrl.objects import ObjectId, hash_object, header

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

# in PackSet._freshened (names of packs freshened in the open batch): the pack
# tables were refreshed in this batch, so `put` does not look again
_TABLES_CHECKED = ""


class PackSet:
    """The packs of a `FileObjectStore` (a part of it: see the module's docstring). The
    packs' indexes are kept in memory and re-read when the pack directory changes (another
    process committed, repacked or collected garbage)."""

    def _init_packs(self) -> None:
        """The pack set's state (called by `FileObjectStore.__init__`)."""
        self._pack_dir = f"{self._root}/pack"
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

    @property
    def pack_dir(self) -> str:
        """The folder of the pack files (objects/pack)."""
        return self._pack_dir

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

    def forget_stored(self) -> None:
        """A gc ran (vrl/gclock.py): forget the packs freshened a moment ago (taken as
        present without a look) and re-read the pack tables, so every later check of what
        is stored looks at the disk."""
        self._touched.clear()
        self._refresh()

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

    # ------------------------------------------------------------------ a batch's pack
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
            direct_io.write_all(fd, b"".join(chunks))
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
