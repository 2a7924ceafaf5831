"""The store hook: the trainer's only link to the vrl store.

Every `every` iterations it snapshots the complete trainer state (model, optimizer and
algorithm state, every RNG, counters, environment state) with the resolved config as
hyperparameters and the iteration's metrics, through a background `vrl.Snapshotter`.
The best snapshot by `best_metric` carries a tag that moves with it (`best/<branch>` unless
`best_tag` says otherwise; a tag the Snapshotter did not set is never moved); `keep_last`
applies retention as the run goes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainer.config import config_to_dict
from trainer.hooks import Hook
from vrl import Repo
from vrl.hooks import Snapshotter

if TYPE_CHECKING:
    from trainer.train import Trainer

RETURN_KEYS = ("eval/return", "charts/return_last100", "charts/episodic_return")


def state_layout(trainer: Trainer) -> dict[str, Any]:
    """What the snapshot's parts are, for `vrl diff`/`show`: model layers live under
    `model/`, and optimizer state index i (`algo/optimizer/state/i`) belongs to the i-th
    parameter in the optimizer's order (torch numbers them across its param groups)."""
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    params = [names.get(id(p), "?") for group in trainer.optimizer.param_groups
              for p in group["params"]]
    return {"model_prefix": "model/", "optimizer_params": params}


def trainer_state(trainer: Trainer) -> dict[str, Any]:
    """`trainer.state_dict(live=True)`: the Snapshotter copies the live tensors itself,
    skipping those that did not change since the last snapshot."""
    return trainer.state_dict(live=True)


class StoreHook(Hook):
    """Commit trainer snapshots to a vrl repository while training."""

    def __init__(self, repo: Repo | str, *, every: int = 1, branch: str | None = None,
                 best_metric: str | None = "charts/return_last100", best_tag: str | None = None,
                 keep_last: int | None = None, queue_size: int = 2,
                 committer: str | None = None) -> None:
        self.repo = repo if isinstance(repo, Repo) else Repo(repo)
        self.every, self.branch = max(1, every), branch
        self.best_metric, self.best_tag = best_metric, best_tag
        self.keep_last, self.queue_size = keep_last, queue_size
        self.committer = committer  # the Snapshotter's: "process" | "thread" | its default
        self.snapshotter: Snapshotter | None = None
        self._earlier: list[str] = []  # commits of snapshotters closed by earlier train()s
        self._eval: dict[str, float] = {}
        self._last_snapshot_iteration = -1

    @property
    def commits(self) -> list[str]:
        """Ids committed so far (the newest last); lags the loop by the queue length."""
        return self._earlier + (self.snapshotter.commits if self.snapshotter else [])

    def on_start(self, trainer: Trainer) -> None:
        if self.snapshotter is None or self.snapshotter.closed:
            if self.snapshotter is not None:
                self._earlier.extend(self.snapshotter.commits)
            self.snapshotter = Snapshotter(
                self.repo, state_fn=lambda: trainer_state(trainer), every=1,
                branch=self.branch, queue_size=self.queue_size,
                best_metric=self.best_metric, best_tag=self.best_tag,
                keep_last=self.keep_last, hparams=config_to_dict(trainer.config),
                committer=self.committer)

    def on_evaluation(self, trainer: Trainer, iteration: int, metrics: dict[str, float]
                      ) -> None:
        self._eval = dict(metrics)  # goes into the next snapshot

    def on_iteration_end(self, trainer: Trainer, iteration: int, metrics: dict[str, float]
                         ) -> None:
        if iteration % self.every == 0:
            self._snapshot(trainer, iteration, metrics)

    def on_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if self.snapshotter is None:
            return
        if self._last_snapshot_iteration != trainer.iteration and trainer.iteration > 0:
            self._snapshot(trainer, trainer.iteration, {**metrics, **self._eval})
        self.snapshotter.close()

    def _snapshot(self, trainer: Trainer, iteration: int, metrics: dict[str, float]) -> None:
        assert self.snapshotter is not None
        merged = {**metrics, **self._eval}
        self._eval = {}
        shown = next((k for k in RETURN_KEYS if isinstance(merged.get(k), float)
                      and math.isfinite(merged[k])), None)
        message = f"iter {iteration}" + (f": return {merged[shown]:.4g}" if shown else "")
        frozen = sorted(trainer.frozen_layers)
        self.snapshotter.snapshot(step=trainer.global_step, metrics=merged, message=message,
                                  meta={"iteration": iteration, "frozen_layers": frozen,
                                        "state_layout": state_layout(trainer)})
        self._last_snapshot_iteration = iteration

    def flush(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.flush()

    def close(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()
