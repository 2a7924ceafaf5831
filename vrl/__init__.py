"""vrl - Versioned Reinforcement Learning: a Git-like store for policy snapshots."""

import atexit
import sys
from typing import TYPE_CHECKING, Any

from vrl.errors import VrlError

if TYPE_CHECKING:
    from vrl.repo import Repo

__all__ = ["Repo", "VrlError"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # `vrl.Repo` loads the store on first use, so that importing a light submodule (the
    # entry points' Ctrl-C latch, vrl.yaml12) does not import the whole store first
    if name == "Repo":
        from vrl.repo import Repo

        return Repo
    raise AttributeError(f"module 'vrl' has no attribute {name!r}")


EXITING = False  # set once the interpreter runs vrl's exit handler (see _at_exit)


@atexit.register
def _at_exit() -> None:
    """Finish the commit journal's queued write-outs before the interpreter stops its
    thread. Registered with the package, the earliest vrl can: an exit handler registered
    before vrl was imported runs after this one, and a commit it makes writes its own
    files (vrl.journal reads EXITING; its thread would not be waited for)."""
    global EXITING
    EXITING = True
    journal = sys.modules.get("vrl.journal")
    if journal is not None:
        journal._drain()
