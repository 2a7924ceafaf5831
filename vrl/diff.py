"""Layer-level change statistics between two snapshots (DESIGN section 3).

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
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vrl.objects import Manifest, TensorEntry

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


CHUNK = 1 << 18  # elements per step: temporaries stay in cache, memory stays flat


def _fp8_table(exp_bits: int, bias: int, kind: str) -> Any:
    """The 256 float64 values of an 8-bit float format, indexed by its bit pattern.

    kind: "fn" (no infinities, NaN = all ones), "ieee" (IEEE-style inf/NaN),
    "fnuz" (no infinities, no negative zero: 0x80 is the one NaN).
    """
    import numpy as np

    man_bits = 7 - exp_bits
    out = np.empty(256, dtype=np.float64)
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        exp, man = (bits >> man_bits) & ((1 << exp_bits) - 1), bits & ((1 << man_bits) - 1)
        if exp == 0:
            value = sign * math.ldexp(man, 1 - bias - man_bits)
        else:
            value = sign * math.ldexp((1 << man_bits) + man, exp - bias - man_bits)
        top = exp == (1 << exp_bits) - 1
        if kind == "fn" and top and man == (1 << man_bits) - 1:
            value = math.nan
        elif kind == "ieee" and top:
            value = sign * math.inf if man == 0 else math.nan
        elif kind == "fnuz" and bits == 0x80:
            value = math.nan
        out[bits] = value
    return out


_FP8 = {"float8_e4m3fn": (4, 7, "fn"), "float8_e5m2": (5, 15, "ieee"),
        "float8_e4m3fnuz": (4, 8, "fnuz"), "float8_e5m2fnuz": (5, 16, "fnuz")}
_FP8_TABLES: dict[str, Any] = {}
# dtypes reduced in float32 (as fast as and no less exact than torch's own reductions);
# every other dtype in float64
_HALF_TABLE: list[Any] = []  # float16 bit pattern -> float32 (a gather beats astype)
_F64_WORK = {"float64": "<f8", "bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2",
             "uint16": "<u2", "int32": "<i4", "uint32": "<u4", "int64": "<i8", "uint64": "<u8",
             "complex32": "<f2", "complex64": "<f4", "complex128": "<f8"}


def _elements(value: Any) -> tuple[Any, Callable[[Any], Any]]:
    """(flat array of a tensor's stored elements, converter of a slice of it to the work
    dtype). Works on raw bytes with numpy: no torch, whatever the dtype."""
    import numpy as np

    from vrl.safetensors_file import RawTensor

    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value).reshape(-1)
        if arr.dtype.kind == "c":
            arr = arr.view(arr.real.dtype)
        return arr, lambda x: x.astype(np.float64)
    if not isinstance(value, RawTensor):
        from vrl.tensors import tensor_bytes  # a torch tensor: look at its bytes

        buf, dtype, shape, keep = tensor_bytes(value)
        value = RawTensor(dtype, shape, buf)
    dtype, data = value.dtype, value.data
    if dtype.startswith("numpy:"):
        return _elements(np.frombuffer(data, dtype=np.dtype(dtype[6:])))
    if dtype == "float32":
        return np.frombuffer(data, "<f4"), lambda x: x
    if dtype == "float16":
        if not _HALF_TABLE:
            _HALF_TABLE.append(np.arange(1 << 16, dtype=np.uint16).view("<f2")
                               .astype(np.float32))
        return np.frombuffer(data, "<u2"), lambda x: np.take(_HALF_TABLE[0], x)
    if dtype == "bfloat16":  # the top half of a float32
        return np.frombuffer(data, "<u2"), \
            lambda x: (x.astype(np.uint32) << 16).view(np.float32)
    if dtype in _F64_WORK:
        return np.frombuffer(data, _F64_WORK[dtype]), lambda x: x.astype(np.float64)
    if dtype in _FP8:
        if dtype not in _FP8_TABLES:
            _FP8_TABLES[dtype] = _fp8_table(*_FP8[dtype])
        table = _FP8_TABLES[dtype]
        return np.frombuffer(data, "|u1"), lambda x: np.take(table, x)
    # an exotic dtype numpy cannot read (sub-byte integers, ...): let torch convert it
    import torch

    from vrl.tensors import tensor_from_buffer

    t = tensor_from_buffer(bytes(data), dtype, value.shape).reshape(-1)
    if t.is_complex():
        t = torch.view_as_real(t).reshape(-1)
    return t.to(torch.float64).numpy(), lambda x: x


def tensor_change(old: Any, new: Any) -> tuple[float, float, float]:
    """(||new-old||^2, ||old||^2, max|new-old|) of two tensors of one dtype and shape.

    Tensors are RawTensors (raw bytes, as the store and files hold them), ndarrays or torch
    tensors. Float32 and half precision are reduced in float32 (vectorised reductions keep
    the relative error near 1e-6, plenty for change statistics); everything else in float64.
    Complex tensors count as pairs of reals; a NaN anywhere makes the statistics NaN.
    """
    import numpy as np

    einsum = _EINSUM[0] if _EINSUM else _einsum()
    raw = _RAW[0] if _RAW else _raw_type()
    if type(old) is raw and type(new) is raw and old.dtype == "float32" and \
            new.dtype == "float32" and old.data.nbytes <= 4 * CHUNK:
        # the one-step float32 case below (most commits' changed tensors), written out:
        # the same operations in the same order, a few numpy calls fewer
        a, b = np.frombuffer(old.data, "<f4"), np.frombuffer(new.data, "<f4")
        d = np.subtract(b, a, out=_scratch(a.dtype, a.size)) if a.nbytes >= SCRATCH_MIN \
            else b - a
        if not d.size:
            return 0.0, 0.0, 0.0
        d2, o2 = 0.0 + float(einsum("i,i->", d, d)), 0.0 + float(einsum("i,i->", a, a))
        m = float(np.maximum.reduce(np.abs(d, out=d)))  # (ndarray.max, less its wrapper)
        return d2, o2, m if m > 0.0 or m != m else 0.0
    a_all, convert = _elements(old)
    b_all, _ = _elements(new)
    d2 = o2 = mx = 0.0
    for i in range(0, a_all.size, CHUNK):
        if a_all.size <= CHUNK:  # one step (most tensors): the arrays as they are
            a, b = convert(a_all), convert(b_all)
        else:
            a, b = convert(a_all[i:i + CHUNK]), convert(b_all[i:i + CHUNK])
        if a.nbytes >= SCRATCH_MIN and a.dtype == b.dtype and a.dtype.kind == "f":
            d = np.subtract(b, a, out=_scratch(a.dtype, a.size))
        else:
            d = b - a
        # einsum, not dot: BLAS's threaded dot stalls for milliseconds per call on a busy
        # machine; einsum's own vectorised loop is steady and needs no threads
        d2 += float(einsum("i,i->", d, d))
        o2 += float(einsum("i,i->", a, a))
        m = float(np.abs(d, out=d).max())  # (in place: d is not read again)
        if m > mx or m != m:
            mx = m
    return d2, o2, mx


_EINSUM: list[Any] = []
_RAW: list[Any] = []


def _raw_type() -> type:
    from vrl.safetensors_file import RawTensor

    _RAW.append(RawTensor)
    return RawTensor


def _einsum() -> Any:
    """numpy's einsum without its Python wrapper (what `np.einsum` calls when asked for
    no path optimisation, as here: the same loop, the same sums)."""
    import numpy as np

    try:
        from numpy._core.multiarray import c_einsum  # type: ignore[attr-defined]
    except ImportError:  # (another numpy layout: the wrapper, as before)
        c_einsum = np.einsum
    _EINSUM.append(c_einsum)
    return c_einsum


_SCRATCH = threading.local()
SCRATCH_MIN = 1 << 14  # bytes: smaller temporaries come from memory the allocator keeps


def _scratch(dtype: Any, size: int) -> Any:
    """A work array of `size` elements, this thread's own and kept (at most CHUNK
    elements a dtype): a fresh temporary costs a page fault per 4 KiB page - the
    allocator hands freed memory back to the system - and for a small tensor those
    faults cost several times the arithmetic."""
    import numpy as np

    arrays = _SCRATCH.__dict__.setdefault("arrays", {})
    buf = arrays.get(dtype)
    if buf is None or buf.size < size:
        buf = arrays[dtype] = np.empty(size, dtype)
    return buf[:size]


def _norm_sq(value: Any) -> float:
    import numpy as np

    arr, convert = _elements(value)
    total = 0.0
    for i in range(0, arr.size, CHUNK):
        a = convert(arr[i:i + CHUNK])
        total += float(np.einsum("i,i->", a, a))
    return total


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
        norm = _NORMS[key] = _norm_sq(load(entry))
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
