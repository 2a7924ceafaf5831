"""Layer-level change statistics between two snapshots (docs/design.md: layers).

A layer is a module prefix: `actor.0` groups `actor.0.weight` and `actor.0.bias`. Its
relative change is ||new - old|| / max(||old||, eps) over all its tensors; it changed
materially when that exceeds the threshold. Only tensors whose ids differ are read.
Scalar step counters (an optimizer's per-parameter `step`) are left out of the statistics:
they change every update and would make every optimizer entry look material.

A training snapshot (model, optimizer, RNG, environment, counters) is read through its
:class:`StateLayout`: model layers are counted as layers, optimizer state is grouped by the
parameter it belongs to, everything else is "other state", never counted as a layer.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vrl.objects import Manifest, TensorEntry
from vrl.tensor_norms import norm_sq, tensor_change

EPS = 1e-12
DEFAULT_THRESHOLD = 1e-3


# Tensor and layer names repeat from one commit to the next: what is derived from a name
# alone is remembered (bounded: a name is a few dozen bytes)
_NAME_CACHE_MAX = 1 << 16


def _cached(func: Callable[[str], Any]) -> Callable[[str], Any]:
    return functools.lru_cache(maxsize=_NAME_CACHE_MAX)(func)


@_cached
def layer_of(name: str) -> str:
    """`model/actor.0.weight` -> `model/actor.0`; `optimizer/state/3/exp_avg` ->
    `optimizer/state/3`; a name with neither '.' nor '/' is its own layer."""
    head, _, last = name.rpartition("/")
    if "." in last:
        prefix = last.rpartition(".")[0]
        return f"{head}/{prefix}" if head else prefix
    return head or last


@_cached
def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key that orders digit runs by value: `state/2` before `state/10`."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", name) if part)


COUNTER_NAMES = frozenset({"step", "steps", "global_step", "num_updates", "iteration"})


def is_counter(name: str, shape: tuple[int, ...]) -> bool:
    """A scalar step counter (Adam's `state/3/step`): its change says nothing about how
    far the weights moved, so change statistics leave it out."""
    return tuple(shape) == () and _counter_name(name)


@_cached
def _counter_name(name: str) -> bool:
    return re.split(r"[/.]", name)[-1] in COUNTER_NAMES


_OPTIMIZER_STATE = re.compile(r"^(.*?optimizer/)state/(\d+)$")
MODEL_PREFIXES = ("model/", "policy/")


@dataclass(frozen=True)
class StateLayout:
    """Where the parts of a snapshot live (declared in commit metadata `state_layout`, or
    derived from the names).

    ``model_prefix``: tensors under it are model layers (`model/`); None when the snapshot
    is not a training snapshot (then every layer is a layer, as for a plain state dict).
    ``optimizer_params``: the parameter (name under the model prefix) of each optimizer
    state index, so `algo/optimizer/state/3` reads as `critic.2.bias`.
    """

    model_prefix: str | None = None
    optimizer_params: tuple[str, ...] = ()

    @classmethod
    def derive(cls, layer_names: Any, meta: Mapping[str, Any] | None = None) -> StateLayout:
        declared = (meta or {}).get("state_layout")
        if isinstance(declared, Mapping) and isinstance(declared.get("model_prefix"), str):
            params = declared.get("optimizer_params") or ()
            return cls(declared["model_prefix"],
                       tuple(str(p) for p in params if isinstance(p, str)))
        names = list(layer_names)
        for prefix in MODEL_PREFIXES:
            if any(n.startswith(prefix) for n in names):
                return cls(prefix)
        return cls()

    def kind(self, layer: str) -> str:
        """"model", "optimizer" or "other" (always "model" without a model prefix)."""
        if self.model_prefix is None or layer.startswith(self.model_prefix):
            return "model"
        return "optimizer" if _OPTIMIZER_STATE.match(layer) else "other"

    def parameter(self, layer: str) -> str | None:
        """The parameter an optimizer-state layer belongs to (None if not declared)."""
        match = _OPTIMIZER_STATE.match(layer)
        if match is None:
            return None
        index = int(match.group(2))
        return self.optimizer_params[index] if index < len(self.optimizer_params) else None


def human_bytes(n: float) -> str:
    """1.5 MB style sizes (decimal units, like du --si)."""
    text = _HUMAN.get(n) if type(n) is int else None
    if text is not None:
        return text
    size = n
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            text = f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
            break
        size /= 1000
    if type(n) is int:
        if len(_HUMAN) >= 1 << 12:
            _HUMAN.clear()
        _HUMAN[n] = text  # type: ignore[assignment]
    return text  # type: ignore[return-value]


# the texts of byte counts: every commit's summary names two (the state's total, the same
# each time, and what it added)
_HUMAN: dict[int, str] = {}


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
    counter: bool = False  # a scalar step counter: left out of the statistics


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
    declared_layout: StateLayout | None = None  # from the commit's metadata, if any
    only: tuple[str, ...] = ()  # the prefixes `with_only` kept (for the summary)
    # compare()'s layout of these layers (their order, layout, kinds), made once per set
    # of tensor names; a result made any other way derives them
    _plan: _Plan | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        plan = self._plan
        if plan is not None and [lc.layer for lc in self.layers] == plan.order:
            return  # (made in this order)
        self._plan = None
        self.layers = sorted(self.layers, key=lambda lc: natural_key(lc.layer))

    @property
    def layout(self) -> StateLayout:
        return self.declared_layout or StateLayout.derive(lc.layer for lc in self.layers)

    @property
    def material(self) -> list[LayerChange]:
        return [layer for layer in self.layers if layer.material]

    def section(self, kind: str) -> list[LayerChange]:
        """The layers of one kind: "model", "optimizer" or "other" (see StateLayout)."""
        layout = self.layout
        return [lc for lc in self.layers if layout.kind(lc.layer) == kind]

    def summary(self) -> str:
        return self._summary(self.layout)

    def _summary(self, layout: StateLayout) -> str:
        new = f"{human_bytes(self.bytes_new)} of {human_bytes(self.bytes_total)} new"
        only = f" (only {', '.join(self.only)})" if self.only else ""
        if layout.model_prefix is None:
            return (f"{len(self.material)} of {len(self.layers)} layers changed materially"
                    f"{only}; {new}")
        sections: dict[str, list[LayerChange]] = {"model": [], "optimizer": [], "other": []}
        for lc in self.layers:
            sections[layout.kind(lc.layer)].append(lc)
        model, optim, other = sections["model"], sections["optimizer"], sections["other"]
        parts = [f"{sum(lc.material for lc in model)} of {len(model)} model layers "
                 "changed materially"]
        if optim:
            parts.append(f"optimizer state of {sum(lc.material for lc in optim)} of "
                         f"{len(optim)} parameters changed materially")
        changed = [lc.layer for lc in other if lc.status != "unchanged"]
        if changed:
            shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more"
                                              if len(changed) > 4 else "")
            parts.append(f"other state changed: {shown}")
        parts[0] += only
        return "; ".join([*parts, new])

    def to_json(self) -> dict[str, Any]:
        plan = self._plan if self.declared_layout is None else None
        layout = self.layout if plan is None else plan.layout  # once (every commit)
        if plan is None:
            layers = {lc.layer: lc.to_json() for lc in self.layers}
            if layout.model_prefix is not None:  # a training snapshot: what each one is
                for name, kind in _kinds(layout, layers).items():
                    _set_kind(layers[name], *kind)
        else:  # a layer compare() found unchanged as before: a copy of its entry then
            layers = {}
            for lc in self.layers:
                same = plan.same.get(lc.layer)
                if same is None or same[1] is not lc:
                    layers[lc.layer] = self._entry(lc, plan)
                    continue
                if same[3] is None:
                    same[3] = self._entry(lc, plan)
                layers[lc.layer] = same[3].copy()
        return {"threshold": self.threshold, "bytes_new": self.bytes_new,
                "bytes_total": self.bytes_total, "summary": self._summary(layout),
                "layers": layers}

    @staticmethod
    def _entry(lc: LayerChange, plan: _Plan) -> dict[str, Any]:
        """`lc.to_json()`, with its kind where the plan's layout has a model prefix."""
        entry = lc.to_json()
        if plan.layout.model_prefix is not None:  # a training snapshot: what each one is
            _set_kind(entry, *plan.kinds[lc.layer])
        return entry

    def layer_texts(self) -> dict[str, str]:
        """{layer: its text in a commit's statistics (vrl.objects._layer_json of its
        `to_json()` entry)} of the layers compare() found unchanged as before: the same
        LayerChange objects, whose text is worked out once."""
        plan = self._plan
        if plan is None or self.declared_layout is not None:
            return {}
        from vrl.objects import _layer_json

        out = {}
        for lc in self.layers:
            same = plan.same.get(lc.layer)
            if same is None or same[1] is not lc:
                continue
            text = same[2]
            if text is None:
                text = same[2] = _layer_json(lc.layer, self._entry(lc, plan))
                if text is None:
                    continue
            out[lc.layer] = text
        return out

    def _replace(self, layers: list[LayerChange], **changes: Any) -> DiffResult:
        fields = {"threshold": self.threshold, "extra": self.extra,
                  "declared_layout": self.declared_layout, "only": self.only, **changes}
        return DiffResult(layers, self.bytes_new, self.bytes_total, **fields)

    def with_threshold(self, threshold: float) -> DiffResult:
        layers = [LayerChange(lc.layer, lc.status, lc.shapes, lc.rel, lc.max_abs,
                              _is_material(lc.status, lc.rel, threshold), lc.nbytes)
                  for lc in self.layers]
        return self._replace(layers, threshold=threshold)

    def with_layout(self, meta: Mapping[str, Any] | None) -> DiffResult:
        """Read the layers through the layout a commit's metadata declares (if any)."""
        layout = StateLayout.derive((lc.layer for lc in self.layers), meta)
        return self._replace(self.layers, declared_layout=layout)

    def with_only(self, prefixes: Any) -> DiffResult:
        """Keep the layers whose name starts with one of ``prefixes`` (`model/actor`);
        the layout is fixed first, so the kept layers are still classified correctly."""
        prefixes = tuple(prefixes)
        if not prefixes:
            return self
        layers = [lc for lc in self.layers if lc.layer.startswith(prefixes)]
        return self._replace(layers, declared_layout=self.layout, only=prefixes)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiffResult:
        layers = [LayerChange(name, v["status"], [tuple(s) for s in v["shapes"]],
                              _float(v["rel"]), _float(v["max_abs"]) or 0.0, v["material"],
                              v["nbytes"]) for name, v in data["layers"].items()]
        return cls(layers, data["bytes_new"], data["bytes_total"], data["threshold"])


def _set_kind(entry: dict[str, Any], kind: str, parameter: str | None) -> None:
    """A layer's statistics entry says what it is (and whose optimizer state)."""
    entry["kind"] = kind
    if parameter:
        entry["parameter"] = parameter


def _kinds(layout: StateLayout, layers: Any) -> dict[str, tuple[str, str | None]]:
    """{layer: (kind, the parameter an optimizer-state layer belongs to, or None)}."""
    out = {}
    for name in layers:
        kind = layout.kind(name)
        out[name] = (kind, layout.parameter(name) if kind == "optimizer" else None)
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _is_material(status: str, rel: float | None, threshold: float) -> bool:
    if status == "unchanged":
        return False
    return rel is None or rel > threshold


# ||x||^2 of unchanged tensors, by (object id, dtype): the bias beside a moving weight is
# read and reduced once, not at every commit (oldest dropped first)
_NORMS: dict[tuple[str, str], float] = {}
_NORMS_MAX = 1 << 14


class _Plan:
    """What compare() derives from a snapshot's tensor names alone: the layers (in order
    of first appearance, each with its tensors' names and whether each is named like a
    step counter), their order in a result, the layout and each layer's kind. A training
    run commits the same names again and again: made once per set of names."""

    __slots__ = ("groups", "order", "layout", "kinds", "same")

    def __init__(self, names: tuple[str, ...]) -> None:
        groups: dict[str, list[tuple[str, bool]]] = {}
        for name in names:
            groups.setdefault(layer_of(name), []).append((name, _counter_name(name)))
        self.groups = list(groups.items())
        self.order = sorted(groups, key=natural_key)  # as DiffResult sorts its layers
        self.layout = StateLayout.derive(self.order)
        self.kinds = _kinds(self.layout, self.order)
        # layer -> [its entries, the LayerChange made for them unchanged, that layer's
        # statistics text or None]: a layer whose entries are the very same objects again
        # (a commit reuses an unchanged tensor's entry) gets the same LayerChange, never
        # changed once made, whose text is then known (see DiffResult.layer_texts)
        self.same: dict[str, list[Any]] = {}


_PLANS: dict[tuple[str, ...], _Plan] = {}
_PLANS_MAX = 64


def _plan(names: tuple[str, ...]) -> _Plan:
    plan = _PLANS.get(names)
    if plan is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        plan = _PLANS[names] = _Plan(names)
    return plan


def compare(old: Manifest | None, new: Manifest, load: Callable[[TensorEntry], Any],
            known_objects: Callable[[str], bool] | None = None,
            threshold: float = DEFAULT_THRESHOLD) -> DiffResult:
    """Compare two manifests; `load` materialises a tensor from its entry (memory-mapped)."""
    old_entries = old.tensors if old else {}
    new_entries = new.tensors
    names = tuple(new_entries)
    if old_entries.keys() <= new_entries.keys():
        # nothing removed (every commit of a training run): layer by layer, from the plan
        plan = _plan(names)
        layers = _layers(old_entries, new_entries, plan, load, threshold)
    else:
        layers, plan = _compare_general(old_entries, new_entries, load, threshold), None
    # (an entry that is the very object the old manifest has under its name holds an old
    # id: only the others are looked at)
    fresh = [e for name, e in new_entries.items() if old_entries.get(name) is not e]
    old_ids = {e.id for e in old_entries.values()} if fresh else set()
    new_objects = {e.id: e.nbytes for e in fresh if e.id not in old_ids}
    if known_objects is not None:  # "new" = bytes this commit added to the store
        new_objects = {k: v for k, v in new_objects.items() if not known_objects(k)}
    return DiffResult(layers, sum(new_objects.values()), new.nbytes, threshold, _plan=plan)


def _layers(old_entries: Mapping[str, TensorEntry], new_entries: Mapping[str, TensorEntry],
            plan: _Plan, load: Callable[[TensorEntry], Any], threshold: float
            ) -> list[LayerChange]:
    """compare()'s layers where no tensor was removed: what `_compare_general` computes
    (the same sums, in the same order), without a TensorChange per tensor."""
    by_layer = {}
    cached = plan.same
    for layer, members in plan.groups:
        same = cached.get(layer)
        if same is not None:  # its very entries again, on both sides: the same result
            for (name, _), entry in zip(members, same[0], strict=True):
                if new_entries[name] is not entry or old_entries.get(name) is not entry:
                    break
            else:
                by_layer[layer] = same[1]
                continue
        for name, _ in members:
            entry = new_entries[name]
            prev = old_entries.get(name)
            if prev is not entry and (prev is None or prev.id != entry.id or
                                      prev.dtype != entry.dtype or prev.shape != entry.shape):
                break
        else:  # every tensor unchanged (most layers of a commit): what the sums below give
            entries = [new_entries[name] for name, _ in members]
            same = plan.same.get(layer)
            if same is not None and len(same[0]) == len(entries) and \
                    all(map(operator.is_, same[0], entries)):
                by_layer[layer] = same[1]
                continue
            change = by_layer[layer] = LayerChange(
                layer, "unchanged", [e.shape for e in entries], 0.0, 0.0, False,
                sum([e.nbytes for e in entries]))
            plan.same[layer] = [entries, change, None, None]
            continue
        # per tensor: [status, shape, nbytes, delta_sq, old_sq, max_abs, comparable, counter]
        items = []
        moved = False
        for name, counter_name in members:
            entry = new_entries[name]
            prev = old_entries.get(name)
            shape = entry.shape
            if prev is None:
                items.append(["added", shape, entry.nbytes, 0.0, 0.0, 0.0, True, False])
            elif prev is entry or (prev.id == entry.id and prev.dtype == entry.dtype and
                                   prev.shape == shape):
                items.append(["unchanged", shape, entry.nbytes, 0.0, 0.0, 0.0, True, False])
            elif prev.dtype != entry.dtype or prev.shape != shape:
                items.append(["changed", shape, entry.nbytes, 0.0, 0.0, 0.0, False, False])
            elif counter_name and tuple(shape) == ():
                items.append(["changed", shape, entry.nbytes, 0.0, 0.0, 0.0, True, True])
            else:
                d2, o2, mx = tensor_change(load(prev), load(entry))
                status = "changed" if d2 > 0 or prev.id != entry.id else "unchanged"
                items.append([status, shape, entry.nbytes, d2, o2, mx, True, False])
                moved = moved or status == "changed"
        status = items[0][0]
        comparable = True
        for (name, counter_name), item in zip(members, items, strict=True):
            if item[0] != status:
                status = "changed"  # mixed: e.g. a tensor added to a layer
            if not item[6] or item[0] not in ("changed", "unchanged"):
                comparable = False
            # an unchanged tensor in a moved layer still counts in the denominator
            if moved and item[0] == "unchanged" and not (counter_name and
                                                         tuple(item[1]) == ()):
                item[4] = _unchanged_norm(new_entries[name], load)
        rel = None
        if comparable:
            rel = math.sqrt(sum([item[3] for item in items])) / max(
                math.sqrt(sum([item[4] for item in items])), EPS)
        max_abs = max([item[5] for item in items])
        by_layer[layer] = LayerChange(layer, status, [item[1] for item in items], rel,
                                      max_abs, _is_material(status, rel, threshold),
                                      sum([item[2] for item in items]))
    return [by_layer[layer] for layer in plan.order]


def _unchanged_norm(entry: TensorEntry, load: Callable[[TensorEntry], Any]) -> float:
    """||x||^2 of an unchanged tensor in a moved layer (cached by object id and dtype)."""
    key = (entry.id, entry.dtype)  # the norm depends on the bytes and the dtype
    norm = _NORMS.get(key)
    if norm is None:
        norm = _NORMS[key] = norm_sq(load(entry))
        if len(_NORMS) > _NORMS_MAX:
            del _NORMS[next(iter(_NORMS))]
    return norm


def _compare_general(old_entries: Mapping[str, TensorEntry],
                     new_entries: Mapping[str, TensorEntry],
                     load: Callable[[TensorEntry], Any], threshold: float
                     ) -> list[LayerChange]:
    changes: list[TensorChange] = []
    for name, entry in new_entries.items():
        prev = old_entries.get(name)
        if prev is None:
            changes.append(TensorChange(name, "added", entry.shape, entry.nbytes))
        elif prev.id == entry.id and prev.dtype == entry.dtype and prev.shape == entry.shape:
            changes.append(TensorChange(name, "unchanged", entry.shape, entry.nbytes))
        elif prev.dtype != entry.dtype or prev.shape != entry.shape:
            changes.append(TensorChange(name, "changed", entry.shape, entry.nbytes,
                                        comparable=False))
        elif is_counter(name, entry.shape):
            changes.append(TensorChange(name, "changed", entry.shape, entry.nbytes,
                                        counter=True))
        else:
            d2, o2, mx = tensor_change(load(prev), load(entry))
            status = "changed" if d2 > 0 or prev.id != entry.id else "unchanged"
            changes.append(TensorChange(name, status, entry.shape, entry.nbytes, d2, o2, mx))
    for name, prev in old_entries.items():
        if name not in new_entries:
            changes.append(TensorChange(name, "removed", prev.shape, 0))
    # The relative change of a layer is over all its tensors: unchanged ones in a changed
    # layer still count in the denominator (e.g. a frozen bias beside a moving weight).
    moved = {layer_of(c.name) for c in changes
             if c.status == "changed" and c.comparable and not c.counter}
    for change in changes:
        if (change.status == "unchanged" and layer_of(change.name) in moved
                and not is_counter(change.name, change.shape)):
            change.old_sq = _unchanged_norm(new_entries[change.name], load)
    return group_layers(changes, threshold)


def group_layers(changes: list[TensorChange], threshold: float) -> list[LayerChange]:
    groups: dict[str, list[TensorChange]] = {}
    for change in changes:
        layer = layer_of(change.name)
        items = groups.get(layer)
        if items is None:
            groups[layer] = [change]
        else:
            items.append(change)
    layers = []
    for layer, items in groups.items():  # (one pass each and no generators: every commit)
        status = items[0].status
        comparable = True
        for c in items:
            if c.status != status:
                status = "changed"  # mixed: e.g. a tensor added to a layer
            if not c.comparable or c.status not in ("changed", "unchanged"):
                comparable = False
        rel = None
        if comparable:
            rel = math.sqrt(sum([c.delta_sq for c in items])) / max(
                math.sqrt(sum([c.old_sq for c in items])), EPS)
        max_abs = max([c.max_abs for c in items])
        layers.append(LayerChange(layer, status, [c.shape for c in items], rel, max_abs,
                                  _is_material(status, rel, threshold),
                                  sum([c.nbytes for c in items])))
    return layers
