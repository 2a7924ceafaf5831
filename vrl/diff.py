"""Layer-level change statistics between two snapshots (DESIGN section 3).

A layer is a module prefix: `actor.0` groups `actor.0.weight` and `actor.0.bias`. Its
relative change is ||new - old|| / max(||old||, eps) over all its tensors; it changed
materially when that exceeds the threshold. Only tensors whose ids differ are read.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vrl.objects import Manifest, TensorEntry

EPS = 1e-12
DEFAULT_THRESHOLD = 1e-3


def layer_of(name: str) -> str:
    """`model/actor.0.weight` -> `model/actor.0`; `optimizer/state/3/exp_avg` ->
    `optimizer/state/3`; a name with neither '.' nor '/' is its own layer."""
    head, _, last = name.rpartition("/")
    if "." in last:
        prefix = last.rpartition(".")[0]
        return f"{head}/{prefix}" if head else prefix
    return head or last


def human_bytes(n: float) -> str:
    """1.5 MB style sizes (decimal units, like du --si)."""
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass
class TensorChange:
    name: str
    status: str  # added | removed | changed | unchanged
    shape: tuple[int, ...]
    nbytes: int
    delta_sq: float = 0.0  # ||new - old||^2
    old_sq: float = 0.0  # ||old||^2
    max_abs: float = 0.0
    comparable: bool = True  # False when dtype or shape changed


@dataclass
class LayerChange:
    layer: str
    status: str
    shapes: list[tuple[int, ...]]
    rel: float | None  # None: not comparable (added, removed, reshaped)
    max_abs: float
    material: bool
    nbytes: int

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "shapes": [list(s) for s in self.shapes],
                "rel": self.rel, "max_abs": self.max_abs, "material": self.material,
                "nbytes": self.nbytes}


@dataclass
class DiffResult:
    layers: list[LayerChange]
    bytes_new: int  # tensor bytes in `new` that `old` does not have
    bytes_total: int
    threshold: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def material(self) -> list[LayerChange]:
        return [layer for layer in self.layers if layer.material]

    def summary(self) -> str:
        return (f"{len(self.material)} of {len(self.layers)} layers changed materially; "
                f"{human_bytes(self.bytes_new)} of {human_bytes(self.bytes_total)} new")

    def to_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "bytes_new": self.bytes_new,
                "bytes_total": self.bytes_total, "summary": self.summary(),
                "layers": {lc.layer: lc.to_json() for lc in self.layers}}

    def with_threshold(self, threshold: float) -> DiffResult:
        layers = [LayerChange(lc.layer, lc.status, lc.shapes, lc.rel, lc.max_abs,
                              _is_material(lc.status, lc.rel, threshold), lc.nbytes)
                  for lc in self.layers]
        return DiffResult(layers, self.bytes_new, self.bytes_total, threshold, self.extra)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiffResult:
        layers = [LayerChange(name, v["status"], [tuple(s) for s in v["shapes"]],
                              _float(v["rel"]), _float(v["max_abs"]) or 0.0, v["material"],
                              v["nbytes"]) for name, v in data["layers"].items()]
        return cls(layers, data["bytes_new"], data["bytes_total"], data["threshold"])


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_material(status: str, rel: float | None, threshold: float) -> bool:
    if status == "unchanged":
        return False
    return rel is None or rel > threshold


def tensor_change(old: Any, new: Any) -> tuple[float, float, float]:
    """(||new-old||^2, ||old||^2, max|new-old|).

    Half-precision and float32 tensors are compared in float32 (vectorised reductions keep
    the relative error near 1e-6, plenty for change statistics); everything else in float64.
    """
    torch = sys.modules.get("torch")  # a tensor exists only if torch was imported
    if torch is not None and isinstance(old, torch.Tensor):
        a, b = old.detach().reshape(-1), new.detach().reshape(-1)
        work = torch.float32 if a.dtype in (torch.float32, torch.float16, torch.bfloat16) \
            else torch.float64
        if a.is_complex():
            a, b = torch.view_as_real(a).reshape(-1), torch.view_as_real(b).reshape(-1)
        a, b = a.to(work), b.to(work)
        if a.numel() == 0:
            return 0.0, 0.0, 0.0
        d = b - a
        return (float(torch.dot(d, d)), float(torch.dot(a, a)), float(d.abs().max()))
    import numpy as np

    a = np.asarray(old, dtype=np.float64).reshape(-1)
    b = np.asarray(new, dtype=np.float64).reshape(-1)
    d = b - a
    if d.size == 0:
        return 0.0, 0.0, 0.0
    return float((d * d).sum()), float((a * a).sum()), float(np.abs(d).max())


def _norm_sq(value: Any) -> float:
    return tensor_change(value, value)[1]


def compare(old: Manifest | None, new: Manifest, load: Callable[[TensorEntry], Any],
            known_objects: Callable[[str], bool] | None = None,
            threshold: float = DEFAULT_THRESHOLD) -> DiffResult:
    """Compare two manifests; `load` materialises a tensor from its entry (memory-mapped)."""
    old_entries = old.tensors if old else {}
    changes: list[TensorChange] = []
    for name, entry in new.tensors.items():
        prev = old_entries.get(name)
        if prev is None:
            changes.append(TensorChange(name, "added", entry.shape, entry.nbytes))
        elif prev.id == entry.id and prev.dtype == entry.dtype and prev.shape == entry.shape:
            changes.append(TensorChange(name, "unchanged", entry.shape, entry.nbytes))
        elif prev.dtype != entry.dtype or prev.shape != entry.shape:
            changes.append(TensorChange(name, "changed", entry.shape, entry.nbytes,
                                        comparable=False))
        else:
            d2, o2, mx = tensor_change(load(prev), load(entry))
            status = "changed" if d2 > 0 or prev.id != entry.id else "unchanged"
            changes.append(TensorChange(name, status, entry.shape, entry.nbytes, d2, o2, mx))
    for name, prev in old_entries.items():
        if name not in new.tensors:
            changes.append(TensorChange(name, "removed", prev.shape, 0))
    # The relative change of a layer is over all its tensors: unchanged ones in a changed
    # layer still count in the denominator (e.g. a frozen bias beside a moving weight).
    moved = {layer_of(c.name) for c in changes if c.status == "changed" and c.comparable}
    for change in changes:
        if change.status == "unchanged" and layer_of(change.name) in moved:
            change.old_sq = _norm_sq(load(new.tensors[change.name]))

    old_ids = {e.id for e in old_entries.values()}
    new_objects = {e.id: e.nbytes for e in new.tensors.values() if e.id not in old_ids}
    if known_objects is not None:  # "new" = bytes this commit added to the store
        new_objects = {k: v for k, v in new_objects.items() if not known_objects(k)}
    return DiffResult(group_layers(changes, threshold), sum(new_objects.values()), new.nbytes,
                      threshold)


def group_layers(changes: list[TensorChange], threshold: float) -> list[LayerChange]:
    groups: dict[str, list[TensorChange]] = {}
    for change in changes:
        groups.setdefault(layer_of(change.name), []).append(change)
    layers = []
    for layer, items in groups.items():
        statuses = {c.status for c in items}
        if statuses == {"unchanged"}:
            status = "unchanged"
        elif statuses == {"added"}:
            status = "added"
        elif statuses == {"removed"}:
            status = "removed"
        else:
            status = "changed"
        comparable = all(c.comparable and c.status in ("changed", "unchanged") for c in items)
        rel = None
        if comparable:
            rel = math.sqrt(sum(c.delta_sq for c in items)) / max(
                math.sqrt(sum(c.old_sq for c in items)), EPS)
        max_abs = max((c.max_abs for c in items), default=0.0)
        layers.append(LayerChange(layer, status, [c.shape for c in items], rel, max_abs,
                                  _is_material(status, rel, threshold),
                                  sum(c.nbytes for c in items)))
    return layers
