"""vrl - Versioned Reinforcement Learning: a Git-like store for policy snapshots."""

from typing import TYPE_CHECKING, Any

from vrl import lifecycle  # noqa: F401 - its exit handler, registered as early as vrl can
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

