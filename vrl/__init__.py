"""vrl - Versioned Reinforcement Learning: a Git-like store for policy snapshots.

`import vrl` is light: the public names below, and every submodule (`vrl.hooks`,
`vrl.remote`, ...), load on first use, so a light command or submodule never imports the
store, numpy or torch before it needs them.
"""

import importlib
from typing import TYPE_CHECKING, Any

from vrl import lifecycle  # noqa: F401 - its exit handler, registered as early as vrl can
from vrl.errors import VrlError

if TYPE_CHECKING:
    from vrl.hooks import lightning_callback
    from vrl.repo import Repo
    from vrl.rng import rng_state, set_rng_state
    from vrl.snapshotter import Snapshotter

# public name -> the module that defines it
_PUBLIC = {"Repo": "vrl.repo", "Snapshotter": "vrl.snapshotter",
           "lightning_callback": "vrl.hooks", "rng_state": "vrl.rng",
           "set_rng_state": "vrl.rng"}

__all__ = ["Repo", "Snapshotter", "VrlError", "lightning_callback", "rng_state",
           "set_rng_state"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    try:
        return importlib.import_module(f"vrl.{name}")  # vrl.hooks, vrl.remote, ...
    except ModuleNotFoundError as exc:
        if exc.name != f"vrl.{name}":
            raise  # a dependency of that module is missing: say which
        raise AttributeError(f"module 'vrl' has no attribute {name!r}") from None
