"""PyTorch Lightning: snapshot a `Trainer.fit` run into a repository, and resume one from
any snapshot.

    from vrl.integrations.lightning import SnapshotCallback
    trainer = L.Trainer(max_epochs=10, callbacks=[SnapshotCallback(repo, every=1)])
    trainer.fit(module, data)                    # a commit per epoch: "epoch 3 step 120"
    trainer = L.Trainer(max_epochs=20, callbacks=[SnapshotCallback(repo, resume_from="HEAD")])
    trainer.fit(module, data)                    # continues at epoch 10, exactly

A snapshot is the state after an epoch: the module, every optimizer, every LR scheduler,
every global RNG and the loop's counters (epoch, global step). It is taken once the epoch
is over for good - after the module's own `on_train_epoch_end` and the epoch's LR-scheduler
step, which Lightning runs after the callbacks' `on_train_epoch_end` - i.e. when the next
epoch starts or training ends; its metrics are `trainer.callback_metrics` at the epoch's
end. Commits run off the training path (`vrl.Snapshotter`), on global rank 0 only.

Resuming (`resume_from=REV`, at `on_train_start`, once the optimizers exist) loads all of
that without moving HEAD and sets Lightning's epoch and step counters, so the fit goes on
with the epoch after the snapshot's: on CPU, with a seeded run and a sampler driven by the
global torch RNG (a shuffling DataLoader without its own generator), N epochs, then a
resume from the epoch-(N-1) snapshot for M more, give the weights of N+M epochs straight,
bit for bit. Not restored: the state of stateful DataLoaders and data modules (resume
points are epoch ends, where a plain DataLoader starts afresh).

`lightning` (or the older `pytorch_lightning`) is imported on first use of
`SnapshotCallback`; without it that is a one-line `VrlError`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from vrl.errors import VrlError

if TYPE_CHECKING:
    from vrl.repo import Repo

__all__ = ["SnapshotCallback", "restore"]  # noqa: F822 - SnapshotCallback: __getattr__

INSTALL = "the Lightning integration needs PyTorch Lightning: pip install 'vrl[lightning]'"

REPR_MAX = 200  # a hyperparameter that is no JSON value is stored as its repr, cut here

_CALLBACK_CLASS: type | None = None  # built on first use: its base class is Lightning's


def _callback_base() -> type:
    try:
        from lightning.pytorch.callbacks import Callback  # type: ignore[import-not-found]
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback  # type: ignore[import-not-found]
        except ImportError:
            raise VrlError(INSTALL) from None
    return Callback


def __getattr__(name: str) -> Any:
    # `SnapshotCallback` subclasses Lightning's Callback (the Trainer checks that), so the
    # class is made when first asked for: importing this module never imports Lightning
    global _CALLBACK_CLASS
    if name != "SnapshotCallback":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _CALLBACK_CLASS is None:
        _CALLBACK_CLASS = _make_callback_class(_callback_base())
    return _CALLBACK_CLASS


def json_safe(value: Any) -> Any:
    """`value` as JSON values (hyperparameters): containers recursively, numbers and
    strings as they are, one-element tensors/arrays as numbers, anything else as repr."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):  # (AttributeDict, OmegaConf's DictConfig converted...)
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    numel = getattr(value, "numel", None)  # a torch tensor; numpy's scalars have `size`
    count = numel() if callable(numel) else getattr(value, "size", None)
    if count == 1 and callable(getattr(value, "item", None)):
        return json_safe(value.item())
    text = repr(value)
    return text if len(text) <= REPR_MAX else text[:REPR_MAX - 3] + "..."


def _scalar_metrics(metrics: Any) -> dict[str, float]:
    out = {}
    for key, value in dict(metrics).items():
        numel = getattr(value, "numel", None)
        if numel is not None and numel() != 1:
            continue  # (a logged vector is no metric a commit can hold)
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError):
            continue
    return out


def _training_state(trainer: Any, pl_module: Any, epoch: int) -> dict[str, Any]:
    """What a snapshot holds, read now (the tensors are the live ones: the Snapshotter
    copies what changed before `step` returns)."""
    from vrl.rng import rng_state

    optimizers = list(trainer.optimizers)
    loop = trainer.fit_loop
    state: dict[str, Any] = {"model": pl_module.state_dict()}
    if len(optimizers) == 1:  # (where `repo.checkout(rev, model, optimizer)` finds it)
        state["optimizer"] = optimizers[0].state_dict()
    elif optimizers:
        state["optimizers"] = [o.state_dict() for o in optimizers]
    state["rng"] = rng_state()
    state["lightning"] = {
        "epoch": epoch,  # the epoch just finished (from 0, as Lightning's checkpoint names)
        "global_step": int(trainer.global_step),
        "batches_that_stepped": int(loop.epoch_loop._batches_that_stepped),
        "schedulers": [_storable(c.scheduler.state_dict())
                       for c in trainer.lr_scheduler_configs],
    }
    return state


def _storable(state: dict[str, Any]) -> dict[str, Any] | None:
    """A scheduler's state dict, or None where it holds what a snapshot cannot (a custom
    scheduler's objects): the snapshot is still taken, and a resume leaves that scheduler
    as the module configured it."""
    import json

    def tensors_only(value: Any) -> Any:
        if hasattr(value, "numel"):
            return None
        raise TypeError(type(value).__name__)

    try:
        json.dumps(state, default=tensors_only)
    except (TypeError, ValueError):
        return None
    return state


def _set_tracker(tracker: Any, n: int) -> None:
    for field in ("ready", "started", "processed", "completed"):
        if hasattr(tracker, field):
            setattr(tracker, field, n)


def restore(repo: Repo | str, rev: str, pl_module: Any, trainer: Any = None) -> dict[str, Any]:
    """Load snapshot `rev` into `pl_module` (its weights: enough to evaluate it), and with
    `trainer` - during `fit`, once its optimizers exist (`on_train_start`) - into its
    optimizers and LR schedulers, the global RNGs and the fit loop's counters, so that the
    fit continues with the epoch after the snapshot's. HEAD does not move. Returns the
    snapshot's `lightning` section (epoch, global_step, ...), `{}` for a snapshot of
    another source (then only weights and what else it holds are loaded)."""
    from vrl.repo import Repo
    from vrl.rng import set_rng_state

    repo = repo if isinstance(repo, Repo) else Repo(repo)
    # every byte is copied into the module anyway: hashing it on the way costs little more
    state = repo.load(rev, verify=True)
    if not isinstance(state, dict) or "model" not in state:
        raise VrlError(f"snapshot {rev!r} holds no model state (no 'model' entry)")
    pl_module.load_state_dict(state["model"])
    info = dict(state.get("lightning") or {})
    if trainer is None:
        return info
    optimizers = list(trainer.optimizers)
    stored = state.get("optimizers", [state["optimizer"]] if "optimizer" in state else [])
    if len(stored) != len(optimizers):
        raise VrlError(f"snapshot {rev!r} holds {len(stored)} optimizer state(s), the "
                       f"module configures {len(optimizers)}")
    for optimizer, opt_state in zip(optimizers, stored, strict=True):
        optimizer.load_state_dict(opt_state)
    schedulers = info.get("schedulers", [])
    if len(schedulers) == len(trainer.lr_scheduler_configs):
        for config, sched_state in zip(trainer.lr_scheduler_configs, schedulers, strict=True):
            if sched_state is not None:
                config.scheduler.load_state_dict(sched_state)
    elif schedulers or trainer.lr_scheduler_configs:
        raise VrlError(f"snapshot {rev!r} holds {len(schedulers)} LR scheduler state(s), "
                       f"the module configures {len(trainer.lr_scheduler_configs)}")
    if "rng" in state:
        set_rng_state(state["rng"])
    if "epoch" in info:
        # Lightning's own resume (`ckpt_path`) restores these through `fit_loop`'s state
        # dict, which also marks the loops as restarting mid-way; a snapshot is always an
        # epoch's end, so setting the counters is all it takes: the epoch loop then opens
        # a fresh data iterator (drawing its shuffle seed from the RNG restored above), as
        # the uninterrupted run did after that epoch
        loop = trainer.fit_loop
        done = int(info["epoch"]) + 1
        _set_tracker(loop.epoch_progress.current, done)
        _set_tracker(loop.epoch_progress.total, done)
        step = int(info["global_step"])
        _set_tracker(loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total,
                     step)
        _set_tracker(loop.epoch_loop.manual_optimization.optim_step_progress.total, step)
        loop.epoch_loop._batches_that_stepped = int(info.get("batches_that_stepped", step))
    return info


def _make_callback_class(base: type) -> type:
    from vrl.snapshotter import Snapshotter, _fmt

    class SnapshotCallback(base):  # type: ignore[misc, valid-type]
        """Commit a snapshot every `every` epochs (and after the last one) to `repo`.

        Args:
            repo: a repository or its path.
            every: commit after every `every`-th epoch (with 2: epochs 1, 3, 5... as
                Lightning numbers them, from 0), and after the last one.
            resume_from: a revision to resume from at `on_train_start` (`restore`).
            branch, best_metric, mode, keep_last, committer, ...: passed to
                `vrl.Snapshotter`; `hparams` are merged over `pl_module.hparams`.
        """

        def __init__(self, repo: Repo | str, every: int = 1, *,
                     resume_from: str | None = None, **snapshotter: Any) -> None:
            super().__init__()
            self.repo, self.every, self.resume_from = repo, max(1, int(every)), resume_from
            self.snapshotter_args = snapshotter
            self.snap: Snapshotter | None = None
            self.restored: dict[str, Any] | None = None
            self._pending: tuple[int, dict[str, float]] | None = None
            self._epoch = -1  # the epoch being committed (read by the state function)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if self.resume_from is not None:
                self.restored = restore(self.repo, self.resume_from, pl_module, trainer)
            self._pending = None
            if not trainer.is_global_zero:
                return
            args = dict(self.snapshotter_args)
            hparams = json_safe(dict(getattr(pl_module, "hparams", None) or {}))
            hparams.update(json_safe(args.pop("hparams", None) or {}))
            self.snap = Snapshotter(
                self.repo, hparams=hparams, **args,
                state_fn=lambda: _training_state(trainer, pl_module, self._epoch))

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            if self.snap is not None:  # taken at the next epoch's start or at the end
                self._pending = (trainer.current_epoch,
                                 _scalar_metrics(trainer.callback_metrics))

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self._commit_pending(trainer, last=False)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            try:
                self._commit_pending(trainer, last=True)
            finally:
                self._close()

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException
                         ) -> None:
            self._close()  # what was handed over is committed; a pending epoch is not

        def _commit_pending(self, trainer: Any, last: bool) -> None:
            if self.snap is None or self._pending is None:
                return
            epoch, metrics = self._pending
            self._pending = None
            if (epoch + 1) % self.every and not last:
                return
            step = int(trainer.global_step)
            shown = ", ".join(f"{k} {_fmt(v)}" for k, v in list(metrics.items())[:2])
            message = f"epoch {epoch} step {step}" + (f": {shown}" if shown else "")
            self._epoch = epoch
            self.snap.snapshot(step, metrics=metrics, message=message,
                               meta={"lightning": {"epoch": epoch}})

        def _close(self) -> None:
            snap, self.snap = self.snap, None
            if snap is not None:
                snap.close()

    # named as where it is found (module `__getattr__`), so pickle finds it (ddp_spawn)
    SnapshotCallback.__module__, SnapshotCallback.__qualname__ = __name__, "SnapshotCallback"
    return SnapshotCallback
