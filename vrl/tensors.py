"""Turning checkpoints (modules, state dicts, optimizer states, nested dicts) into named
tensors plus a JSON skeleton, and back, bit-exactly.

torch is imported only where torch tensors are involved: a checkpoint read from a
safetensors file holds RawTensors (raw bytes, vrl.safetensors_file) and never needs it.
Where torch (or numpy) is not imported yet, no value can be a torch tensor (or an ndarray),
so flatten() does not import them to find out.

Skeleton encoding (JSON objects appear only as tags, so user data cannot be confused
with them): dict -> {"$d": [[key, value], ...]} (keys str or int, order kept);
tuple -> {"$tu": [...]}; list -> [...]; tensor or numpy array -> {"$t": name};
non-finite float -> {"$f": "nan"}; bytes -> {"$b": base64}; torch.dtype -> {"$dt": name};
str, int, finite float, bool, None -> themselves.
"""

from __future__ import annotations

import ctypes
import json
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from vrl.errors import CheckpointError
from vrl.safetensors_file import RawTensor, as_numpy

if TYPE_CHECKING:
    import torch

    from vrl.safetensors_file import SafetensorsFile

SEP = "/"
# torch dtype names (str(dtype) without "torch.") and the aliases getattr(torch, ...) knows
TORCH_DTYPES = frozenset(
    "bfloat16 bits16 bits1x8 bits2x4 bits4x2 bits8 bool complex128 complex32 complex64 "
    "float16 float32 float4_e2m1fn_x2 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2 "
    "float8_e5m2fnuz float8_e8m0fnu int1 int16 int2 int3 int32 int4 int5 int6 int64 int7 "
    "int8 qint32 qint8 quint2x4 quint4x2 quint8 uint1 uint16 uint2 uint3 uint32 uint4 uint5 "
    "uint6 uint64 uint7 uint8 float double half cfloat cdouble chalf short int long".split())


class DtypeName(str):
    """A torch.dtype inside a checkpoint read without torch (kept by name)."""


def _torch() -> Any:
    """The torch module if something already imported it (else no torch tensor exists)."""
    return sys.modules.get("torch")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_TORCH_DTYPE: dict[str, torch.dtype] = {}  # names already looked up


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown tensor dtype {name!r} in manifest")
    _TORCH_DTYPE[name] = dtype
    return dtype


def file_state(source: SafetensorsFile) -> Any:
    """The checkpoint a safetensors file holds: a flat {name: tensor} dict in name order (as
    the safetensors library lists them), or the nested tree a vrl export recorded."""
    meta = source.header.metadata or {}
    tensors: dict[str, Any] = {k: source.tensors[k] for k in sorted(source.tensors)}
    if "vrl.tree" not in meta:
        return tensors
    try:
        for name, target in json.loads(meta.get("vrl.ties", "{}")).items():
            tensors[name] = tensors[target]
        for name in json.loads(meta.get("vrl.numpy", "[]")):
            tensors[name] = as_numpy(tensors[name])
        return unflatten(json.loads(meta["vrl.tree"]), tensors, raw=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{source.path}: its vrl metadata is damaged ({exc}); "
                              "re-export it") from exc


def to_state(obj: Any) -> Any:
    """Accept an nn.Module or optimizer as its state_dict, a read safetensors file as its
    checkpoint; anything else as it is."""
    if type(obj) is dict:  # (a state dict: every commit of a training loop)
        return obj
    from vrl.safetensors_file import SafetensorsFile

    if isinstance(obj, SafetensorsFile):
        return file_state(obj)
    torch = _torch()
    if torch is not None and isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
        return obj.state_dict()
    return obj


# The memo keeps the tensors it describes alive (its views hold them) until the next
# split: only small ones (where the attribute reads it saves are a cost worth saving,
# next to reading the bytes) and this many bytes of them at most
MEMO_TENSOR_MAX = 1 << 20
MEMO_BYTES = 32 << 20


class ViewMemo:
    """What `flatten` learnt about each torch tensor of the last checkpoint it split, by
    name, so the next split of the same tensors (every commit of a training run) costs a
    few attribute reads each: the tie key and a view of the bytes, kept while the tensor
    still has the same memory (address, offset, shape, strides, dtype on the CPU). The
    bytes are not remembered, only where they are: every commit still reads them all.

    `now` holds, after a `flatten`, {name: record} for every tensor of it that is viewable
    as it is (a contiguous CPU tensor of a dtype numpy knows): `record.view`, `.dtype`
    and `.shape` are `tensor_bytes`' first three values for it."""

    __slots__ = ("last", "now", "keys", "tree", "tree_text")

    def __init__(self) -> None:
        self.last: dict[str, _Viewed] = {}
        self.now: dict[str, _Viewed] = {}
        # a flat state dict of tensors (str keys, each its tensor's name) split last: its
        # keys and skeleton, and the skeleton's JSON text once a manifest wrote it. The
        # same keys again give this same skeleton object (never changed once made).
        self.keys: tuple[str, ...] | None = None
        self.tree: Any = None
        self.tree_text: str | None = None


class _Viewed(NamedTuple):
    tensor: Any  # the tensor object it was made from (keeps it alive)
    ptr: int  # where its elements start (data_ptr), then what else decides the memory
    offset: int
    size: Any  # torch.Size
    stride: tuple[int, ...]
    torch_dtype: Any
    key: tuple  # flatten's tie key
    view: memoryview | None  # its bytes; None where tensor_bytes must copy (no memo)
    dtype: str
    shape: tuple[int, ...]


def _same_memory(value: Any, rec: _Viewed) -> bool:
    """Whether `value` (a dense torch.Tensor or Parameter) has the memory `rec` was made
    from: the same elements at the same address, laid out alike, of the same dtype, on
    the CPU and not a negated view (whose bytes are not its values). Then `rec`'s tie key
    and view are what flatten and tensor_bytes would compute for it."""
    return (value.is_cpu and value.data_ptr() == rec.ptr and
            value.storage_offset() == rec.offset and value.dtype is rec.torch_dtype and
            value.shape == rec.size and value.stride() == rec.stride and
            not value.is_neg())


def _viewed(value: Any, key: tuple) -> _Viewed | None:
    """The memo record of a tensor whose tie key was just computed (None if it is not a
    plain tensor, or not viewable in place: then tensor_bytes copies it every time)."""
    name = _in_place(value, _torch())
    if name is None or value.nbytes > MEMO_TENSOR_MAX:
        return None
    view = cpu_view(value)  # (as tensor_bytes reads it)
    return _Viewed(value, value.data_ptr(), value.storage_offset(), value.shape,
                   value.stride(), value.dtype, key, view, name, tuple(value.shape))


def _split_again(obj: dict, memo: ViewMemo, plain: tuple, strided: Any
                 ) -> tuple[dict[str, Any], Any, dict[str, str]] | None:
    """`flatten(obj)` of a flat state dict with the keys of the last one split, each
    holding the memory it held then (see ViewMemo); None where that is not so."""
    if tuple(obj) != memo.keys:
        return None
    last, now = memo.last, {}
    seen: dict[tuple, str] = {}
    ties: dict[str, str] = {}
    for name, value in obj.items():
        rec = last[name]
        if type(value) not in plain or not (rec.tensor is value or value.layout == strided) \
                or not _same_memory(value, rec):
            return None
        if rec.tensor is not value:
            rec = rec._replace(tensor=value)
        now[name] = rec
        key = rec.key
        if key in seen:
            ties[name] = seen[key]
        else:
            seen[key] = name
    memo.last = memo.now = now
    return dict(obj), memo.tree, ties


_SCALARS = frozenset({int, str, bool, type(None)})  # (exact types: what enc keeps as is)


def flatten(obj: Any, memo: ViewMemo | None = None
            ) -> tuple[dict[str, Any], Any, dict[str, str]]:
    """Split a checkpoint into {name: tensor/ndarray}, a JSON skeleton and {name: tied-to}.

    Names are key paths joined by '/' (a flat state dict keeps its own keys). With a
    `memo` (see ViewMemo), tensors split the time before are recognised by their memory.
    """
    tensors: dict[str, Any] = {}
    ties: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    torch = _torch()
    np = sys.modules.get("numpy")
    tensor_type = torch.Tensor if torch is not None else None
    strided = torch.strided if torch is not None else None
    plain = (torch.Tensor, torch.nn.Parameter) if torch is not None else ()
    last = now = None
    memo_left = [MEMO_BYTES]  # what the memo may still keep alive
    if memo is not None:
        if memo.keys is not None and type(obj) is dict:
            again = _split_again(obj, memo, plain, strided)
            if again is not None:
                return again
        last, now = memo.last, {}

    # A path is the names from the top joined by SEP, built as the walk descends (None at
    # the top, which differs from a path of one empty key)
    def below(path: str | None, key: Any) -> str:
        return str(key) if path is None else path + SEP + str(key)

    def name_for(path: str | None) -> str:
        name = path or "tensor"
        base, n = name, 1
        while name in tensors:
            n += 1
            name = f"{base}#{n}"
        return name

    def enc(value: Any, path: str | None) -> Any:
        # torch tensors first: a state dict is mostly them (every commit walks it)
        if tensor_type is not None and isinstance(value, tensor_type):
            if value.layout != strided or value.is_quantized:
                raise CheckpointError(f"tensor {path or ''!r} is sparse or quantized; "
                                      "convert it to a dense tensor first")
            name = path or "tensor"
            if name in tensors:  # (a call less for the unique name of almost every tensor)
                name = name_for(path)
            tensors[name] = value
            rec = last.get(name) if last is not None else None
            if rec is not None and type(value) in plain and _same_memory(value, rec):
                if rec.tensor is not value:  # (the same memory, in another tensor object)
                    rec = rec._replace(tensor=value)
                now[name] = rec  # type: ignore[index]
                key = rec.key
                if key in seen:
                    ties[name] = seen[key]
                else:
                    seen[key] = name
            elif value.numel() > 0 and not value.is_meta:
                # (is_cpu first: `device.type` costs more than the rest of the key)
                key = ("cpu" if value.is_cpu else value.device.type,
                       value.untyped_storage().data_ptr(), value.storage_offset(),
                       tuple(value.shape), value.stride(), value.dtype)
                if now is not None and memo_left[0] > 0 and \
                        (rec := _viewed(value, key)) is not None:
                    now[name] = rec
                    memo_left[0] -= rec.view.nbytes  # type: ignore[union-attr]
                if key in seen:
                    ties[name] = seen[key]
                else:
                    seen[key] = name
            return {"$t": name}
        if isinstance(value, RawTensor):
            name = name_for(path)
            tensors[name] = value
            if value.nbytes:  # one object under several names: tied, as torch storages
                key = ("raw", id(value))
                if key in seen:
                    ties[name] = seen[key]
                else:
                    seen[key] = name
            return {"$t": name}
        if np is not None and isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise CheckpointError(f"array {path or ''!r} holds Python objects")
            name = name_for(path)
            tensors[name] = value
            return {"$t": name}
        if isinstance(value, Mapping):
            items = []
            for k, v in value.items():
                if isinstance(k, bool) or not isinstance(k, (str, int)):
                    raise CheckpointError(f"key {k!r} at {path or 'top level'!r} "
                                          "is not a string or integer")
                items.append([k, enc(v, str(k) if path is None else path + SEP + str(k))])
            return {"$d": items}
        if isinstance(value, DtypeName):
            return {"$dt": str(value)}
        if isinstance(value, (tuple, list)):
            # plain scalars, each its own encoding, as most lists are (Python's RNG state
            # alone is 625 ints, in every training snapshot): no call per element
            items = list(value) if all([type(v) in _SCALARS for v in value]) else \
                [enc(v, below(path, i)) for i, v in enumerate(value)]
            return {"$tu": items} if isinstance(value, tuple) else items
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$f": repr(value)}
        if value is None or isinstance(value, (str, int, bool)):
            return value
        if isinstance(value, bytes):
            import base64

            return {"$b": base64.b64encode(value).decode()}
        if torch is not None and isinstance(value, torch.dtype):
            return {"$dt": _dtype_name(value)}
        if np is not None and isinstance(value, (np.integer, np.floating, np.bool_)):
            return enc(value.item(), path)
        raise CheckpointError(f"value at {path or 'top level'!r} has type "
                              f"{type(value).__name__}, which a checkpoint cannot hold "
                              "(use tensors, numbers, strings, lists and dicts)")

    tree = enc(obj, None)
    if memo is not None:
        memo.last = memo.now = now  # type: ignore[assignment]
        # a flat dict of tensors, each named by its key: the next split of the same keys
        # may take the short way (_split_again)
        flat = type(obj) is dict and len(now) == len(obj) == len(tensors) and \
            all(type(k) is str and k in now for k in obj)  # type: ignore[operator]
        memo.keys, memo.tree, memo.tree_text = (tuple(obj), tree, None) if flat else \
            (None, None, None)
    return tensors, tree, ties


def unflatten(tree: Any, tensors: Mapping[str, Any], raw: bool = False) -> Any:
    """Rebuild the checkpoint from its skeleton and {name: tensor}.

    raw=True keeps torch out: dtypes in the tree come back as DtypeName.
    """

    def dec(node: Any) -> Any:
        if isinstance(node, list):
            return [dec(v) for v in node]
        if isinstance(node, dict):
            (tag, value), = node.items()
            if tag == "$t":
                return tensors[value]
            if tag == "$d":
                return {k: dec(v) for k, v in value}
            if tag == "$tu":
                return tuple(dec(v) for v in value)
            if tag == "$f":
                return float(value)
            if tag == "$b":
                import base64

                return base64.b64decode(value)
            if tag == "$dt":
                if not raw:
                    return torch_dtype(value)
                if value not in TORCH_DTYPES:
                    raise CheckpointError(f"unknown tensor dtype {value!r} in manifest")
                return DtypeName(value)
            raise CheckpointError(f"unknown tag {tag!r} in manifest tree")
        return node

    return dec(tree)


# dtypes whose CPU tensors numpy views as they are (tensor_bytes' fast path) -> their name
_NUMPY_VIEWABLE: dict[Any, str] = {}


def _numpy_viewable() -> dict[Any, str]:
    import torch

    if not _NUMPY_VIEWABLE:
        for dtype in (torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                      torch.int16, torch.int8, torch.uint8, torch.bool):
            _NUMPY_VIEWABLE[dtype] = _dtype_name(dtype)
    return _NUMPY_VIEWABLE


def _in_place(value: Any, torch: Any) -> str | None:
    """The dtype name of a plain, contiguous CPU tensor whose bytes are its values as they
    lie (of a dtype numpy knows, not a negative view), or None: such a tensor is read in
    place, in a few calls."""
    if torch is None or type(value) not in (torch.Tensor, torch.nn.Parameter) or \
            not value.is_cpu or not value.is_contiguous() or value.is_neg():
        return None
    return (_NUMPY_VIEWABLE or _numpy_viewable()).get(value.dtype)


def tensor_bytes(value: Any) -> tuple[memoryview, str, tuple[int, ...], Any]:
    """(raw little-endian bytes, dtype name, shape, keep-alive) of a tensor or array."""
    if isinstance(value, RawTensor):
        return value.data, value.dtype, value.shape, value
    name = _in_place(value, _torch())
    if name is not None:  # the common case (every commit reads every tensor): no copy
        return cpu_view(value), name, tuple(value.shape), value
    import numpy as np

    if isinstance(value, np.ndarray):
        arr = np.ascontiguousarray(value)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return memoryview(arr.reshape(-1).view(np.uint8)), f"numpy:{arr.dtype.str}", \
            tuple(arr.shape), arr
    # a conjugate or negative view holds its values' conjugate or negation: resolved (a
    # copy) first, as any other tensor not laid out as its values are
    t = value.detach().resolve_conj().resolve_neg()
    if t.device.type != "cpu":
        t = t.to("cpu")
    t = t.contiguous()
    return cpu_view(t), _dtype_name(t.dtype), tuple(t.shape), t


def cpu_view(t: Any) -> memoryview:
    """The bytes of a contiguous CPU tensor, viewed where they are. Not through
    `Tensor.numpy()`: that marks the tensor's storage as never resizable again, so a
    user's `t.resize_()` would fail after a commit. The view does not keep the memory
    alive: hold the tensor meanwhile, and re-check its address before reusing a view
    kept across user code (ViewMemo does)."""
    nbytes = t.numel() * t.element_size()
    if not nbytes:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def tensor_from_buffer(buf: Any, dtype: str, shape: tuple[int, ...], offset: int = 0,
                       nbytes: int | None = None) -> Any:
    """A tensor (or ndarray) viewing `nbytes` of `buf` (any writable or read-only buffer;
    all of it by default) from `offset`."""
    if nbytes is None:
        nbytes = len(memoryview(buf).cast("B")) - offset
    if dtype.startswith("numpy:"):
        import numpy as np

        return np.frombuffer(buf, dtype=np.dtype(dtype[6:]), offset=offset,
                             count=nbytes // np.dtype(dtype[6:]).itemsize).reshape(shape)
    import torch

    tdtype = _TORCH_DTYPE.get(dtype) or torch_dtype(dtype)
    if nbytes == 0:
        return torch.empty(shape, dtype=tdtype)
    if memoryview(buf).readonly:  # copy, so that the tensor may be written in place
        buf = bytearray(memoryview(buf)[offset:offset + nbytes])
        offset = 0
    size = tdtype.itemsize
    if offset % size == 0 and nbytes % size == 0:  # aligned (always, in the store): one
        # call less per tensor than bytes viewed as the dtype (restores make 100s)
        return torch.frombuffer(buf, dtype=tdtype, count=nbytes // size,
                                offset=offset).reshape(shape)
    raw = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    return raw.view(tdtype).reshape(shape)
