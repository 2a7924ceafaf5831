"""Dirty-layer training: only layers that still move keep training.

After each iteration the controller decides from the store which layers train in the next
one. Three criteria (``DirtyLayerConfig.criterion``):

* ``threshold`` (the original): how far each layer moved over the last ``window``
  snapshots (``repo.diff(old, new)``, computed from the stored objects); a layer whose
  relative change ||new - old|| / ||old|| is at most ``threshold`` is frozen.
* ``plasticity``: each commit already records every layer's relative change against its
  parent (``commit.stats["layers"]``), so the history costs no tensor loads. A layer's
  movement per commit is divided by the learning rate of that iteration (so annealing
  alone does not look like convergence); its *plasticity* is the mean movement of its
  last ``window`` training iterations over the mean of its first ``reference`` training
  iterations in this run. A layer whose plasticity fell below ``plasticity`` has stopped
  moving *relative to itself* and is frozen; a layer that is slow but steady keeps a
  plasticity near 1 and trains on. Iterations in which a layer was frozen are skipped
  (it did not move because it could not).
* ``drift``: is the layer still going somewhere, or only jittering? Over its last
  ``window`` training iterations, the net change (``repo.diff`` between the snapshot
  before them and the latest) over the path length (the sum of the per-commit changes
  from commit statistics). Consistent movement gives ~1; updates that cancel out (noise
  around a point the layer has reached) give ~1/sqrt(window) in high dimensions. A layer
  whose drift is below ``drift`` is frozen. The ratio does not depend on the learning
  rate or its schedule, and frozen iterations are skipped as for plasticity.

With ``prefix_only`` only input-side prefixes of each network are frozen (front to back,
as in Egeria/AutoFreeze): the trainer then runs the frozen prefix once per update over the
rollout and autograd never enters it, which saves its forward recomputation and its whole
backward pass. A frozen layer in the middle saves only its weight gradient and optimizer
step, since the backward pass still runs through it to the trainable layers before it.

The settings are :class:`DirtyLayerConfig` (defined in :mod:`trainer.config`, where it is
the ``dirty`` section of the trainer config: ``vrl train --set dirty.threshold=0.01``).

Frozen layers get no gradients, no optimizer step and no Hessian work, and since their
bytes (weights and Adam moments) do not change, snapshots add no new objects for them.
Every ``refresh`` iterations all layers train once, so a frozen layer can come back; at
least ``min_active`` layers always train. Decisions use the snapshots committed so far;
with background commits they may lag the loop by the snapshot queue (one or two
iterations) unless ``sync``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainer.config import CRITERIA, DirtyLayerConfig
from trainer.hooks import Hook

__all__ = ["CRITERIA", "DirtyLayerConfig", "DirtyLayerController", "drift",
           "indexed_movement", "input_side_prefixes", "layer_order", "movement_history",
           "plasticity"]

if TYPE_CHECKING:
    from trainer.store_hook import StoreHook
    from trainer.train import Trainer


def layer_order(name: str) -> tuple[str, int]:
    """``actor.2`` -> ("actor", 2): the network and the position from the input side."""
    net, _, index = name.rpartition(".")
    return (net, int(index)) if index.isdigit() else (name, 0)


def input_side_prefixes(layers: list[str], candidates: set[str],
                        max_depth: int | None = None) -> set[str]:
    """The candidates that, per network, form an unbroken run from its first layer (at
    most ``max_depth`` layers of each network)."""
    keep: set[str] = set()
    nets: dict[str, list[tuple[int, str]]] = {}
    for name in layers:
        net, index = layer_order(name)
        nets.setdefault(net, []).append((index, name))
    for members in nets.values():
        for depth, (_, name) in enumerate(sorted(members)):
            if name not in candidates or (max_depth is not None and depth >= max_depth):
                break
            keep.add(name)
    return keep


def plasticity(history: list[float], window: int, reference: int) -> float | None:
    """Mean of the last ``window`` movements over the mean of the first ``reference``
    (the layer's own movement early in the run, e.g. just after a task change); None
    until there is enough history (or the reference is zero)."""
    if len(history) < window + reference:
        return None
    recent = statistics.fmean(history[-window:])
    earlier = statistics.fmean(history[:reference])
    return recent / earlier if earlier > 0 else None


def movement_history(commits: list[dict[str, Any]], prefix: str = "model/",
                     lr_normalise: bool = True) -> dict[str, list[float]]:
    """Per layer, its relative change in each commit in which it moved (from commit
    statistics alone), divided by the commit's learning rate when ``lr_normalise``.

    ``commits`` are ``{"stats": ..., "metrics": ...}`` mappings, oldest first."""
    return {name: [rel for _, rel in moves]
            for name, moves in indexed_movement(commits, prefix, lr_normalise).items()}


def indexed_movement(commits: list[dict[str, Any]], prefix: str = "model/",
                     lr_normalise: bool = False) -> dict[str, list[tuple[int, float]]]:
    """Like :func:`movement_history`, with the index of each commit in ``commits``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for i, commit in enumerate(commits):
        layers = (commit.get("stats") or {}).get("layers") or {}
        lr = (commit.get("metrics") or {}).get("charts/learning_rate")
        scale = 1.0 / lr if lr_normalise and isinstance(lr, float) and lr > 0 else 1.0
        for name, entry in layers.items():
            if not name.startswith(prefix) or "/" in name[len(prefix):]:
                continue
            if entry.get("status") in ("unchanged", "added") or entry.get("rel") is None:
                continue  # frozen in this iteration, or no parent to compare with
            out.setdefault(name[len(prefix):], []).append((i, float(entry["rel"]) * scale))
    return out


def drift(path: list[float], net: float) -> float | None:
    """Net change over the sum of the steps' changes (None when nothing moved)."""
    total = sum(path)
    return net / total if total > 0 else None


@dataclass
class DirtyLayerController(Hook):
    """A hook (placed after the StoreHook) that freezes clean layers between iterations."""

    store: StoreHook
    config: DirtyLayerConfig = field(default_factory=DirtyLayerConfig)
    history: list[tuple[int, list[str]]] = field(default_factory=list)
    """(iteration, layers frozen during it) for every iteration decided."""
    last_changes: dict[str, float | None] = field(default_factory=dict)
    """the last decision's measure per layer: relative change, or plasticity"""
    measures: list[tuple[int, dict[str, float | None]]] = field(default_factory=list)
    """(iteration, measure per layer) for every decision that had one"""
    _commit_data: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    _offset: int | None = field(default=None, repr=False)
    """iterations the trainer had done before this run (a fork continues the snapshot's
    counter): warm-up and refresh count this run's iterations, i.e. from the branch point"""

    def on_iteration_end(self, trainer: Trainer, iteration: int,
                         metrics: dict[str, float]) -> None:
        cfg = self.config
        if self._offset is None:
            self._offset = iteration - 1
        upcoming = iteration + 1
        frozen = self.decide(trainer, upcoming - self._offset)
        current = set(trainer.frozen_layers)
        trainer.unfreeze_layers(current - frozen)
        trainer.freeze_layers(frozen - current)
        self.history.append((upcoming, sorted(frozen)))
        metrics["dirty/frozen_layers"] = float(len(frozen))
        metrics["dirty/refresh"] = float((upcoming - self._offset) % cfg.refresh == 0)

    def decide(self, trainer: Trainer, upcoming: int) -> set[str]:
        """The layers to freeze for iteration `upcoming` of this run (1-based)."""
        cfg = self.config
        layers = trainer.layer_names()
        if cfg.sync:
            self.store.flush()
        commits = self.store.commits
        if upcoming % cfg.refresh == 0 or upcoming <= cfg.warmup or \
                len(commits) < cfg.window + 1:
            return set()
        if cfg.criterion == "plasticity":
            changes = self._plasticities(commits)
            limit = cfg.plasticity
        elif cfg.criterion == "drift":
            changes = self._drifts(commits)
            limit = cfg.drift
        else:
            changes = self._window_changes(commits)
            limit = cfg.threshold
        self.last_changes = changes
        self.measures.append((upcoming, dict(changes)))
        dirty = {name for name in layers
                 if changes.get(name) is None or changes[name] > limit}  # type: ignore[operator]
        if len(dirty) < cfg.min_active:
            ranked = sorted(layers, key=lambda n: changes.get(n) or 0.0, reverse=True)
            dirty.update(ranked[:cfg.min_active])
        frozen = set(layers) - dirty
        if cfg.networks is not None:
            frozen = {name for name in frozen if layer_order(name)[0] in cfg.networks}
        if cfg.prefix_only:
            frozen = input_side_prefixes(layers, frozen, cfg.max_depth)
        return frozen

    def _window_changes(self, commits: list[str]) -> dict[str, float | None]:
        cfg = self.config
        diff = self.store.repo.diff(commits[-1 - cfg.window], commits[-1],
                                    threshold=cfg.threshold)
        return {lc.layer[len(cfg.prefix):]: lc.rel for lc in diff.layers
                if lc.layer.startswith(cfg.prefix)}

    def _commit_stats(self, commits: list[str]) -> list[dict[str, Any]]:
        repo = self.store.repo
        for cid in commits:
            if cid not in self._commit_data:
                commit = repo.read_commit(cid)
                self._commit_data[cid] = {"stats": commit.stats, "metrics": commit.metrics,
                                          "parents": commit.parents}
        return [self._commit_data[cid] for cid in commits]

    def _plasticities(self, commits: list[str]) -> dict[str, float | None]:
        """Plasticity per layer from the commits' statistics (no tensor is read)."""
        cfg = self.config
        history = movement_history(self._commit_stats(commits), cfg.prefix,
                                   cfg.lr_normalise)
        return {name: plasticity(h, cfg.window, cfg.reference) for name, h in history.items()}

    def _drifts(self, commits: list[str]) -> dict[str, float | None]:
        """Drift per layer: the path from commit statistics, the net change from one
        ``repo.diff`` per distinct starting snapshot (usually one)."""
        cfg = self.config
        data = self._commit_stats(commits)
        nets: dict[int, dict[str, float | None]] = {}
        out: dict[str, float | None] = {}
        for name, moves in indexed_movement(data, cfg.prefix).items():
            if len(moves) < cfg.window:
                out[name] = None
                continue
            recent = moves[-cfg.window:]
            start = recent[0][0] - 1  # the snapshot before the first of these steps
            if start not in nets:
                old = commits[start] if start >= 0 else (data[0]["parents"] or [None])[0]
                diff = self.store.repo.diff(old, commits[-1]) if old else None
                nets[start] = {} if diff is None else {
                    lc.layer[len(cfg.prefix):]: lc.rel for lc in diff.layers
                    if lc.layer.startswith(cfg.prefix)}
            net = nets[start].get(name)
            out[name] = None if net is None else drift([r for _, r in recent], net)
        return out
