"""Dirty-layer training: only layers that changed materially keep training.

After each iteration the controller asks the store how far each layer moved over the last
`window` snapshots (`repo.diff(old, new)`, computed from the stored objects in
O(changed bytes)). A layer is *dirty* when its relative change ||new - old|| / ||old||
exceeds `threshold`; the others are frozen for the next iteration: no gradients, no
optimizer step, no Hessian work, and since their bytes do not change, no new objects in
the store. Every `refresh` iterations all layers train once, so a frozen layer whose
gradients would move it again comes back; at least `min_active` layers always train.

Decisions use the snapshots committed so far; with background commits they may lag the
loop by the snapshot queue length (one or two iterations).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainer.hooks import Hook

if TYPE_CHECKING:
    from trainer.store_hook import StoreHook
    from trainer.train import Trainer


@dataclass
class DirtyLayerConfig:
    """Settings of the dirty-layer controller."""

    threshold: float = 0.02
    """Relative change over the window above which a layer stays trainable."""
    window: int = 3
    """Snapshots between the two commits compared (the change is cumulative over them)."""
    refresh: int = 10
    """Every `refresh` iterations all layers train (so frozen layers can come back)."""
    min_active: int = 1
    """Layers that always train (the ones that moved most)."""
    warmup: int = 5
    """Iterations before any layer may be frozen."""
    prefix: str = "model/"
    """Where the model's tensors live in the snapshot tree."""
    sync: bool = False
    """Wait for the latest snapshot before deciding (exact decisions; the loop waits for
    the store instead of overlapping with it)."""


@dataclass
class DirtyLayerController(Hook):
    """A hook (placed after the StoreHook) that freezes clean layers between iterations."""

    store: StoreHook
    config: DirtyLayerConfig = field(default_factory=DirtyLayerConfig)
    history: list[tuple[int, list[str]]] = field(default_factory=list)
    """(iteration, layers frozen during it) for every iteration decided."""
    last_changes: dict[str, float | None] = field(default_factory=dict)

    def on_iteration_end(self, trainer: Trainer, iteration: int,
                         metrics: dict[str, float]) -> None:
        cfg = self.config
        upcoming = iteration + 1
        frozen = self.decide(trainer, upcoming)
        current = set(trainer.frozen_layers)
        trainer.unfreeze_layers(current - frozen)
        trainer.freeze_layers(frozen - current)
        self.history.append((upcoming, sorted(frozen)))
        metrics["dirty/frozen_layers"] = float(len(frozen))
        metrics["dirty/refresh"] = float(upcoming % cfg.refresh == 0)

    def decide(self, trainer: Trainer, upcoming: int) -> set[str]:
        """The layers to freeze for iteration `upcoming`."""
        cfg = self.config
        layers = trainer.layer_names()
        if cfg.sync:
            self.store.flush()
        commits = self.store.commits
        if upcoming % cfg.refresh == 0 or upcoming <= cfg.warmup or \
                len(commits) < cfg.window + 1:
            return set()
        diff = self.store.repo.diff(commits[-1 - cfg.window], commits[-1],
                                    threshold=cfg.threshold)
        changes: dict[str, float | None] = {}
        for lc in diff.layers:
            if lc.layer.startswith(cfg.prefix):
                changes[lc.layer[len(cfg.prefix):]] = lc.rel
        self.last_changes = changes
        dirty = {name for name in layers
                 if name not in changes or changes[name] is None
                 or changes[name] > cfg.threshold}  # type: ignore[operator]
        if len(dirty) < cfg.min_active:
            ranked = sorted(layers, key=lambda n: changes.get(n) or 0.0, reverse=True)
            dirty.update(ranked[:cfg.min_active])
        return set(layers) - dirty
