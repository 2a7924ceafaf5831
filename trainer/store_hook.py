"""The store hook: the trainer's only link to the vrl store.

Every `every` iterations it snapshots the complete trainer state (model, optimizer and
algorithm state, every RNG, counters, environment state) with the resolved config as
hyperparameters and the iteration's metrics, through a background
`vrl.snapshotter.Snapshotter`.
The best snapshot by `best_metric` carries a tag that moves with it (`best/<branch>` unless
`best_tag` says otherwise; a tag the Snapshotter did not set is never moved); `keep_last`
applies retention as the run goes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainer.config import CONFIGS, config_to_dict, fold_flat_dirty
from trainer.envs.base import continuous_of
from trainer.hooks import Hook
from trainer.train import STATE_VERSION, Trainer
from vrl import Repo
from vrl.errors import VrlError
from vrl.returns import EPISODES_METRIC, RETURN_METRIC
from vrl.snapshotter import Snapshotter

META_KEY = "trainer"
"""Commit metadata key that marks a training snapshot (``--from`` / ``vrl eval`` read it)."""


def run_hparams(trainer: Trainer) -> dict[str, Any]:
    """The commit hyperparameters: the resolved config, ``algo`` and ``env_spec`` (the
    ``--env`` value), everything ``vrl train --from`` needs to rebuild the run."""
    return {**config_to_dict(trainer.config), "env_spec": trainer.env_spec}


def run_meta(trainer: Trainer) -> dict[str, Any]:
    """What the policy fits: checked before a snapshot is resumed or evaluated.
    ``num_actions`` is the action dimension where ``continuous_actions`` is set (absent:
    discrete actions, as in every snapshot from before continuous actions)."""
    meta = {"state_version": STATE_VERSION, "obs_dim": int(trainer.env.obs_dim),
            "num_actions": int(trainer.env.num_actions), "env_slots": int(trainer.env.num_envs)}
    if continuous_of(trainer.env):
        meta["continuous_actions"] = True
    return meta


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


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
                 best_metric: str | None = RETURN_METRIC, best_tag: str | None = None,
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
                keep_last=self.keep_last, hparams=run_hparams(trainer),
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
        # the same figure as the console line and the best tag (RETURN_METRIC); an
        # iteration in which no episode finished says so instead
        shown: list[str] = []
        if (value := _number(merged.get(RETURN_METRIC))) is not None:
            shown.append(f"return {value:.4g}")
        elif merged.get(EPISODES_METRIC) == 0:
            shown.append("no episode ended")
        if (evaluated := _number(merged.get("eval/return"))) is not None:
            shown.append(f"eval return {evaluated:.4g}")
        message = f"iter {iteration}" + (f": {', '.join(shown)}" if shown else "")
        frozen = sorted(trainer.frozen_layers)
        self.snapshotter.snapshot(step=trainer.global_step, metrics=merged, message=message,
                                  meta={"iteration": iteration, "frozen_layers": frozen,
                                        META_KEY: run_meta(trainer),
                                        "state_layout": state_layout(trainer)})
        self._last_snapshot_iteration = iteration

    def flush(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.flush()

    def close(self) -> None:
        if self.snapshotter is not None:
            self.snapshotter.close()


# ------------------------------------------------------------------ reading runs back
class SnapshotMismatchError(VrlError, ValueError):
    """A snapshot is not a training snapshot, or does not fit the trainer asked for."""


@dataclass
class StoredRun:
    """What a training snapshot's commit says about its run (metadata only, no tensors)."""

    commit: str
    algo: str
    env_spec: str | None  # None: a snapshot from before env specs were stored
    config: dict[str, Any]  # config fields, without ``algo`` and ``env_spec``
    meta: dict[str, Any]
    step: int | None

    @property
    def iteration(self) -> int | None:
        return self.meta.get("iteration")


def read_run(repo: Repo, rev: str) -> StoredRun:
    """The run stored with commit ``rev``; a one-line error if it is not a training snapshot."""
    oid = repo.resolve(rev)
    commit = repo.read_commit(oid)
    hparams = commit.hparams or {}
    algo = hparams.get("algo")
    if (META_KEY not in commit.meta and "iteration" not in commit.meta) or algo not in CONFIGS:
        raise SnapshotMismatchError(
            f"{rev} ({oid[:12]}) is not a training snapshot (its commit has no trainer "
            "config); give a revision committed by `vrl train`")
    env_spec = hparams.get("env_spec")
    # runs from before the ``dirty`` section have none (defaults) or flat dirty_* keys
    config = fold_flat_dirty({k: v for k, v in hparams.items()
                              if k not in ("algo", "env_spec")})
    return StoredRun(oid, algo, env_spec if isinstance(env_spec, str) else None, config,
                     dict(commit.meta), commit.step)


def _shape(value: Any) -> list[int] | None:
    shape = getattr(value, "shape", None)
    return list(shape) if shape is not None else None


def check_policy_fits(stored_model: dict[str, Any], model: dict[str, Any], run: StoredRun,
                      rev: str, env: Any, env_spec: str | None) -> None:
    """One-line SnapshotMismatchError unless the snapshot's network fits ``env`` (its
    observation and action sizes) and ``model`` (a state dict of the network to load)."""
    name = f"{rev} ({run.commit[:12]})"
    stored = run.meta.get(META_KEY) or {}
    hint = (f"--env {run.env_spec}" if run.env_spec and run.env_spec != env_spec
            else "the env options it was trained with")
    theirs_continuous = bool(stored.get("continuous_actions", False))
    if stored and theirs_continuous != continuous_of(env):
        def kind(continuous: bool) -> str:
            return "continuous (Box) actions" if continuous else "discrete actions"

        raise SnapshotMismatchError(
            f"{name} was trained on {kind(theirs_continuous)}, but {env_spec or 'this env'} "
            f"has {kind(not theirs_continuous)}; use {hint}, or start a new run without --from")
    actions = "continuous actions of {} floats" if theirs_continuous else "{} actions"
    for key, what in (("obs_dim", "observations of {} floats"), ("num_actions", actions)):
        theirs, ours = stored.get(key), getattr(env, key)
        if theirs is not None and theirs != ours:
            raise SnapshotMismatchError(
                f"{name} was trained on {what.format(theirs)}, but {env_spec or 'this env'} "
                f"has {what.format(ours)}; use {hint}, or start a new run without --from")
    for key in sorted(set(model) | set(stored_model)):
        a, b = _shape(stored_model.get(key)), _shape(model.get(key))
        if a != b:
            raise SnapshotMismatchError(
                f"{name}'s network does not fit: {key} is {a} in the snapshot but {b} here "
                f"(observation/action sizes or hidden_sizes differ; the snapshot's "
                f"hidden_sizes are {run.config.get('hidden_sizes')})")


def check_fits(trainer: Trainer, state: Any, run: StoredRun, rev: str) -> None:
    """Raise a one-line SnapshotMismatchError if ``state`` (the snapshot of ``run``) cannot
    be loaded into ``trainer``: observation or action sizes, network shapes, algorithm state."""
    name = f"{rev} ({run.commit[:12]})"
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict) \
            or "algo" not in state:
        raise SnapshotMismatchError(f"{name} holds no trainer state; give a revision "
                                    "committed by `vrl train`")
    if state.get("version") != STATE_VERSION:
        raise SnapshotMismatchError(f"{name} holds trainer state version "
                                    f"{state.get('version')!r}; this trainer reads "
                                    f"version {STATE_VERSION}")
    check_policy_fits(state["model"], trainer.agent.state_dict(), run, rev, trainer.env,
                      trainer.env_spec)
    stored_algo = state["algo"] if isinstance(state["algo"], dict) else {}
    missing = sorted(set(trainer.algo.state_dict()) - set(stored_algo))
    if missing:
        raise SnapshotMismatchError(
            f"{name} holds {run.algo} state without {', '.join(missing)}, which "
            f"{trainer.config.algo} with this config needs; continue with --algo {run.algo} "
            "(and its switches), or start a new run without --from")
