"""The commit journal: one write and one `fdatasync` make a commit durable.

The protocol - the commit point, materialising, checkpoints, recovery - and the invariants
it keeps are stated in docs/durability.md; this module carries them out. In short: a
commit appends one record (its pack of small objects, the ref's move, its reflog lines) and
fdatasyncs the journal; the pack, lines and ref are then written without fsync by a
background thread that holds the journal until they are (readers wait for it: `wait`,
installed as the ref store's and object store's barrier; other processes see in the
header that a record is not materialised and wait for the journal's lock). A journaled
commit takes no ref lock file: every ref change outside the journal holds it throughout
and checkpoints first (`exclusive`); a step that removes files holds it and checkpoints
before removing anything (`maintaining`).

The file - a header, then records - and how its records are read back: vrl/journal_format.py.
Records are written over space the journal already has - written, zero-filled, fsynced -
where there is room: the fdatasync of an overwrite then commits no file metadata, which
cuts it by about a third (~0.39 -> ~0.28 ms here). `vrl init` makes INIT_ROOM of it; more
is added in the background once a record did not fit (zeros, doubling), and kept: a
checkpoint starts a new epoch at offset 64, which makes every older record stale without
erasing it.

Recovery, checkpoints and why re-applying is idempotent: docs/durability.md.

The journal is used where a reboot can be recognised (Linux: /proc's boot id) and fsync is
on; `core.journal = false` turns it off (the three-round protocol then runs as before).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

from vrl.durable import discard, fdatasync, fsync, fsync_all, fsync_dir
from vrl.errors import RefConflictError, RevisionError, StorageError, VrlError, storage_error
from vrl.journal_format import (  # noqa: F401 - the format's names, imported from here too
    HEADER,
    LEGACY_MAGIC,
    LEGACY_RECORD,
    LEGACY_RECORD_MAGIC,
    MAGIC,
    RECORD,
    RECORD_MAGIC,
    Header,
    Record,
    _digest,
    _meta_json,
    _well_formed,
    at_record,
    encode,
    new_epoch,
    parse,
    pwrite_all,
    read_all,
    read_header,
)
from vrl.journal_handles import (
    BACKGROUND,
    HANDLES,
    HANDLES_LOCK,
    JOBS,
    RELEASED,
    Handle,
    close_released,
    hand_off,
)
from vrl.object_store import FileObjectStore
from vrl.objects import ObjectId, is_object_id
from vrl.refs import ANY, LOCK_TIMEOUT, RefStore, short_ref

JOURNAL_MAX = 8 << 20  # checkpoint once the records pass this (bounds a replay, the file)
ROOM_MIN = 64 << 10  # the least space a journal that takes a second record gets ahead
# A new journal's room (written at `vrl init`, ~2 ms): a first commit of up to ~1 MiB - a
# small policy's whole state - is written in place too, 0.4 ms sooner for 0.7 MB here
# (as PostgreSQL zero-fills its WAL segments before use)
INIT_ROOM = 1 << 20
# A pack this big is fsynced in its own file in the record's round instead of inside the
# record (it would be written twice). Below it, the record is cheaper: one fdatasync of
# the journal, where a pack file of its own costs a file, a rename and three fsyncs on the
# commit's path (a small policy's 0.7 MB first commit: ~0.5 ms less).
EXTERNAL_MIN = 4 << 20
BOOT_ID = "/proc/sys/kernel/random/boot_id"



def boot_id() -> str | None:
    """This machine's boot id (changes at every boot), or None where there is none."""
    try:
        with open(BOOT_ID, "rb") as f:
            return f.read().decode("ascii").strip()[:40] or None
    except (OSError, UnicodeDecodeError):
        return None


class Journal:
    """The commit journal of one repository (see the module's docstring). One class of
    ~500 lines for a reason: committing, materialising, checkpointing and recovering all
    work on the same held handle (its tail, epoch, pending write-out) under one lock;
    split, each part would reach into the others' state."""

    def __init__(self, vrl_dir: Path, objects: FileObjectStore, refs: RefStore) -> None:
        self.path = os.path.realpath(Path(vrl_dir) / "journal")
        self.vrl_dir = Path(vrl_dir)
        self.objects = objects
        self.refs = refs
        self.boot = boot_id()
        self._uses: set[Handle] = set()  # the handles this object counts as a user of

    @property
    def usable(self) -> bool:
        return self.boot is not None

    # ------------------------------------------------------------------ the file
    def _handle(self) -> Handle:
        with HANDLES_LOCK:
            close_released()
            handle = HANDLES.get(self.path)
            # forked (the parent's), or the journal deleted since (a repository removed
            # and made again at this path): not the file to write to
            if handle is not None and (handle.pid != os.getpid() or
                                       os.fstat(handle.fd).st_nlink == 0):
                del HANDLES[self.path]
                handle = None
            if handle is None:
                if not os.path.exists(self.path):
                    self._create()
                try:
                    handle = HANDLES[self.path] = Handle(self.path)
                except OSError as exc:
                    raise storage_error(exc, self.vrl_dir, "opening the commit journal"
                                        ) from exc
            if handle not in self._uses:
                handle.users += 1
                self._uses.add(handle)
                weakref.finalize(self, RELEASED.append, handle)
            return handle

    def _create(self) -> None:
        """Create the journal whole or not at all (a repository `init` made before the
        journal existed gets it at its first journaled commit)."""
        try:
            create_journal(self.vrl_dir)
            fsync_dir(self.vrl_dir)
        except OSError as exc:
            raise storage_error(exc, self.vrl_dir, "creating the commit journal") from exc

    def _header(self, applied: int, epoch: int) -> bytes:
        return HEADER.pack(MAGIC, (self.boot or "").encode().ljust(40), applied, epoch)

    @contextlib.contextmanager
    def held(self) -> Iterator[Handle]:
        """Hold the journal (reentrant), with every record materialised."""
        handle = self._handle()
        if handle.owner == threading.get_ident():
            handle.depth += 1
            try:
                yield handle
            finally:
                handle.depth -= 1
            return
        self._acquire(handle)
        try:
            yield handle
        finally:
            self._release(handle)

    def _acquire(self, handle: Handle) -> None:
        """Take the journal: other threads (and a record still being materialised in the
        background) by the handle's lock, other processes by flock; then settle."""
        handle.lock.acquire()
        try:
            self._lock(handle.fd)
        except BaseException:
            handle.lock.release()
            raise
        handle.owner, handle.depth = threading.get_ident(), 1
        try:
            self._settle(handle)
        except BaseException:
            self._release(handle)
            raise
        handle.failed = False

    @staticmethod
    def _release(handle: Handle) -> None:
        handle.owner, handle.depth = None, 0
        try:
            fcntl.flock(handle.fd, fcntl.LOCK_UN)
        finally:
            handle.lock.release()

    def wait(self) -> None:
        """Wait until every commit reported so far is materialised (its ref, reflog lines
        and pack in place): called before refs are read and when an object is missing. In
        this process, its last commit's background work; in another one, a record
        appended and not yet materialised (the header says so) - then the journal is
        taken, which waits for its holder (or finishes what a dead one left)."""
        handle = HANDLES.get(self.path)
        if handle is not None and handle.pid == os.getpid():
            if handle.owner == threading.get_ident():
                return  # this thread holds it: everything is materialised (or is being)
            pending = handle.pending
            if pending is not None:
                job = JOBS.pop(handle, None)
                if job is not None:  # not started yet: do it here, not wait for a wakeup
                    job()
                else:  # the write-out thread has it: done when it lets go
                    with pending:
                        pass
            if handle.failed:
                try:
                    with self.held():  # re-applies it
                        return
                except StorageError as exc:
                    raise StorageError(f"a commit recorded in the commit journal could "
                                       f"not be written out yet: {exc}") from exc
        if self._behind(handle):
            # read-only, or held for too long: this reader reads what is in place
            with contextlib.suppress(OSError, VrlError), self.held():
                pass

    def _behind(self, handle: Handle | None) -> bool:
        """Whether the journal holds records not materialised yet (a commit of another
        process between its commit point and the end of its background work)."""
        if not self.usable:
            return False
        mine = handle is not None and handle.pid == os.getpid()
        try:
            fd = handle.fd if mine else os.open(self.path, os.O_RDONLY)  # type: ignore
        except OSError:
            return False
        try:
            return self._unsettled(fd)[1]
        except OSError:
            return False
        finally:
            if not mine:
                os.close(fd)

    def _unsettled(self, fd: int) -> tuple[Header | None, bool]:
        """The header, and whether records wait to be materialised: from the header's
        offset on (after a reboot: from the first record on). Two reads."""
        header = read_header(os.pread(fd, HEADER.size, 0))
        if header is None or header.legacy:
            size = os.fstat(fd).st_size
            return header, size > HEADER.size and (
                header is None or header.boot != self.boot or header.applied < size)
        start = header.applied if header.boot == self.boot else HEADER.size
        return header, at_record(os.pread(fd, RECORD.size, start), header)

    def _lock(self, fd: int) -> None:
        """flock the journal; like a ref's lock, give up after LOCK_TIMEOUT seconds (a
        holder that is stopped, not dead, would otherwise make everyone wait forever)."""
        deadline = None
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if deadline is None:  # (held by another process: from now on)
                    deadline = time.monotonic() + LOCK_TIMEOUT
                elif time.monotonic() > deadline:
                    raise RefConflictError(
                        f"the commit journal of {self.vrl_dir} is held by another vrl "
                        f"process for over {LOCK_TIMEOUT:.0f} s (stopped?); resume or end "
                        "it and retry") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def _settle(self, handle: Handle) -> None:
        """Re-apply what a dead holder (or a power cut) left unmaterialised; learn where the
        next record goes."""
        fd = handle.fd
        header, unsettled = self._unsettled(fd)
        from_boot = header is not None and not header.legacy and \
            header.boot == self.boot and header.applied >= HEADER.size
        if from_boot:
            handle.tail, handle.epoch = header.applied, header.epoch  # type: ignore
            if not unsettled:
                return  # the common case: everything is in place
        # from the materialised offset on; after a reboot (or an upgrade), from the first
        # record on: files written since the last checkpoint may have been lost
        start = handle.tail if from_boot else HEADER.size
        data = read_all(fd, os.fstat(fd).st_size)
        records, end = parse(data, start)
        for i, record in enumerate(records):
            if record.external and i == len(records) - 1 and \
                    not self.objects.pack_intact(record.pack) and \
                    not self.objects.has(record.new):
                # its commit's round of fsyncs never ended (a record is appended only
                # after the one before is done, so only the last can be unfinished):
                # it was not reported; its half-written pack goes with it. An earlier
                # record's pack that is gone was merged into another (its commit is
                # there) or damaged: the record stands either way, and fsck reports
                # what is missing - a later, reported commit is never dropped.
                discard(Path(self.objects.pack_dir) / record.pack)
                records, end = records[:i], record.offset
                break
            self._apply(record, recovering=True)
        if not from_boot:  # after a reboot (or an upgrade): all durable, then afresh
            self._checkpoint(handle, records, drop=header is None or header.legacy)
            return
        if at_record(data[end:end + RECORD.size], header):  # type: ignore[arg-type]
            # a torn record (never durable, nor reported), or one whose pack is not
            # whole: no reader may take it for a pending one
            os.pwrite(fd, bytes(RECORD.size), end)
        os.pwrite(fd, self._header(end, handle.epoch), 0)
        handle.tail = end

    # ------------------------------------------------------------------ commit
    def commit(self, name: str, new: ObjectId, expected: object, reason: str,
               before_append: Callable[[], None],
               after_append: Callable[[], None] | None = None) -> ObjectId | None:
        """Compare-and-swap ref `name` (HEAD: its branch) to `new` through the journal,
        with the object store's sealed pack; return the old value. `before_append` makes
        everything outside the record durable first (the big tensors' files).

        The commit is durable, and is returned, once its record is: the pack, reflog
        lines and ref are then written by a background thread, which holds the journal
        until they are (other processes wait for it; this one's reads of refs and packs
        do, by `wait`). No ref lock file is taken: every ref change outside the journal
        holds the journal throughout (`exclusive`). `after_append` runs once the record
        is durable, before that thread starts (the commit lets go of the gc lock there)."""
        refs = self.refs
        handle = self._handle()
        nested = handle.owner == threading.get_ident()
        if not nested:
            self._acquire(handle)
        fd = handle.fd
        handed = False
        sealed = pack_fd = None
        try:
            seen = handle.seen
            if seen is not None and seen[0] == handle.epoch and seen[1] == handle.tail:
                target, values = seen[2], seen[3]
            else:  # (HEAD read once, under the lock)
                target, values = refs.head_target(), {}
            if name == "HEAD":
                name = target or "HEAD"
            try:
                old = values[name] if name in values else \
                    refs.read_raw(name) if name == "HEAD" else refs.read(name)
            except RevisionError as exc:
                raise RefConflictError(str(exc)) from None
            if old is not None and not is_object_id(old):  # HEAD holds a symbolic ref
                old = None
            if expected is not ANY and old != expected:
                raise RefConflictError(
                    f"{short_ref(name)} moved: expected {(expected or 'none')[:12]}, found "
                    f"{(old or 'none')[:12]} (another process updated it); retry")
            if old is None and name != "HEAD":
                refs.check_new(name)  # a new ref: no clash with a folder, its folders made
            # (as refs.logs_for: its own reflog, and HEAD's while HEAD is attached to it)
            line = refs.log_line(old, new, reason)  # (one line, in each log)
            logs = [(log, line) for log in ([name, "HEAD"] if name != "HEAD" and
                                            target == name else [name])]
            sealed = self.objects.take_sealed()
            file, chunks, nbytes = sealed[:3] if sealed else (None, [], 0)
            # a big pack (4 MiB or more) is written once, to its own file, fsynced in the
            # same round as the record, instead of into the journal and then again
            pack_fd = self.objects.place_pack(file, chunks, keep_open=True) \
                if file and nbytes >= EXTERNAL_MIN else None
            external = pack_fd is not None
            try:
                record = encode(name, old, new, logs, file, [] if external else chunks,
                                external, handle.epoch, 0 if external else nbytes)
                size = handle.tail
                end = size + RECORD.size + len(record[1]) + (0 if external else nbytes)
                before_append()
                self._append(fd, record, size, end - size, [pack_fd, self.objects.pack_dir]
                             if external else [])
            except BaseException:
                if external:
                    discard(Path(self.objects.pack_dir) / file)
                self.objects.forget_landing()
                raise
            done = Record(size, end, name, old, new, logs, file, chunks, external)
            if after_append is not None:
                after_append()
            if nested:
                self._finish(handle, done, sealed, target)
            else:  # the rest off the caller's path; the journal is handed over with it
                handle.owner = BACKGROUND
                handle.pending = threading.Lock()
                handle.pending.acquire()
                handed = True
                hand_off(handle, functools.partial(self._finish, handle, done, sealed,
                                                    target, release=True))
        finally:
            if pack_fd is not None:
                os.close(pack_fd)
            if not nested and not handed:
                self._release(handle)
        return old

    def _finish(self, handle: Handle, record: Record, sealed: tuple | None,
                target: str | None, release: bool = False) -> None:
        """Materialise a durable record (then mark it so in the header). A failure leaves
        it to the next holder of the journal, which re-applies it as after a crash: the
        commit was reported, and stands. `target`: HEAD's branch as the commit read it."""
        if release:
            handle.owner = threading.get_ident()  # (its own reads must not wait for it)
        handle.seen = None
        try:
            self._apply(record, recovering=False, sealed=sealed)
            os.pwrite(handle.fd, self._header(record.end, handle.epoch), 0)
            handle.tail = record.end
            if record.end > JOURNAL_MAX:
                self._checkpoint(handle, parse(read_all(handle.fd, record.end))[0])
            elif record.offset > HEADER.size:  # a second record: room for the next ones
                self._make_room(handle.fd, record)
            handle.seen = (handle.epoch, handle.tail, target, {record.ref: record.new})
        except BaseException:  # noqa: BLE001 - re-applied (and reported) by the next holder
            handle.failed = True
        finally:
            if release:
                pending, handle.pending = handle.pending, None
                self._release(handle)
                if pending is not None:
                    pending.release()

    def _append(self, fd: int, record: list, size: int, nbytes: int,
                also: list | None = None) -> None:
        """The commit point: the record (`nbytes`) written at `size` and fdatasynced (with
        `also`, fds or paths, fsynced in the same round); on failure, taken back."""
        opened: list[int] = []
        try:
            pwrite_all(fd, record, size, nbytes)
            if also:
                opened = [os.open(p, os.O_RDONLY) for p in also if isinstance(p, str)]
                fsync_all([fd, *[f for f in also if isinstance(f, int)], *opened])
            else:
                fdatasync(fd)
        except OSError as exc:
            self._take_back(fd, size)
            raise storage_error(exc, self.vrl_dir, "writing the commit journal") from exc
        finally:
            for f in opened:
                os.close(f)

    @staticmethod
    def _take_back(fd: int, size: int) -> None:
        """Invalidate a record written at `size` that failed (nothing was reported)."""
        with contextlib.suppress(OSError):
            os.pwrite(fd, bytes(RECORD.size), size)
            fdatasync(fd)

    @staticmethod
    def _make_room(fd: int, record: Record) -> None:
        """Zero-fill (and fsync) space after `record`, so that the next records overwrite
        written space: their fdatasync then commits no file metadata. Once less than two
        records like it fit, the file doubles (at least four such records ahead), up to
        where records like it stop (a checkpoint follows the record that passes
        JOURNAL_MAX). Only an optimisation: a failure (a full disk) is ignored."""
        with contextlib.suppress(OSError):
            size = os.fstat(fd).st_size
            used = record.end - record.offset
            if size - record.end >= 2 * used:
                return
            target = min(max(record.end + 4 * used, 2 * size, ROOM_MIN),
                         JOURNAL_MAX + 2 * used + ROOM_MIN)
            target = -(-target // ROOM_MIN) * ROOM_MIN
            zeros = bytes(min(target - size, 1 << 20)) if target > size else b""
            while size < target:
                size += os.pwrite(fd, zeros[:target - size], size)
            fdatasync(fd)

    # ------------------------------------------------------------------ applying
    def _apply(self, record: Record, recovering: bool, sealed: tuple | None = None
               ) -> None:
        """Materialise a record: its pack, reflog lines and ref, without fsync. Recovering,
        only what is missing (see the module's docstring); else `sealed` is the object
        store's pack the record holds (`take_sealed`)."""
        refs = self.refs
        if record.pack:
            if not recovering and sealed is not None:
                self.objects.land_sealed(sealed, placed=record.external)
            elif not record.external and \
                    not self.objects.pack_bytes_equal(record.pack, record.body):
                self.objects.place_pack(record.pack, [record.body])
        if recovering:
            current = refs.read_raw(record.ref)
            # a ref whose content a power cut lost reads as empty (None) or garbage
            damaged = not is_object_id(current or "") and (
                current is not None or os.path.exists(refs._path(record.ref)))
            if current != record.new and current != record.old and not damaged:
                return  # moved on since (a later record moves it from here)
        appended = []
        try:
            for log, line in record.logs:
                if recovering and _has_line(refs._log_path(log), line):
                    continue
                appended.append(refs._append_log(log, record.old, record.new, "", line=line,
                                                 sync=False))
            if not recovering or refs.read_raw(record.ref) != record.new:
                refs._write_file(refs._path(record.ref), record.new + "\n", sync=False)
        except StorageError:
            for entry in reversed(appended):
                refs._undo_log(*entry)
            raise

    # ------------------------------------------------------------------ checkpoint
    def checkpoint(self) -> None:
        """Make everything the records materialised durable, then empty the journal."""
        if not self.usable or not os.path.exists(self.path):
            return
        with self.exclusive():
            pass

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the journal, checkpointed, for a ref change made outside it (`RefStore.
        guard`): a replay must never undo that change, and no journaled commit (which
        takes no ref lock file) may run during it."""
        with self.held() as handle:
            handle.seen = None
            if handle.tail > HEADER.size:
                self._checkpoint(handle, parse(read_all(handle.fd, handle.tail))[0])
            else:  # a new epoch all the same: it tells every process that refs change
                handle.epoch = new_epoch()  # (no fsync: there is no record to make stale)
                try:
                    os.pwrite(handle.fd, self._header(HEADER.size, handle.epoch), 0)
                except OSError as exc:
                    raise storage_error(exc, self.vrl_dir, "writing the commit journal"
                                        ) from exc
            yield

    @contextlib.contextmanager
    def maintaining(self) -> Iterator[Callable[[], None]]:
        """Hold the journal for a step that removes files (a pack merge, repack): no
        record is appended meanwhile. Yields `checkpoint()`, which the step calls once its
        new files are durable and the removal of the old ones is too. Until then a replay
        puts back what a record needs from the journal itself (a record's pack is a copy
        of its body; an external pack's objects are in the new pack, and its record stands
        either way: `_settle`); from then on no record is replayed (docs/durability.md,
        invariant 3)."""
        with self.held() as handle:
            handle.seen = None

            def checkpoint() -> None:
                if handle.tail > HEADER.size:
                    self._checkpoint(handle, parse(read_all(handle.fd, handle.tail))[0])

            yield checkpoint

    def _checkpoint(self, handle: Handle, records: list[Record], drop: bool = False
                    ) -> None:
        """Make what `records` materialised durable, then start a new epoch at offset 64
        (every record so far is stale). `drop`: also cut the file (a legacy journal's
        records have no epoch), as where it grew past what the records use."""
        files: set[str] = set()
        dirs: set[str] = set()
        vrl = os.fspath(self.vrl_dir)
        for record in records:
            named = [os.fspath(self.refs._path(record.ref))]
            named += [os.fspath(self.refs._log_path(log)) for log, _ in record.logs]
            if record.pack:
                named.append(f"{self.objects.pack_dir}/{record.pack}")
            for path in named:
                files.add(path)
                folder = os.path.dirname(path)
                while len(folder) > len(vrl):  # new folders' entries in their parents too
                    dirs.add(folder)
                    folder = os.path.dirname(folder)
        dirs.add(vrl)
        fds = []
        fd = handle.fd
        try:
            for path in sorted(files | dirs):
                with contextlib.suppress(FileNotFoundError):  # e.g. a pack merged since
                    fds.append(os.open(path, os.O_RDONLY))
            if fds:
                fsync_all(fds)
        except OSError as exc:
            raise storage_error(exc, self.vrl_dir, "checkpointing the commit journal"
                                ) from exc
        finally:
            for f in fds:
                os.close(f)
        epoch = new_epoch()
        try:
            if drop or os.fstat(fd).st_size > 2 * (JOURNAL_MAX + EXTERNAL_MIN + ROOM_MIN):
                os.ftruncate(fd, HEADER.size)
            os.pwrite(fd, self._header(HEADER.size, epoch), 0)
            fsync(fd)
        except OSError as exc:
            raise storage_error(exc, self.vrl_dir, "checkpointing the commit journal"
                                ) from exc
        handle.tail, handle.epoch = HEADER.size, epoch

    def recover(self) -> None:
        """At open: finish what a dead holder or a power cut left (cheap when nothing is)."""
        if self._behind(HANDLES.get(self.path)):
            with contextlib.suppress(OSError, StorageError):  # read-only: readers see the rest
                with self.held():
                    pass


def create_journal(vrl_dir: Path) -> None:
    """Write an empty journal with INIT_ROOM of zero-filled room (fsynced, then linked
    into place: never half made; an existing one is kept). The caller makes `vrl_dir`'s
    entry durable."""
    path = os.fspath(Path(vrl_dir) / "journal")
    tmp = f"{path}.tmp-{os.getpid()}-{os.urandom(6).hex()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, HEADER.pack(MAGIC, (boot_id() or "").encode().ljust(40),
                                     HEADER.size, new_epoch()) + bytes(INIT_ROOM))
            fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # another process was first
            os.link(tmp, path)
    finally:
        discard(Path(tmp))


def _has_line(path: Path, line: bytes) -> bool:
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return data.startswith(line) or b"\n" + line in data


