"""Each process's open journals and its write-out thread.

Process-wide by nature, not by choice: a journal is locked with flock, which belongs to an
open file, so a process keeps one open file per journal (a `Handle`) that all its `Journal`
objects for that repository share; and a commit's record is written out by one background
thread per process, which must be finished at exit (vrl.lifecycle runs `finish_at_exit`).
vrl/journal.py is the protocol that uses them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable

from vrl import lifecycle
from vrl.journal_format import HEADER

BACKGROUND = -1  # `Handle.owner` while a record is materialised in the background


class Handle:
    """One open journal per file and process: flock excludes other processes, the RLock
    other threads (flock does not: they share the open file). Closed once no `Journal`
    uses it (a process that opens many repositories does not keep a file open for each)."""

    def __init__(self, path: str) -> None:
        # not O_APPEND: Linux's pwrite appends to such a file whatever the offset, and
        # the header is rewritten in place (appends are serialised by the lock anyway)
        self.path = path
        self.fd = os.open(path, os.O_RDWR)
        self.pid = os.getpid()
        # a plain Lock, not an RLock: a commit hands it (with the flock) to the thread
        # that materialises its record, which releases it (`held` does the reentrancy)
        self.lock = threading.Lock()
        self.owner: int | None = None  # the thread holding it (BACKGROUND: a handed one)
        self.depth = 0
        self.users = 0
        # held from a commit's hand-off until its record is materialised in the background
        # (`JOBS` has the work until someone starts it)
        self.pending: threading.Lock | None = None
        self.failed = False  # the last one was not: the next holder re-applies it
        # where the next record goes and its epoch: known while the journal is held (the
        # header is read when it is taken)
        self.tail = HEADER.size
        self.epoch = 0
        # (epoch, tail, HEAD's target, {ref: value}) as this process's last commit left
        # them: while the header still says (epoch, tail), no ref changed since - every
        # ref change of a vrl process moves the tail (a record) or the epoch (`exclusive`)
        # - and the next commit need not read HEAD and its ref again
        self.seen: tuple[int, int, str | None, dict[str, str | None]] | None = None


HANDLES: dict[str, Handle] = {}
HANDLES_LOCK = threading.Lock()


RELEASED: list[Handle] = []  # one entry per `Journal` gone (see _handle)


def close_released() -> None:
    """Count the `Journal`s gone as users no more; close a handle when it was the last
    (the caller holds HANDLES_LOCK). The finalizer only appends: it may run in any
    allocation, even one made while HANDLES_LOCK is held."""
    while RELEASED:
        handle = RELEASED.pop()
        handle.users -= 1
        if handle.users > 0:
            continue
        if HANDLES.get(handle.path) is handle:
            del HANDLES[handle.path]
        if handle.pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(handle.fd)


# Each process's write-out thread: a daemon fed by a queue (a thread pool's hand-off
# costs ~25 us on a commit's path, a queue's ~5). At exit, `finish_at_exit` (run by
# vrl.lifecycle) finishes what is queued before the interpreter stops the thread; a
# commit made after it, in an exit handler, writes its own files out.
JOBS: dict[Handle, Callable[[], None]] = {}  # handle -> its pending write-out
WRITER: list = [None, None]  # [pid, queue] of this process's write-out thread


def hand_off(handle: Handle, job: Callable[[], None]) -> None:
    JOBS[handle] = job
    try:
        if lifecycle.exiting():  # (the thread is not waited for any more)
            raise RuntimeError("exiting")
        if WRITER[0] != os.getpid():  # (a forked child has the queue, not the thread)
            with HANDLES_LOCK:
                if WRITER[0] != os.getpid():
                    work: queue.SimpleQueue = queue.SimpleQueue()
                    threading.Thread(target=_write_out, args=(work,), name="vrl-journal",
                                     daemon=True).start()
                    WRITER[:] = [os.getpid(), work]
        WRITER[1].put(handle)
    except RuntimeError:  # the interpreter is exiting (no thread starts, none is waited
        run_pending(handle)  # for): here


def run_pending(handle: Handle) -> None:
    job = JOBS.pop(handle, None)  # (atomic: whoever pops it runs it)
    if job is not None:
        job()


def _write_out(work: queue.SimpleQueue) -> None:
    while True:
        run_pending(work.get())


def finish_at_exit() -> None:
    """Finish every queued write-out: the interpreter is stopping, and does not wait for
    the write-out thread (vrl.lifecycle runs this)."""
    for handle in list(JOBS):
        run_pending(handle)
    for handle in list(HANDLES.values()):
        pending = handle.pending
        if pending is not None:
            with pending:
                pass


lifecycle.on_exit(finish_at_exit)
