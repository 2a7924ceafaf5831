"""The gc lock: a gc never deletes what a commit in progress relies on.

A commit decides what to write by asking what is stored already (`has`, `touch`, and what
this process remembers storing), writes the rest, then moves its ref. Until the ref moves,
every object it found or wrote may be unreachable - a snapshot of a deleted branch, or
simply its own new objects - and a gc with a grace period shorter than the commit (`gc
--now`) would delete it and leave the ref naming it: the tip unreadable, and every later
commit on the branch failing. So:

- a writer (commit, branch, tag, reset, checkout, fetch) holds this lock *shared* from its
  first look at the store until its ref has moved (a journaled commit: its record appended);
- `gc` holds it *exclusively* for its mark and sweep. A writer that arrives meanwhile waits
  for the gc, and the gc for the writers in flight; neither fails for the other (each waits
  up to WAIT seconds: a stopped process is not waited for forever);
- a gc adds one to the generation in the lock file. A writer that finds it changed since
  its repository object last looked forgets what it remembered as stored (packs it
  freshened a moment ago, the pack tables): every later check looks at the disk again.

Two files under `.vrl`, taken with flock (the kernel releases it when its holder dies):
`gc-lock`, the lock itself, whose first 16 bytes hold the generation and whether a gc waits
(u64 each); and `gc-gate`, a turnstile. Linux grants a shared flock while an exclusive one
waits, so a stream of overlapping commits could starve a gc: gc takes the gate exclusively
and says it waits before it waits for the lock; a writer that finds it so, having taken the
lock, lets go and waits at the gate (shared, let go once it holds the lock). A gc killed
while it waited leaves the word set: writers then only pass the gate, which is free.

flock excludes open files, not threads: the threads of a process share one state per
repository, with the two files kept open, and count their holds under a condition; the
first shared holder takes the flock, the last lets it go. A thread that holds the lock
shared and asks for it exclusively (a gc inside a commit) would wait for itself: refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from vrl.errors import RefConflictError, VrlError

WAIT = 600.0  # seconds a writer waits for a gc (or a gc for writers) before giving up
_WORDS = struct.Struct("<QQ")  # the generation, whether a gc waits
Method = TypeVar("Method", bound=Callable[..., Any])


def writes(method: Method) -> Method:
    """A `Repo` method that looks at the store and then moves a ref runs holding the gc
    lock shared (as `Repo.writing`, without its context manager: every commit runs this)."""
    @functools.wraps(method)
    def holding(self: Any, *args: Any, **kwargs: Any) -> Any:
        lock = self.gc_lock
        if lock.acquire_shared():
            self.objects.forget_stored()
        try:
            return method(self, *args, **kwargs)
        finally:
            lock.release_shared()

    return holding  # type: ignore[return-value]


class _State:
    """This process's holds on one repository's lock (shared by its GcLock objects)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.fds: list[int] = []  # [lock, gate] once opened (closed with the state)
        self.shared = 0  # threads of this process holding it shared
        self.depth: dict[int, int] = {}  # thread id -> its nested shared holds
        self.early: dict[int, int] = {}  # thread id -> its holds let go early
        self.owner: int | None = None  # the thread holding it exclusively
        self.owner_depth = 0
        self.queued = 0  # threads of this process waiting to hold it exclusively
        self.generation = 0  # as read when this process last took the lock

    def __del__(self) -> None:  # (no GcLock uses it any more)
        _close_all(self.fds)


_STATES: weakref.WeakValueDictionary[tuple[int, str], _State] = \
    weakref.WeakValueDictionary()
_STATES_LOCK = threading.Lock()


class GcLock:
    """A repository's gc lock (see the module docstring)."""

    def __init__(self, vrl_dir: Path) -> None:
        folder = os.fspath(vrl_dir)
        self.path, self.gate = f"{folder}/gc-lock", f"{folder}/gc-gate"
        self._state: _State | None = None
        self._seen: int | None = None  # the generation this object last saw

    def _get_state(self) -> _State:
        state = self._state
        key = (os.getpid(), self.path)  # (a forked child holds nothing of its parent's)
        if state is None or _STATES.get(key) is not state:
            with _STATES_LOCK:
                state = _STATES.get(key)
                if state is None:
                    state = _STATES[key] = _State()
            self._state = state
        return state

    @contextlib.contextmanager
    def shared(self) -> Iterator[bool]:
        """Hold the lock shared (reentrant). Yields whether a gc ran since this object last
        held it (its first hold counts as such): what it remembers as stored is stale."""
        changed = self.acquire_shared()
        try:
            yield changed
        finally:
            self.release_shared()

    def acquire_shared(self) -> bool:
        """`shared` in two calls (for a commit's hot path): take it and say whether a gc
        ran; every call is followed by `release_shared()`, on the same thread."""
        state = self._get_state()
        me = threading.get_ident()
        with state.cond:
            nested = state.depth.get(me, 0)
            if nested or state.owner == me:  # (a gc's own writes: it holds it already)
                state.depth[me] = nested + 1
            else:
                deadline = time.monotonic() + WAIT
                while state.owner is not None or state.queued:  # a gc of this process
                    if not state.cond.wait(max(0.0, deadline - time.monotonic())):
                        raise _timeout("a gc of this process")
                if not state.shared and self._open(state):
                    self._lock_shared(state, deadline)
                state.shared += 1
                state.depth[me] = 1
            changed = self._seen != state.generation
            self._seen = state.generation
        return changed

    def release_shared(self) -> None:
        """Let go of a hold (nothing, for one let go already by `release_early`)."""
        state = self._state
        assert state is not None
        me = threading.get_ident()
        with state.cond:
            early = state.early.get(me)
            if early:
                state.early[me] = early - 1
                return
            self._let_go(state, me)

    def release_early(self) -> None:
        """Let go of this thread's innermost hold now; its `release_shared()` then does
        nothing. A journaled commit lets go at its commit point, before the journal's
        background thread starts: the flock call would hand that thread the interpreter
        lock in the middle of the commit (~50 us a commit)."""
        state = self._state
        me = threading.get_ident()
        if state is None or me not in state.depth:
            return
        with state.cond:
            self._let_go(state, me)
            state.early[me] = state.early.get(me, 0) + 1

    @staticmethod
    def _let_go(state: _State, me: int) -> None:
        left = state.depth[me] - 1
        if left:
            state.depth[me] = left
            return
        del state.depth[me]
        if state.owner != me:
            state.shared -= 1
            if not state.shared and state.fds:
                fcntl.flock(state.fds[0], fcntl.LOCK_UN)
            state.cond.notify_all()

    @staticmethod
    def _lock_shared(state: _State, deadline: float) -> None:
        """flock the lock shared: at once where no gc holds or waits for it (three system
        calls with the release), else through the gate."""
        lock, gate = state.fds
        try:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            state.generation, waiting = _read_words(lock)
            if not waiting:
                return
            fcntl.flock(lock, fcntl.LOCK_UN)  # a gc waits for it: after that gc
        except BlockingIOError:
            pass
        _flock(gate, fcntl.LOCK_SH, deadline, "a gc")
        try:
            _flock(lock, fcntl.LOCK_SH, deadline, "a gc")
            state.generation = _read_words(lock)[0]
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def exclusive(self, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
        """Hold the lock exclusively (reentrant), waiting for the writers in flight;
        `on_wait()` is called once if it must wait. The generation goes up when it is let
        go."""
        state = self._get_state()
        me = threading.get_ident()
        with state.cond:
            if state.owner == me:
                state.owner_depth += 1
                nested = True
            elif state.depth.get(me):
                raise VrlError("gc cannot run inside a commit or ref change of the same "
                               "thread (it would wait for itself); run it after")
            else:
                nested = False
                self._acquire_exclusive(state, on_wait)
        try:
            yield
        finally:
            with state.cond:
                if nested:
                    state.owner_depth -= 1
                else:
                    try:
                        if state.fds:
                            state.generation += 1
                            _write_words(state.fds[0], state.generation, waiting=False)
                            fcntl.flock(state.fds[0], fcntl.LOCK_UN)
                            fcntl.flock(state.fds[1], fcntl.LOCK_UN)
                    finally:
                        state.owner, state.owner_depth = None, 0
                        state.cond.notify_all()

    def _acquire_exclusive(self, state: _State, on_wait: Callable[[], None] | None) -> None:
        """Wait for this process's writers, then take the gate, say so, and take the lock
        (under `state.cond`)."""
        deadline = time.monotonic() + WAIT
        told = [on_wait is None]

        def waiting() -> None:
            if not told[0]:
                told[0] = True
                on_wait()  # type: ignore[misc]

        state.queued += 1
        try:
            while state.owner is not None or state.shared:
                waiting()
                if not state.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise _timeout("a commit of this process")
            if self._open(state):
                lock, gate = state.fds
                _flock(gate, fcntl.LOCK_EX, deadline, "a gc", waiting)
                try:
                    generation = _read_words(lock)[0]
                    _write_words(lock, generation, waiting=True)
                    try:
                        _flock(lock, fcntl.LOCK_EX, deadline, "commits", waiting)
                    except BaseException:
                        _write_words(lock, generation, waiting=False)
                        raise
                    state.generation = generation
                except BaseException:
                    fcntl.flock(gate, fcntl.LOCK_UN)
                    raise
            state.owner, state.owner_depth = threading.get_ident(), 1
        finally:
            state.queued -= 1
            if state.owner is None:
                state.cond.notify_all()  # (writers waited for this gc: it gave up)

    def _open(self, state: _State) -> bool:
        """Have the two files open (made if missing; reopened if they were deleted since: a
        repository made again at this path). False where they can be neither made nor
        opened (a read-only repository without them): nothing can collect there either."""
        if state.fds and os.fstat(state.fds[0]).st_nlink:
            return True
        _close_all(state.fds)
        try:
            for path in (self.path, self.gate):
                try:
                    state.fds.append(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
                except OSError as exc:
                    if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                        raise
                    state.fds.append(os.open(path, os.O_RDONLY))
        except OSError as exc:
            _close_all(state.fds)
            if isinstance(exc, FileNotFoundError) or \
                    exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return False
            raise VrlError(f"cannot open the gc lock {self.path}: {exc.strerror}") from exc
        return True


def create_lock_files(vrl_dir: Path) -> None:
    """Make the two (empty) files at `vrl init`: a first commit need not create them."""
    for name in ("gc-lock", "gc-gate"):
        os.close(os.open(Path(vrl_dir) / name, os.O_RDWR | os.O_CREAT, 0o644))


def _close_all(fds: list[int]) -> None:
    while fds:
        os.close(fds.pop())  # (lets go of its flock)


def _read_words(fd: int) -> tuple[int, int]:
    """(generation, whether a gc waits) from the lock file (zeros where it is new)."""
    raw = os.pread(fd, _WORDS.size, 0)
    return _WORDS.unpack(raw) if len(raw) == _WORDS.size else (0, 0)


def _write_words(fd: int, generation: int, waiting: bool) -> None:
    with contextlib.suppress(OSError):  # read-only; and a hint only: no fsync
        os.pwrite(fd, _WORDS.pack(generation, waiting), 0)


def _flock(fd: int, how: int, deadline: float, holder: str,
           on_wait: Callable[[], None] | None = None) -> None:
    """flock, polling until `deadline` (a blocking flock could not be given up on)."""
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            if time.monotonic() > deadline:
                raise _timeout(f"{holder} of another vrl process") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.005)


def _timeout(holder: str) -> RefConflictError:
    return RefConflictError(f"waited {WAIT:.0f} s for {holder} holding the repository's gc "
                            "lock (stopped?); resume or end it and retry")
