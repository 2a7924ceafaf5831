"""Durability primitives: every fsync vrl makes goes through here.

What must be durable before what - the commit point, checkpoints, recovery and the
invariants they keep - is stated once in docs/durability.md; vrl/journal.py carries out the
commit journal's part of it. These are the steps everything is built from: a file's bytes
made durable (`fsync`, `fdatasync`), a directory's entries (`fsync_dir`), several at once
(`fsync_all`: a journalling file system commits them in one round), new folders
(`make_dirs`) and a whole small file replaced (`write_file`: temp, fsync, rename, folder).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from vrl.errors import storage_error

if TYPE_CHECKING:  # (concurrent.futures imports logging: ~5-10 ms a read-only command)
    from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[tuple[str, int], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def thread_pool(name: str, workers: int) -> ThreadPoolExecutor:
    """A long-lived pool of this process for fsyncs that overlap (starting threads per
    commit cost more than the work they overlap). Per process: a forked child inherits the
    parent's pool objects but not its threads, and work submitted to them would wait
    forever."""
    key = (name, os.getpid())
    pool = _POOLS.get(key)
    if pool is None:
        with _POOLS_LOCK:
            pool = _POOLS.get(key)
            if pool is None:
                from concurrent.futures import ThreadPoolExecutor

                pool = _POOLS[key] = ThreadPoolExecutor(workers, thread_name_prefix=name)
    return pool


def fsync(fd: int) -> None:
    """A file's bytes and metadata durable."""
    os.fsync(fd)


def fdatasync(fd: int) -> None:
    """A file's bytes durable (and its size; not its times): the commit point's sync."""
    os.fdatasync(fd)


def fsync_dir(path: str | Path) -> None:
    """A directory's entries durable: the files created, renamed or removed in it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_all(fds: list[int]) -> None:
    """fsync these files (and directories) concurrently: a journalling filesystem commits
    them together, where one after another each waits for its own commit."""
    if len(fds) == 1:
        os.fsync(fds[0])
        return
    from concurrent.futures import wait

    pool = thread_pool("vrl-ref-fsync", 8)
    futures = [pool.submit(os.fsync, fd) for fd in fds[1:]]
    try:
        os.fsync(fds[0])  # this thread does one itself instead of waiting idle
    finally:
        wait(futures)  # all done before the caller closes any of them
    for future in futures:
        future.result()


def make_dirs(folder: Path, fsync: bool) -> None:
    """Create `folder` and its missing parents; with fsync, each new directory's entry in
    its parent is made durable (or a power cut can lose everything written inside it)."""
    missing = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        new.mkdir(exist_ok=True)
        if fsync:
            fsync_dir(new.parent)


def write_file(path: Path, text: str, doing: str, sync: bool = True) -> None:
    """Replace a small file whole or not at all: a temp file written and fsynced, renamed
    over `path`, the folder fsynced (a power cut never leaves it empty or half written).
    A failure is a one-line StorageError (`doing`: what was being written)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if sync:
            fsync_dir(path.parent)
    except OSError as exc:
        discard(tmp)
        raise storage_error(exc, path.parent, doing) from exc


def discard(path: Path) -> None:
    """Remove a temp file if it is there, never raising: on a read-only filesystem even a
    file that does not exist gives EROFS, which must not hide the error being reported."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)
