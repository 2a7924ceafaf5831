"""Ctrl-C that is never lost, installed before anything heavy is imported.

Only the standard library here: entry points (`vrl`, `python -m trainer`) install the latch
before they import torch or the store, so the window in which a Ctrl-C becomes a traceback
is the interpreter's own start-up.
"""

from __future__ import annotations

import gc
import signal
import sys
import threading
import time
from typing import Any


class InterruptLatch:
    """A Ctrl-C that is never lost: `with InterruptLatch() as latch:` ... `latch.check()`.

    Python turns SIGINT into a KeyboardInterrupt raised at whatever bytecode the main
    thread runs next, and code that swallows errors there loses it: the program runs on as
    if nothing had happened. Found by sending SIGINT to `vrl train` at random moments, about
    one run in twelve trained on forever: torch's C initialisation clears an error raised
    while it imports numpy, and importlib's module-lock weakref callback reports and drops
    one; a `__del__` or a library's bare `except` does the same. Worse, an import cut short
    leaves numpy half-initialised (later imports fail, torch even aborted once).

    So the latch's handler (1) remembers every Ctrl-C, for `check()` to raise again at safe
    points (the trainer checks at the start and after every iteration): a swallowed one
    stops the run there instead of never; (2) defers the first Ctrl-C that lands inside an
    import until the import is done (a thread watches the main thread's stack and then
    re-delivers it), so no module is left half-imported; a second Ctrl-C does not wait.

    Installed only from the main thread, over Python's own handler; a latch entered while
    another is installed joins it. A program's own SIGINT handler is left in place, and so
    is SIGINT ignored (a job started in the background of a non-interactive shell ignores
    Ctrl-C by POSIX rule).
    """

    def __init__(self) -> None:
        self.count = 0  # Ctrl-Cs received while installed
        self._root: InterruptLatch = self  # the installed latch whose count is shared
        self._installed = False
        self._pending = False  # a Ctrl-C deferred until the main thread's import ends
        self._waiting = False  # a thread waits for that to re-deliver it
        self._redelivered = False  # the next SIGINT is that re-delivery

    def __enter__(self) -> InterruptLatch:
        current = signal.getsignal(signal.SIGINT)
        outer = getattr(current, "__self__", None)
        if isinstance(outer, InterruptLatch):
            self._root = outer
        elif threading.current_thread() is threading.main_thread() and \
                current is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came while installed. Code still running
        normally after one means it was swallowed: this delivers it again."""
        if self._root.count:
            raise KeyboardInterrupt

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if not self._installed:
            return
        self._installed = False
        if signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if self._pending and exc_type is None:  # deferred, and nothing stopped since
            self._pending = False
            raise KeyboardInterrupt

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self._redelivered:
            self._redelivered = False
        else:
            self.count += 1
        if self.count == 1 and _importing(frame):
            self._pending = True
            if not self._waiting:
                self._waiting = True
                threading.Thread(target=self._redeliver_after_import, name="vrl-ctrl-c",
                                 daemon=True).start()
            return
        self._pending = False
        raise KeyboardInterrupt

    def _redeliver_after_import(self) -> None:
        main = threading.main_thread().ident
        assert main is not None
        while self._installed and self._pending:
            frame = _frame_of(main)
            if frame is None:
                break
            if not _importing(frame):
                self._waiting = False  # first: the handler may defer it again
                self._redelivered = True
                signal.pthread_kill(main, signal.SIGINT)
                return
            del frame
            time.sleep(0.02)
        self._waiting = False


def _frame_of(ident: int) -> Any:
    """The current frame of thread `ident`, or None.

    The collector is paused meanwhile: before CPython 3.11.9 / 3.12.3, sys._current_frames()
    holds the thread-list lock while it allocates, and a collection that frees a
    threading.local takes that lock again - this thread then hangs holding the GIL, and
    with it the whole process (CPython gh-106883; seen here as a hung test)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames().get(ident)
    finally:
        if enabled:
            gc.enable()


def _importing(frame: Any) -> bool:
    """True if `frame` runs inside an import (importlib's frames are on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
