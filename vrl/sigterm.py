"""Flush on SIGTERM: a scheduler's polite kill still commits what was handed over.

The handler runs a flush (the Snapshotter's close), then whatever handled SIGTERM before
(Python's default: exit with status 143). Installed only from the main thread, where
Python runs signal handlers.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable
from typing import Any


class SigtermFlush:
    """`install()` a SIGTERM handler that calls `flush` once, then the previous handler;
    `restore()` puts the previous one back (if ours is still installed). `done` says that
    the flush has already run some other way (a SIGTERM then needs no re-delivery)."""

    def __init__(self, flush: Callable[[], None], done: Callable[[], bool]) -> None:
        self._flush, self._done = flush, done
        self._previous: Any = None
        self._ours: Callable[[int, Any], None] | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._previous = previous
        entered = threading.Event()
        flush = self._flush

        def on_sigterm(signum: int, frame: Any) -> None:
            if entered.is_set():  # a re-delivery (see _watch) while flushing
                return
            entered.set()
            try:
                flush()
            finally:
                signal.signal(signal.SIGTERM, previous)
                if callable(previous):
                    previous(signum, frame)
                else:
                    raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._ours = on_sigterm
        self._watch(entered)

    def _watch(self, entered: threading.Event) -> None:
        """Make sure a SIGTERM reaches our handler promptly.

        CPython runs a Python signal handler only when the main thread next executes
        bytecode. A signal that lands just before the main thread blocks in a C call (a
        `time.sleep`, a wait; easily hit when a committer thread competes for the GIL) or
        that the kernel hands to another thread leaves the handler pending until that call
        returns: a trainer sleeping or waiting would not flush, nor exit, until then. The
        interpreter's wakeup fd says a signal arrived; a watcher thread then interrupts
        the main thread (EINTR, after which the interpreter runs the pending handler).
        Skipped when someone else (asyncio, a framework) already owns the wakeup fd.
        """
        try:
            ours, theirs = socket.socketpair()
            theirs.setblocking(False)
        except OSError:
            return
        try:
            old = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:
            if old is not None:
                signal.set_wakeup_fd(old)
            ours.close()
            theirs.close()
            return
        self._wakeup = (ours, theirs)
        main = threading.main_thread().ident
        assert main is not None
        done = self._done

        def watch() -> None:
            try:
                while data := ours.recv(256):
                    if int(signal.SIGTERM) not in data:
                        continue
                    # normally the handler starts at once; give it a moment first
                    if entered.wait(0.2) or done():
                        continue
                    signal.pthread_kill(main, signal.SIGTERM)
            except (OSError, ValueError):
                pass

        threading.Thread(target=watch, name="vrl-sigterm-watch", daemon=True).start()

    def restore(self) -> None:
        if self._ours is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is self._ours:
            signal.signal(signal.SIGTERM, self._previous)
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None:
            reader, writer = wakeup
            try:
                old = signal.set_wakeup_fd(-1)
                if old != writer.fileno():
                    signal.set_wakeup_fd(old)  # not ours any more: leave it as it was
            except (ValueError, OSError):
                pass
            writer.close()
            reader.shutdown(socket.SHUT_RDWR)  # the watcher ends
            reader.close()
