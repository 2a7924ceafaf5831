"""Hooks that snapshot a training framework's loop into a repository: the PyTorch
Lightning callback. The Snapshotter it uses, and the RNG capture it commits, are importable
from here too (`vrl.hooks.Snapshotter`), where code written against vrl finds them.
"""

from __future__ import annotations

from typing import Any

from vrl.errors import VrlError
from vrl.handover import process_mode_available
from vrl.repo import Repo
from vrl.rng import rng_state, set_rng_state
from vrl.snapshotter import Snapshotter

__all__ = ["Snapshotter", "lightning_callback", "process_mode_available", "rng_state",
           "set_rng_state"]


def lightning_callback(repo: Repo | str, every: int = 1, **kwargs: Any) -> Any:
    """A PyTorch Lightning callback that snapshots model + optimizer every `every` epochs."""
    try:
        from lightning.pytorch.callbacks import Callback  # type: ignore[import-not-found]
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback  # type: ignore[import-not-found]
        except ImportError as exc:
            raise VrlError("the Lightning callback needs PyTorch Lightning: "
                           "pip install lightning") from exc

    class VrlCallback(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.snap: Snapshotter | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self.snap = Snapshotter(repo, pl_module, optimizer, every=every, **kwargs)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            assert self.snap is not None
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                       if getattr(v, "numel", lambda: 1)() == 1}
            self.snap.step(trainer.global_step, metrics=metrics)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self.snap is not None:
                self.snap.close()

    return VrlCallback()
