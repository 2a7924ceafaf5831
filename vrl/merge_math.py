"""The arithmetic of merges (vrl/merge.py): floating tensors combined in float64 (complex128
for complex ones) from their raw bytes, with numpy, and cast back to their own dtype.

Casting rounds to nearest, ties to even, as numpy and torch do; bfloat16, which numpy
lacks, goes through float32 as torch's own cast does (`.double().float().bfloat16()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vrl.safetensors_file import RawTensor, as_numpy

COMPUTED = frozenset({"float16", "bfloat16", "float32", "float64", "complex64",
                      "complex128"})


def floating(dtype: str) -> bool:
    """A floating (or complex) dtype: merges combine these; others are never averaged."""
    if dtype.startswith("numpy:"):
        return numpy_dtype(dtype).kind in "fc"
    return dtype.startswith(("float", "bfloat", "complex"))


def computable(dtype: str) -> bool:
    """A floating dtype this module computes in (not float8, float4 or complex32)."""
    return dtype in COMPUTED or dtype.startswith("numpy:") and numpy_dtype(dtype).kind in "fc"


def numpy_dtype(dtype: str) -> Any:
    return as_numpy(RawTensor(dtype, (0,), b"")).dtype  # (vrl's table of numpy dtypes)


def wide(raw: RawTensor) -> Any:
    """The tensor as float64 (complex128) numpy values, exactly."""
    import numpy as np

    if raw.dtype == "bfloat16":  # the top half of a float32
        bits = np.frombuffer(raw.data, dtype="<u2").astype("<u4") << 16
        return bits.view("<f4").astype(np.float64).reshape(raw.shape)
    arr = as_numpy(raw)
    return arr.astype(np.complex128 if arr.dtype.kind == "c" else np.float64)


def narrow(values: Any, dtype: str) -> bytes:
    """float64 (complex128) values cast to `dtype`, as bytes."""
    import numpy as np

    if dtype == "bfloat16":
        with np.errstate(all="ignore"):  # (beyond float32's range: inf, as torch casts)
            bits = values.astype("<f4").view("<u4")
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
        nan = np.isnan(values)
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype("<u2")  # a quiet NaN, its sign kept
        return rounded.tobytes()
    with np.errstate(all="ignore"):
        return np.ascontiguousarray(values.astype(numpy_dtype(dtype))).tobytes()


def combine(raws: Sequence[RawTensor], weights: Sequence[float],
            base: RawTensor | None = None, lam: float = 1.0) -> bytes:
    """sum(w_i * x_i) / sum(w_i), left to right; with a `base`, task arithmetic instead:
    base + lam * sum(x_i - base). In the dtype of `raws[0]`."""
    import numpy as np

    with np.errstate(all="ignore"):  # inf - inf is nan, as IEEE says: no warning
        if base is not None:
            origin = wide(base)
            acc = wide(raws[0]) - origin
            for raw in raws[1:]:
                acc = acc + (wide(raw) - origin)
            out = origin + lam * acc
        else:
            out = wide(raws[0]) * weights[0]
            for w, raw in zip(weights[1:], raws[1:], strict=True):
                out = out + wide(raw) * w
            out = out / sum(weights)
    return narrow(out, raws[0].dtype)
