"""The arithmetic of a layer diff, in numpy on raw tensor bytes: ||new - old||^2, ||old||^2
and max |new - old| of two tensors of any stored dtype (8-bit floats through lookup tables,
bfloat16 widened), a chunk at a time so memory stays flat (vrl/diff.py groups them into
layers)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

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


def elements(value: Any) -> tuple[Any, Callable[[Any], Any]]:
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
        return elements(np.frombuffer(data, dtype=np.dtype(dtype[6:])))
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
    a_all, convert = elements(old)
    b_all, _ = elements(new)
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


def norm_sq(value: Any) -> float:
    """||value||^2 in float64 (what a layer's relative change divides by)."""
    import numpy as np

    arr, convert = elements(value)
    total = 0.0
    for i in range(0, arr.size, CHUNK):
        a = convert(arr[i:i + CHUNK])
        total += float(np.einsum("i,i->", a, a))
    return total
