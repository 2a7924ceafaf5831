"""Refs (HEAD, branches, tags, remote-tracking refs) and the reflog.

A ref moves only by compare-and-swap under a lock file: take `<ref>.lock` with O_EXCL,
re-read the ref, check it still holds the expected value, write the new value to a temp
file, fsync, rename it over the ref. Readers never see a torn ref because rename is atomic.

Every move is appended to the ref's reflog before the ref's rename, and both the line and
the temp file are fsynced (together, with any directories the caller names in
`durable_first`, e.g. the pack directory of a commit's objects) before that rename. So a
durable ref move always has its durable reflog line. The converse does not hold: a power
cut after those fsyncs but before the rename (or the directory fsync after it) leaves a
reflog line for a move that never happened, possibly naming a commit whose objects were
not durable yet. `interrupted()` recognises exactly those lines (the chain of moves goes
on from the line's old value), and fsck and gc treat a missing commit named only by them
as the remains of an interrupted update, not as damage. The reflog's lines are read,
appended and taken back by vrl.reflog.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from vrl.durable import discard, fsync_all, fsync_dir, make_dirs
from vrl.errors import (
    InvalidRefNameError,
    RefConflictError,
    RevisionError,
    StorageError,
    VrlError,
    storage_error,
)
from vrl.objects import ObjectId, is_object_id
from vrl.reflog import (  # noqa: F401 - ReflogEntry, interrupted: imported from here too
    ZERO,
    ReflogEntry,
    ReflogRead,
    append_line,
    interrupted,
    read_log_file,
    undo_line,
)

DurableFirst = Iterable[str] | Callable[[], Iterable[str]]
ANY = object()  # "do not check the old value"
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
LOCK_TIMEOUT = 10.0
STALE_LOCK_AGE = 60.0
# A ref is a file named after it, and so is its lock (`.lock`) and reflog: a component must
# fit in a file name (255 bytes) with room for the suffix; a whole name, in a path.
MAX_COMPONENT = 240
MAX_NAME = 1000


def check_ref_name(name: str, what: str = "ref") -> str:
    """Validate a full ref name (refs/heads/x) or short name (x), Git's rules; return it.

    A short name (`what` is "branch", "tag" or "remote") may not start with '-', as in
    Git: on a command line it would be read as an option.
    """
    problem = None
    if not name:
        problem = "it is empty"
    elif name.startswith("-") and what != "ref":
        problem = "it starts with '-'"
    elif name.startswith("/") or name.endswith("/"):
        problem = "it starts or ends with '/'"
    elif "//" in name:
        problem = "it contains '//'"
    elif ".." in name:
        problem = "it contains '..'"
    elif _BAD_CHARS.search(name):
        problem = "it contains a space, a control character or one of ~^:?*[\\"
    elif "@{" in name or name == "@":
        problem = "it contains '@{' or is '@'"
    elif any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        problem = "a component starts with '.' or ends with '.lock'"
    elif name.endswith("."):
        problem = "it ends with '.'"
    elif name == "HEAD" or name.startswith("refs/") and what != "ref":
        problem = "it is reserved"
    elif len(name.encode()) > MAX_NAME:
        problem = f"it is longer than {MAX_NAME} bytes"
    elif any(len(part.encode()) > MAX_COMPONENT for part in name.split("/")):
        problem = f"a component between '/' is longer than {MAX_COMPONENT} bytes"
    if problem:
        raise InvalidRefNameError(f"invalid {what} name {name!r}: {problem}")
    return name


def _repair_hint(name: str) -> str:
    if name.startswith("refs/heads/"):
        return f"delete it with `vrl branch -d {short_ref(name)}` or overwrite it with --force"
    if name.startswith("refs/tags/"):
        return f"delete it with `vrl tag -d {short_ref(name)}` or overwrite it with --force"
    return "fix or delete the file (`vrl fsck` lists damaged refs)"


def _remove_empty_tree(folder: Path) -> bool:
    """Remove `folder` if no file is under it (only empty folders); True if removed."""
    if any(p.is_file() or p.is_symlink() for p in folder.rglob("*")):
        return False
    for sub in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            sub.rmdir()
    try:
        folder.rmdir()
    except OSError:
        return False
    return True


def _hostname() -> str:
    # what socket.gethostname() answers on POSIX, without importing socket (a few ms of
    # every command's start-up)
    return os.uname().nodename


def _proc_start(pid: int) -> str | None:
    """When process `pid` started (clock ticks after boot, Linux): with the pid it names
    one process, even after the pid has been reused. None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split()  # the name (field 2) may hold spaces
    return fields[19].decode() if len(fields) > 19 else None


_OWNER: tuple[int, bytes] | None = None


def _owner() -> bytes:
    """What a lock file says about its owner: pid, host, process start (read once per
    process: /proc costs more than the rest of taking a lock)."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or _OWNER[0] != pid:  # a forked child is another owner
        text = f"{pid} {_hostname()} {_proc_start(pid) or ''}"
        _OWNER = (pid, text.strip().encode() + b"\n")
    return _OWNER[1]


_SECOND: tuple[int, str] = (-1, "")  # a second since the epoch, its text up to the micros


def utc_now() -> str:
    """The time as ISO 8601 UTC with microseconds, e.g. 2026-11-29T09:00:00.000000Z
    (formatted by hand, the text of the second once: strftime costs more than the rest of
    a small commit's metadata, and a commit asks for the time three times)."""
    global _SECOND
    seconds, micros = divmod(time.time_ns() // 1000, 1_000_000)
    second = _SECOND  # (one tuple, replaced whole: another thread sees either, not half)
    if second[0] != seconds:
        t = time.gmtime(seconds)
        second = _SECOND = (seconds, f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
                                     f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.")
    return f"{second[1]}{micros:06d}Z"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RefStore:
    """Refs as small files under `.vrl/`, with a reflog under `.vrl/logs/`."""

    def __init__(self, root: Path, fsync: bool = True, who: str = "") -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.who = who
        # Entered under every ref's lock for a change outside the commit journal, and held
        # throughout it (the repository installs the journal's `exclusive`: checkpointed,
        # and excluding journaled commits, which take no ref lock: see vrl/journal.py)
        self.guard: Callable[[], contextlib.AbstractContextManager] | None = None
        # Called before reading refs or reflogs: this process's last journaled commit may
        # still be materialising them in the background (the journal's `wait`)
        self.barrier: Callable[[], None] | None = None
        self._local = threading.local()  # per thread: fds whose fsync the ref write does
        self._paths: dict[str, Path] = {}  # names already validated
        self._fspaths: dict[str, str] = {}

    # ---------------------------------------------------------------- reading
    def _path(self, name: str) -> Path:
        path = self._paths.get(name)
        if path is None:
            if name != "HEAD":
                if not name.startswith("refs/"):
                    raise InvalidRefNameError(f"invalid ref {name!r}: must start with refs/")
                check_ref_name(name)
            path = self._paths[name] = self.root / name
        return path

    def _fspath(self, name: str) -> str:
        """`_path` as a string (a ref is read several times per commit)."""
        path = self._fspaths.get(name)
        if path is None:
            path = self._fspaths[name] = os.fspath(self._path(name))
        return path

    def read_raw(self, name: str) -> str | None:
        """The ref's content: an object id, `ref: refs/...` for a symbolic ref, or None."""
        if self.barrier is not None:
            self.barrier()
        return self._read_file(name)

    def _read_file(self, name: str) -> str | None:
        """`read_raw` past the barrier."""
        try:
            # os-level reads: a ref is read several times per commit, and a Python file
            # object costs five more system calls than open, read, close
            fd = os.open(self._fspath(name), os.O_RDONLY)
            try:
                # a ref file is replaced by rename, never written in place: a read shorter
                # than asked for has reached its end (no second read to see nothing more)
                data = os.read(fd, 1 << 12)
                while len(data) % (1 << 12) == 0 and (chunk := os.read(fd, 1 << 16)):
                    data += chunk
            finally:
                os.close(fd)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        except OSError as exc:
            raise storage_error(exc, self.root, f"reading {name}") from exc
        # garbage bytes must not crash a reader: they show up as damage (see `problem`);
        # an empty file (what a write torn by a power cut leaves) too: "", not None (unborn)
        return data.decode("utf-8", "replace").strip()

    def read(self, name: str) -> ObjectId | None:
        """Resolve a ref (following HEAD's symbolic link) to an id, or None if unborn."""
        if self.barrier is not None:
            self.barrier()  # (once: a commit in the background is waited for as a whole)
        for _ in range(5):
            raw = self._read_file(name)
            if raw is None:
                return None
            if raw.startswith("ref: "):
                name = raw[5:]
                continue
            if not raw:
                raise RevisionError(f"ref {name} is empty (a write cut short by a crash); "
                                    f"{self._restore_hint(name)}")
            if not is_object_id(raw):
                raise RevisionError(f"ref {name} is damaged: it holds {raw[:20]!r}, not a "
                                    f"commit id; {_repair_hint(name)}")
            return ObjectId(raw)
        raise RevisionError(f"ref {name} is a symbolic-ref loop")

    def _restore_hint(self, name: str) -> str:
        """How to restore a ref whose content was lost: its reflog's last value."""
        try:
            entries = self.read_log(name).entries
        except VrlError:
            entries = []
        last = next((e.new for e in entries if e.new), None)
        if last is None:
            return f"its reflog names no value to restore; {_repair_hint(name)}"
        short = short_ref(name)
        if name.startswith(("refs/heads/", "refs/tags/")):
            verb = "branch -f" if name.startswith("refs/heads/") else "tag -f"
            return f"its reflog's last value restores it: `vrl {verb} {short} {last[:12]}`"
        return f"its reflog's last value is {last[:12]}: write {last} into .vrl/{name}"

    def problem(self, name: str) -> str | None:
        """Why the ref cannot be read (its file holds no commit id), or None if it can."""
        try:
            self.read(name)
        except RevisionError as exc:
            return str(exc)
        return None

    def head_target(self) -> str | None:
        """The branch ref HEAD points to, or None if HEAD is detached."""
        raw = self.read_raw("HEAD")
        return raw[5:] if raw and raw.startswith("ref: ") else None

    def _ref_files(self, prefix: str) -> Iterator[str]:
        if self.barrier is not None:
            self.barrier()
        base = self.root / prefix
        if not base.is_dir():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.endswith(".lock") and \
                    not path.name.startswith(".tmp-"):
                yield path.relative_to(self.root).as_posix()

    def list(self, prefix: str = "refs/") -> dict[str, ObjectId]:
        """Every readable ref under `prefix`; damaged ones are left out (see `damaged`)."""
        out: dict[str, ObjectId] = {}
        for name in self._ref_files(prefix):
            try:
                value = self.read(name)
            except VrlError:
                continue
            if value:
                out[name] = value
        return out

    def damaged(self, prefix: str = "refs/") -> dict[str, str]:
        """Ref files under `prefix` that hold no commit id (or a bad name): name -> why."""
        out: dict[str, str] = {}
        for name in self._ref_files(prefix):
            try:
                self.read(name)
            except VrlError as exc:
                out[name] = str(exc)
        return out

    # ---------------------------------------------------------------- writing
    @contextlib.contextmanager
    def lock(self, name: str, timeout: float | None = None) -> Iterator[None]:
        """Hold the ref's lock file, and (`guard`) the commit journal, checkpointed: a
        replay of it after a power cut must never undo a change made outside it, and a
        journaled commit, which takes no ref lock file, must wait for the change."""
        lock = f"{self._path(name)}.lock"  # a str: this runs on every commit
        deadline = time.monotonic() + (LOCK_TIMEOUT if timeout is None else timeout)
        delay = 0.001
        self.check_new(name, "locking")
        while True:
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                if self._break_stale(Path(lock)):
                    continue
                if time.monotonic() > deadline:
                    raise RefConflictError(
                        f"{name} is locked by another vrl process ({lock}); if none is "
                        "running, delete the lock file and retry") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except OSError as exc:
                raise storage_error(exc, self.root, f"locking {name}") from exc
        try:
            try:
                os.write(fd, _owner())
            except OSError as exc:  # e.g. the disk is full
                raise storage_error(exc, self.root, f"locking {name}") from exc
            finally:
                os.close(fd)
            with contextlib.nullcontext() if self.guard is None else self.guard():
                yield
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)

    def check_new(self, name: str, doing: str = "writing") -> None:
        """Before a ref is written: a new one must not clash with a folder of refs (nor
        be one), and gets its folders (made durable)."""
        path = self._path(name)
        if not os.path.isfile(path):  # an existing ref has its folders and no clash
            self._check_clash(name)
            try:
                make_dirs(path.parent, self.fsync)
            except OSError as exc:
                raise storage_error(exc, self.root, f"{doing} {name}") from exc

    def _check_clash(self, name: str) -> None:
        """Refuse at once a ref that would be both a file and a folder of refs (`x` and
        `x/y`), as Git does; a folder left empty by deleted refs is removed instead."""
        if name == "HEAD":
            return
        parts = name.split("/")
        for i in range(2, len(parts)):
            above = "/".join(parts[:i])
            if (self.root / above).is_file():
                raise RefConflictError(
                    f"cannot create {name}: {above} exists, and a ref cannot also be a folder "
                    f"of refs; delete or rename {short_ref(above)!r} first")
        for base in (self.root, self._log_path("")):
            folder = base / name
            if folder.is_dir() and not _remove_empty_tree(folder):
                inside = next((p.relative_to(self.root).as_posix()
                               for p in sorted(folder.rglob("*")) if p.is_file()), name)
                raise RefConflictError(
                    f"cannot create {name}: {inside} exists, and a ref cannot also be a "
                    f"folder of refs; delete or rename {short_ref(inside)!r} first")

    @staticmethod
    def _is_stale(lock: Path) -> bool | None:
        """True if the lock's owner died or its pid now names another process (same host),
        or the lock is very old; None if it vanished."""
        try:
            text = lock.read_text().split()
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError:
            return False
        dead = False
        if len(text) in (2, 3) and text[1] == _hostname() and text[0].isdigit():
            pid = int(text[0])
            # a live pid may have been reused by an unrelated process: its start time differs
            dead = not _pid_alive(pid) or (len(text) == 3 and
                                           _proc_start(pid) not in (None, text[2]))
        return dead or age > STALE_LOCK_AGE or (not text and age > 2.0)

    def _break_stale(self, lock: Path) -> bool:
        """Remove a stale lock; True if the caller should retry at once.

        Two processes may judge the same lock stale; the first breaks it and takes a fresh
        lock, which the second must not break. So breaking is serialised by an flock on
        `lock-break` (released by the kernel if its holder dies) and staleness is
        re-checked under it: only breakers ever delete a lock they do not own.
        """
        stale = self._is_stale(lock)
        if stale is None:
            return True
        if not stale:
            return False
        try:
            fd = os.open(self.root / "lock-break", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self._is_stale(lock):
                discard(lock)
        finally:
            os.close(fd)  # releases the flock
        return True

    def prepare_file(self, path: Path, text: str, keep_open: bool = False,
                     sync: bool = False) -> tuple[Path, int | None]:
        """Write the ref's temp file (with `sync`, its new folders made durable); return
        it and, with `keep_open`, an open fd of it. `_write_file(tmp=...)` swaps it in:
        the commit journal writes it before its commit point and swaps it in after."""
        tmp = path.with_name(f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
        try:
            make_dirs(path.parent, sync)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, text.encode())
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            discard(tmp)
            raise storage_error(exc, self.root, f"writing {path.name}") from exc
        if keep_open:
            return tmp, fd
        os.close(fd)
        return tmp, None

    def _write_file(self, path: Path, text: str, durable_first: DurableFirst = (),
                    sync: bool | None = None, tmp: Path | None = None) -> None:
        """Write the ref through a temp file renamed over it. The reflog lines appended
        just before (`_pending` fds) are fsynced together with the temp file: all of them
        are durable before the rename, which is all the order needs, and concurrent fsyncs
        share the journal's commits instead of waiting for one each. With `sync=False`
        nothing is fsynced (the commit journal made the change durable already) and the
        file is swapped in (`_exchange`); `tmp`: written already by `prepare_file`."""
        sync = self.fsync if sync is None else sync
        fd = None
        if tmp is None:
            tmp, fd = self.prepare_file(path, text, keep_open=sync, sync=sync)
        try:
            try:
                # (a function waits for the objects' own writes meanwhile)
                folders = durable_first() if callable(durable_first) else durable_first
                if sync:
                    pending = self._local.pending  # set by _write_logged, which closes them
                    for folder in folders:
                        pending.append(os.open(folder, os.O_RDONLY))
                    fsync_all([fd, *pending])
            finally:
                if fd is not None:
                    os.close(fd)
            if sync or not _exchange(tmp, path):
                os.replace(tmp, path)
            if sync:
                fsync_dir(path.parent)
        except OSError as exc:
            discard(tmp)
            raise storage_error(exc, self.root, f"writing {path.name}") from exc
        except BaseException:  # e.g. the objects' own write failed: nothing moved
            discard(tmp)
            raise

    def update(self, name: str, new: ObjectId | None, expected: object = ANY,
               reason: str = "", deref: bool = True, durable_first: DurableFirst = ()
               ) -> ObjectId | None:
        """Compare-and-swap `name` from `expected` to `new` (None deletes); return old value.

        With `deref`, updating HEAD moves the branch HEAD is attached to. `durable_first`
        names directories whose new entries (the objects `new` reaches) must be durable
        before the ref moves: they are fsynced together with the ref's temp file and
        reflog lines, which a journalling filesystem commits at once, instead of in a
        round of their own. It may be a function returning them, called once the ref's
        files are written (it can wait for the objects' own writes meanwhile). Not used
        (nothing synced) when the compare-and-swap fails.
        """
        if deref and name == "HEAD":
            target = self.head_target()
            if target:
                name = target
        with self.lock(name):
            damage = None
            if name == "HEAD":  # detached (or being detached): HEAD holds an id itself
                raw = self.read_raw("HEAD")
                old = ObjectId(raw) if raw and is_object_id(raw) else None
            else:
                try:
                    old, damage = self.read(name), None
                except RevisionError as exc:
                    old, damage = None, str(exc)
            if damage and expected is not ANY:
                raise RefConflictError(damage)
            if expected is not ANY and old != expected:
                raise RefConflictError(
                    f"{short_ref(name)} moved: expected {(expected or 'none')[:12]}, found "
                    f"{(old or 'none')[:12]} (another process updated it); retry")
            path = self._path(name)
            if new is None:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise storage_error(exc, self.root, f"deleting {name}") from exc
                self._remove_log(name)
                self._remove_empty_parents(name)
            else:
                self._write_logged(path, new + "\n",
                                   [(log, old, new) for log in self.logs_for(name)], reason,
                                   durable_first)
        return old

    def logs_for(self, name: str) -> list[str]:
        """The reflogs a move of `name` is logged in: its own, and HEAD's while attached."""
        return [name] + (["HEAD"] if name != "HEAD" and self.head_target() == name else [])

    def _write_logged(self, path: Path, text: str,
                      logs: list[tuple[str, ObjectId | None, ObjectId | None]],
                      reason: str, durable_first: DurableFirst = ()) -> None:
        """Reflog entries first, then the ref (as Git does): if either fails (disk full),
        the entries already appended are taken back, so the error leaves nothing changed."""
        appended: list[tuple[Path, int, int]] = []
        self._local.pending = []  # the appended lines' fds, fsynced with the ref's file
        try:
            for log, old, new in logs:
                appended.append(self._append_log(log, old, new, reason))
            self._write_file(path, text, durable_first)
        except StorageError:
            for entry in reversed(appended):
                self._undo_log(*entry)
            raise
        finally:
            for fd in self._local.pending:
                os.close(fd)
            self._local.pending = None

    def set_head(self, target: str, reason: str = "") -> None:
        """Attach HEAD to a branch ref (`refs/heads/x`) or detach it at a commit id."""
        with self.lock("HEAD"):
            old = self.read("HEAD")
            if is_object_id(target):
                text, new = target + "\n", ObjectId(target)
            else:
                self._path(target)  # validates
                text, new = f"ref: {target}\n", self.read(target)
            log = new and new != old or reason.startswith("checkout")
            self._write_logged(self._path("HEAD"), text, [("HEAD", old, new)] if log else [],
                               reason)

    # ---------------------------------------------------------------- reflog
    def _log_path(self, name: str) -> Path:
        return self.root / "logs" / name

    def log_line(self, old: ObjectId | None, new: ObjectId | None, reason: str) -> bytes:
        """One reflog line (newline-terminated)."""
        return (f"{old or ZERO} {new or ZERO} {utc_now()} {self.who}\t"
                f"{reason.splitlines()[0] if reason else ''}\n").encode()

    def _append_log(self, name: str, old: ObjectId | None, new: ObjectId | None,
                    reason: str, line: bytes | None = None, sync: bool | None = None
                    ) -> tuple[Path, int, int]:
        """Append one line (`line`, or a new one); return (path, size after, bytes
        written) for `_undo_log`. With `sync=False` nothing is fsynced (see `_write_file`)."""
        path = self._log_path(name)
        line = line or self.log_line(old, new, reason)
        sync = self.fsync if sync is None else sync
        return append_line(self.root, name, path, line, sync,
                           getattr(self._local, "pending", None) if sync else None)

    _undo_log = staticmethod(undo_line)  # (path, end, written): take back an appended line

    def _remove_log(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self._log_path(name).unlink()

    def _remove_empty_parents(self, name: str) -> None:
        """After deleting `x/y`, drop the folder `x` if it is empty, so `x` can be a ref."""
        parts = name.split("/")
        for i in range(len(parts) - 1, 2, -1):
            for base in (self.root, self._log_path("")):
                with contextlib.suppress(OSError):
                    (base / "/".join(parts[:i])).rmdir()

    def read_log(self, name: str = "HEAD") -> ReflogRead:
        """Every entry of a reflog (newest first), with every damaged line reported."""
        if self.barrier is not None:
            self.barrier()
        return read_log_file(self.root, name, self._log_path(name))

    def reflog(self, name: str = "HEAD") -> list[ReflogEntry]:
        """Entries newest first; damaged lines are skipped (`read_log` reports them)."""
        return self.read_log(name).entries

    def all_logs(self) -> Iterator[str]:
        base = self.root / "logs"
        if base.is_dir():
            for p in base.rglob("*"):
                if p.is_file():
                    yield p.relative_to(base).as_posix()

    def expire_logs(self) -> None:
        for name in list(self.all_logs()):
            self._remove_log(name)


_RENAMEAT2: list = []  # [the libc function, or None where there is none]


def _exchange(tmp: Path, path: Path) -> bool:
    """Swap `tmp` into place atomically by renameat2(RENAME_EXCHANGE), then remove `tmp`
    (now the old file); False where that is not available (then rename as usual).

    Why: ext4 flushes a file renamed over an existing one ("auto_da_alloc"), which made
    a ref's plain rename cost ~150 us - most of a journaled commit's own file work - and
    an exchange does not. Only for writes the commit journal has made durable already: an
    exchange's durability after a power cut is not part of the three-round protocol."""
    if not _RENAMEAT2:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _RENAMEAT2.append(libc.renameat2)
        except (OSError, AttributeError):
            _RENAMEAT2.append(None)
    renameat2 = _RENAMEAT2[0]
    if renameat2 is None or not path.exists():
        return False
    import ctypes

    if renameat2(-100, os.fsencode(tmp), -100, os.fsencode(path), 2) != 0:  # AT_FDCWD
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
            _RENAMEAT2[0] = None  # this filesystem (or kernel) cannot: never again
            return False
        if err == errno.ENOENT:  # the ref went meanwhile: a plain rename creates it
            return False
        raise OSError(err, os.strerror(err), os.fspath(path))
    discard(tmp)
    return True


def short_ref(name: str) -> str:
    for prefix in ("refs/heads/", "refs/tags/", "refs/remotes/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
