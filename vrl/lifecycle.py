"""The process's exit, as vrl's background work needs to know it.

A journaled commit is written out by a background thread (vrl/journal.py), which the
interpreter does not wait for once it runs its exit handlers. So vrl registers one exit
handler as early as it can - when the `vrl` package is imported - that runs the
callbacks registered with `on_exit` (the journal finishes its queued write-outs) and
from then on reports `exiting()`: a commit made in an exit handler that runs later (one
registered before vrl was imported: atexit runs handlers last in, first out) writes its
own files instead of queueing them.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable

_callbacks: list[Callable[[], None]] = []
_exiting = False


def on_exit(callback: Callable[[], None]) -> None:
    """Run `callback` when the interpreter exits (or `finish` is called), once."""
    if callback not in _callbacks:
        _callbacks.append(callback)


def exiting() -> bool:
    """Whether the exit handlers have started: background threads are not waited for."""
    return _exiting


@atexit.register
def finish() -> None:
    """Run the exit callbacks now (also for a process that ends with os._exit)."""
    global _exiting
    _exiting = True
    for callback in list(_callbacks):
        callback()
