"""Hooks that snapshot a training framework's loop into a repository. The PyTorch Lightning
callback lives in `vrl.integrations.lightning` (`lightning_callback` here builds it); the
Snapshotter, and the RNG capture it commits, are importable from here too
(`vrl.hooks.Snapshotter`), where code written against vrl finds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vrl.handover import process_mode_available
from vrl.rng import rng_state, set_rng_state
from vrl.snapshotter import Snapshotter

if TYPE_CHECKING:
    from vrl.repo import Repo

__all__ = ["Snapshotter", "lightning_callback", "process_mode_available", "rng_state",
           "set_rng_state"]


def lightning_callback(repo: Repo | str, every: int = 1, **kwargs: Any) -> Any:
    """`vrl.integrations.lightning.SnapshotCallback(repo, every, **kwargs)`: a PyTorch
    Lightning callback that commits a snapshot every `every` epochs."""
    # imported here: the integration's module is above this one, and Lightning loads late
    from vrl.integrations.lightning import SnapshotCallback

    return SnapshotCallback(repo, every, **kwargs)
