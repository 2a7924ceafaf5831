"""Refs (HEAD, branches, tags, remote-tracking refs) and the reflog.

A ref moves only by compare-and-swap under a lock file: take `<ref>.lock` with O_EXCL,
re-read the ref, check it still holds the expected value, write the new value to a temp
file, fsync, rename it over the ref. Readers never see a torn ref because rename is atomic.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from vrl.errors import InvalidRefNameError, RefConflictError, RevisionError, StorageError
from vrl.object_store import _fsync_dir, discard, storage_error
from vrl.objects import ObjectId, is_object_id

ZERO = "0" * 64
ANY = object()  # "do not check the old value"
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
LOCK_TIMEOUT = 10.0
STALE_LOCK_AGE = 60.0


def check_ref_name(name: str, what: str = "ref") -> str:
    """Validate a full ref name (refs/heads/x) or short name (x), Git's rules; return it."""
    problem = None
    if not name:
        problem = "it is empty"
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
    if problem:
        raise InvalidRefNameError(f"invalid {what} name {name!r}: {problem}")
    return name


@dataclass(frozen=True)
class ReflogEntry:
    old: ObjectId | None
    new: ObjectId | None
    time: str
    who: str
    reason: str


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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

    # ---------------------------------------------------------------- reading
    def _path(self, name: str) -> Path:
        if name != "HEAD":
            if not name.startswith("refs/"):
                raise InvalidRefNameError(f"invalid ref {name!r}: must start with refs/")
            check_ref_name(name)
        return self.root / name

    def read_raw(self, name: str) -> str | None:
        """The ref's content: an object id, `ref: refs/...` for a symbolic ref, or None."""
        try:
            text = self._path(name).read_text().strip()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return text or None

    def read(self, name: str) -> ObjectId | None:
        """Resolve a ref (following HEAD's symbolic link) to an id, or None if unborn."""
        for _ in range(5):
            raw = self.read_raw(name)
            if raw is None:
                return None
            if raw.startswith("ref: "):
                name = raw[5:]
                continue
            if not is_object_id(raw):
                raise RevisionError(f"ref {name} holds {raw[:20]!r}, not a commit id "
                                    "(run `vrl fsck`)")
            return ObjectId(raw)
        raise RevisionError(f"ref {name} is a symbolic-ref loop")

    def head_target(self) -> str | None:
        """The branch ref HEAD points to, or None if HEAD is detached."""
        raw = self.read_raw("HEAD")
        return raw[5:] if raw and raw.startswith("ref: ") else None

    def list(self, prefix: str = "refs/") -> dict[str, ObjectId]:
        out: dict[str, ObjectId] = {}
        base = self.root / prefix
        if not base.is_dir():
            return out
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.endswith(".lock") and \
                    not path.name.startswith(".tmp-"):
                name = path.relative_to(self.root).as_posix()
                value = self.read(name)
                if value:
                    out[name] = value
        return out

    # ---------------------------------------------------------------- writing
    @contextlib.contextmanager
    def lock(self, name: str, timeout: float | None = None) -> Iterator[None]:
        lock = self._path(name).with_name(self._path(name).name + ".lock")
        deadline = time.monotonic() + (LOCK_TIMEOUT if timeout is None else timeout)
        delay = 0.001
        while True:
            try:
                self._make_dirs(lock.parent)
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                if self._break_stale(lock):
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
                os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            except OSError as exc:  # e.g. the disk is full
                raise storage_error(exc, self.root, f"locking {name}") from exc
            finally:
                os.close(fd)
            yield
        finally:
            lock.unlink(missing_ok=True)

    @staticmethod
    def _is_stale(lock: Path) -> bool | None:
        """True if the lock's owner died (same host) or it is very old; None if it vanished."""
        try:
            text = lock.read_text().split()
            age = time.time() - lock.stat().st_mtime
        except FileNotFoundError:
            return None
        except OSError:
            return False
        dead = (len(text) == 2 and text[1] == socket.gethostname() and text[0].isdigit()
                and not _pid_alive(int(text[0])))
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

    def _make_dirs(self, folder: Path) -> None:
        """Create `folder` and its missing parents; with fsync, each new directory's entry
        in its parent is made durable (or a power cut can lose the directory)."""
        missing = []
        while not folder.is_dir():
            missing.append(folder)
            folder = folder.parent
        for new in reversed(missing):
            new.mkdir(exist_ok=True)
            if self.fsync:
                _fsync_dir(new.parent)

    def _write_file(self, path: Path, text: str) -> None:
        tmp = path.with_name(f".tmp-{os.getpid()}-{secrets.token_hex(6)}")
        try:
            self._make_dirs(path.parent)
            with open(tmp, "w") as f:
                f.write(text)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
            if self.fsync:
                fd = os.open(path.parent, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            discard(tmp)
            raise storage_error(exc, self.root, f"writing {path.name}") from exc

    def update(self, name: str, new: ObjectId | None, expected: object = ANY,
               reason: str = "", deref: bool = True) -> ObjectId | None:
        """Compare-and-swap `name` from `expected` to `new` (None deletes); return old value.

        With `deref`, updating HEAD moves the branch HEAD is attached to.
        """
        if deref and name == "HEAD":
            target = self.head_target()
            if target:
                name = target
        with self.lock(name):
            if name == "HEAD":  # detached (or being detached): HEAD holds an id itself
                raw = self.read_raw("HEAD")
                old = ObjectId(raw) if raw and is_object_id(raw) else None
            else:
                old = self.read(name)
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
            else:
                logs = [name] + (["HEAD"] if name != "HEAD" and self.head_target() == name
                                 else [])
                self._write_logged(path, new + "\n", [(log, old, new) for log in logs], reason)
        return old

    def _write_logged(self, path: Path, text: str,
                      logs: list[tuple[str, ObjectId | None, ObjectId | None]],
                      reason: str) -> None:
        """Reflog entries first, then the ref (as Git does): if either fails (disk full),
        the entries already appended are taken back, so the error leaves nothing changed."""
        appended: list[tuple[Path, int, int]] = []
        try:
            for log, old, new in logs:
                appended.append(self._append_log(log, old, new, reason))
            self._write_file(path, text)
        except StorageError:
            for entry in reversed(appended):
                self._undo_log(*entry)
            raise

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

    def _append_log(self, name: str, old: ObjectId | None, new: ObjectId | None,
                    reason: str) -> tuple[Path, int, int]:
        """Append one line; return (path, size after, bytes written) for `_undo_log`."""
        path = self._log_path(name)
        line = (f"{old or ZERO} {new or ZERO} {utc_now()} {self.who}\t"
                f"{reason.splitlines()[0] if reason else ''}\n").encode()
        try:
            self._make_dirs(path.parent)
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                written = os.write(fd, line)
                end = os.fstat(fd).st_size
                if self.fsync:  # durable before the ref moves (the ref is written next)
                    os.fsync(fd)
            finally:
                os.close(fd)
            if created and self.fsync:
                _fsync_dir(path.parent)
            if written != len(line):  # a full disk can write part of the line
                self._undo_log(path, end, written)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise storage_error(exc, self.root, f"writing the reflog of {name}") from exc
        return path, end, written

    @staticmethod
    def _undo_log(path: Path, end: int, written: int) -> None:
        """Take back an appended line, unless another process has appended since."""
        with contextlib.suppress(OSError):
            if path.stat().st_size == end:
                if end == written:
                    path.unlink()  # the log did not exist before
                else:
                    os.truncate(path, end - written)

    def _remove_log(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self._log_path(name).unlink()

    def reflog(self, name: str = "HEAD") -> list[ReflogEntry]:
        """Entries newest first. A torn last line (crash mid-append) is skipped."""
        try:
            lines = self._log_path(name).read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in reversed(lines):
            try:
                head, reason = line.split("\t", 1)
                old, new, when, *who = head.split(" ")
            except ValueError:
                continue
            if not (is_object_id(old) and is_object_id(new)):
                continue
            out.append(ReflogEntry(None if old == ZERO else ObjectId(old),
                                   None if new == ZERO else ObjectId(new),
                                   when, " ".join(who), reason))
        return out

    def all_logs(self) -> Iterator[str]:
        base = self.root / "logs"
        if base.is_dir():
            for p in base.rglob("*"):
                if p.is_file():
                    yield p.relative_to(base).as_posix()

    def expire_logs(self) -> None:
        for name in list(self.all_logs()):
            self._remove_log(name)


def short_ref(name: str) -> str:
    for prefix in ("refs/heads/", "refs/tags/", "refs/remotes/"):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name
