"""vrl's own safetensors reader/writer and the numpy layer statistics, checked against the
safetensors library and against the torch implementation the statistics replaced."""

import json
import math
import struct

import numpy as np
import pytest
import torch
from helpers import assert_same
from safetensors.torch import load_file, save, save_file

from vrl.errors import CheckpointError
from vrl.safetensors_file import (
    DTYPES,
    RawTensor,
    code_of,
    header_bytes,
    parse_header,
    read_file,
)
from vrl.tensor_norms import CHUNK, tensor_change
from vrl.tensors import TORCH_DTYPES, file_state
from vrl.workspace import read_checkpoint, write_checkpoint

TORCH_OF = {name: getattr(torch, name) for name, _ in DTYPES.values()}


def sample(dtype: torch.dtype, shape=(37, 29), seed=0, scale=3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(size=shape, generator=g) * scale
    if dtype == torch.bool:
        return base > 0
    if dtype in (torch.complex64, torch.complex128):
        return torch.complex(base, -base * 0.5).to(dtype)
    if dtype in (torch.uint16, torch.uint32, torch.uint64, torch.uint8):
        return (base.abs() * 9).to(torch.int64).to(dtype)
    if not dtype.is_floating_point:
        return (base * 9).to(torch.int64).clamp(-120, 120).to(dtype)
    return base.to(dtype)


def raw(t: torch.Tensor) -> RawTensor:
    data = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return RawTensor(str(t.dtype).removeprefix("torch."), tuple(t.shape), memoryview(data))


def torch_reference(old: torch.Tensor, new: torch.Tensor) -> tuple[float, float, float]:
    """vrl.tensor_norms.tensor_change as it was, in torch (the numbers the numpy version keeps)."""
    a, b = old.detach().reshape(-1), new.detach().reshape(-1)
    work = torch.float32 if a.dtype in (torch.float32, torch.float16, torch.bfloat16) \
        else torch.float64
    if a.is_complex():
        a, b = torch.view_as_real(a).reshape(-1), torch.view_as_real(b).reshape(-1)
    a, b = a.to(work), b.to(work)
    if a.numel() == 0:
        return 0.0, 0.0, 0.0
    d = b - a
    return float(torch.dot(d, d)), float(torch.dot(a, a)), float(d.abs().max())


def close(x: float, y: float, rel: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or abs(x - y) <= rel * max(abs(x), abs(y))


ALL = [getattr(torch, n) for n in sorted({name for name, _ in DTYPES.values()})
       if hasattr(torch, n) and n != "float8_e8m0fnu"] + [torch.complex128]


@pytest.mark.parametrize("dtype", ALL, ids=str)
@pytest.mark.parametrize("shape", [(37, 29), (), (0, 3), (CHUNK + 1001,)], ids=str)
def test_numpy_statistics_match_torch(dtype, shape):
    old = sample(dtype, shape, seed=1)
    new = sample(dtype, shape, seed=2) if dtype != torch.bool else ~old
    if dtype.is_floating_point and old.numel() > 4:  # some elements unchanged
        new.view(-1)[3:9] = old.view(-1)[3:9]
    want = torch_reference(old, new)
    got = tensor_change(raw(old), raw(new))
    # float32 sums of 10^5 terms: torch's own result moves by ~1e-5 with its thread count
    rel = 5e-5 if dtype in (torch.float32, torch.float16, torch.bfloat16) else 1e-12
    assert all(close(g, w, rel) for g, w in zip(got, want, strict=True)), (got, want)
    if not dtype.is_complex and old.numel():  # and closer to the exact value than that
        a, b = old.to(torch.float64).reshape(-1), new.to(torch.float64).reshape(-1)
        exact = (float((b - a) @ (b - a)), float(a @ a))
        assert all(close(g, e, 1e-5) for g, e in zip(got, exact, strict=False)), (got, exact)
    assert got[2] == want[2] or (math.isnan(got[2]) and math.isnan(want[2]))  # exact max
    # a torch tensor and an ndarray are accepted too
    assert tensor_change(old, new) == got


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                  "float8_e5m2fnuz"])
def test_fp8_lookup_tables_are_exact(name):
    bits = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    t = bits.view(getattr(torch, name))
    zero = torch.zeros_like(t)
    # ||t - 0||^2 summed in float64 is not enough to pin every entry: check each element
    for i in range(256):
        want = float(t[i].to(torch.float64))
        got = tensor_change(raw(zero[i:i + 1]), raw(t[i:i + 1]))[2]
        assert close(got, abs(want), 0), (i, got, want)


@pytest.mark.parametrize("dtype", [d for d in ALL if d.is_floating_point], ids=str)
def test_nan_statistics_match_torch(dtype):
    old = sample(dtype, (50,))
    new = old.clone()
    new[4] = float("nan")
    want, got = torch_reference(old, new), tensor_change(raw(old), raw(new))
    assert all(close(g, w, 1e-5) for g, w in zip(got, want, strict=True)), (got, want)


def test_nan_anywhere_makes_max_abs_nan():
    a = torch.zeros(CHUNK * 2 + 5)
    b = a.clone()
    b[7] = float("nan")
    b[CHUNK + 9] = 5.0
    assert math.isnan(tensor_change(raw(a), raw(b))[2])


def test_numpy_arrays_are_compared_in_float64():
    a = np.linspace(0, 1, 1000, dtype=np.float32)
    b = a * 1.5
    d2, o2, mx = tensor_change(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert close(d2, float(((b64 - a64) ** 2).sum()), 1e-12)
    assert close(o2, float((a64 ** 2).sum()), 1e-12)


def test_dtype_table_matches_the_library_and_torch():
    from safetensors.torch import _TYPES

    for code, dtype in _TYPES.items():
        assert DTYPES[code][0] == str(dtype).removeprefix("torch."), code
        assert DTYPES[code][1] == dtype.itemsize
    names = {str(v).removeprefix("torch.") for v in vars(torch).values()
             if isinstance(v, torch.dtype)}
    assert names <= TORCH_DTYPES


# ------------------------------------------------------------------------------ reading


def library_state() -> dict:
    return {"w": sample(torch.bfloat16, (8, 4)), "b": sample(torch.float16, (8,)),
            "q": sample(torch.int8, (5, 5)), "mask": sample(torch.bool, (6,)),
            "scalar": torch.tensor(2.5), "empty": torch.empty(0, 7),
            "f8": sample(torch.float8_e5m2, (9,)), "u64": sample(torch.uint64, (3,)),
            "c": sample(torch.complex64, (2, 2)), "d": sample(torch.float64, (4,))}


def test_reads_what_the_library_writes(tmp_path):
    state = library_state()
    path = tmp_path / "m.safetensors"
    save_file(state, str(path), metadata={"k": "v", "z": "ü"})
    f = read_file(path)
    assert f.header.metadata == {"k": "v", "z": "ü"}
    assert list(file_state(f)) == sorted(state)
    back = read_checkpoint(path)
    assert_same(dict(sorted(load_file(str(path)).items())), back)  # name order, as before
    for name, t in state.items():
        assert f.tensors[name].dtype == str(t.dtype).removeprefix("torch.")
        assert bytes(f.tensors[name].data) == raw(t).data.tobytes()


def test_canonical_writer_matches_the_library_byte_for_byte(tmp_path):
    state = library_state()
    for metadata in (None, {"format": "pt"}):
        lib = save(state, metadata=metadata)
        entries = [(n, code_of(str(t.dtype).removeprefix("torch.")), tuple(t.shape),
                    t.numel() * t.element_size()) for n, t in state.items()]
        head, order = header_bytes(entries, metadata)
        ours = head + b"".join(raw(state[n]).data.tobytes() for n in order)
        assert ours == lib


def test_vrl_files_are_deterministic_and_round_trip(tmp_path):
    state = {"model": library_state(), "np": np.arange(6, dtype=np.int16).reshape(2, 3),
             "dt": torch.float16, "n": 3}
    state["model"]["tied"] = state["model"]["w"]
    write_checkpoint(state, tmp_path / "a.safetensors")
    write_checkpoint(state, tmp_path / "b.safetensors")
    data = (tmp_path / "a.safetensors").read_bytes()
    assert data == (tmp_path / "b.safetensors").read_bytes()
    back = read_checkpoint(tmp_path / "a.safetensors")
    assert back["model"]["tied"] is back["model"]["w"]
    assert_same(state, back)
    # and the library reads the file as the same tensors
    lib = load_file(str(tmp_path / "a.safetensors"))
    assert torch.equal(lib["model/q"], state["model"]["q"])


def handmade(entries, metadata=None, pad=0, data=None, order=None) -> bytes:
    """A safetensors file from (name, code, shape, bytes), JSON in `order`."""
    doc, offset, blob = {}, 0, b""
    for name, code, shape, payload in entries:
        doc[name] = {"dtype": code, "shape": shape,
                     "data_offsets": [offset, offset + len(payload)]}
        offset += len(payload)
        blob += payload
    if metadata is not None:
        doc = {"__metadata__": metadata, **doc}
    if order:
        doc = {k: doc[k] for k in order}
    text = json.dumps(doc).encode() + b" " * pad
    return struct.pack("<Q", len(text)) + text + (blob if data is None else data)


BAD = {
    "hole": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
              "b": {"dtype": "U8", "shape": [2], "data_offsets": [3, 5]}}, 5, "hole"),
    "overlap": ({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [2, 4]}}, 4, "overlapping"),
    "size": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, "4 bytes"),
    "dtype": ({"a": {"dtype": "F12", "shape": [1], "data_offsets": [0, 1]}}, 1, "dtype"),
    "range": ({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}}, 4, "data region"),
    "trailing": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, 5,
                 "data region"),
    "offsets": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [2, 0]}}, 2, "offsets"),
    "shape": ({"a": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 0]}}, 0, "shape"),
    "metadata": ({"__metadata__": {"a": 1}}, 0, "__metadata__"),
    "entry": ({"a": [1, 2]}, 0, "not an object"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_headers_are_refused_in_one_line(tmp_path, case):
    doc, data_len, message = BAD[case]
    text = json.dumps(doc).encode()
    path = tmp_path / f"{case}.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * data_len)
    with pytest.raises(CheckpointError, match=message) as info:
        read_file(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


@pytest.mark.parametrize("head", [b"", b"\x05\0\0\0\0\0\0\0{}", b"\x02\0\0\0\0\0\0\0[]",
                                  b"\x10\0\0\0\0\0\0\0{\"a\":1,\"a\":2}  ",
                                  b"\x02\0\0\0\0\0\0\0\xff\xfe", b"\xff" * 8 + b"{}",
                                  b"\x0b\0\0\0\0\0\0\0{\"a\":NaN}"])
def test_malformed_headers_are_refused(tmp_path, head):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(head)
    with pytest.raises(CheckpointError, match="bad.safetensors: not a valid safetensors"):
        read_file(path)


def test_empty_file_with_no_tensors_is_valid(tmp_path):
    path = tmp_path / "e.safetensors"
    path.write_bytes(handmade([]))
    assert file_state(read_file(path)) == {}


def test_parse_header_alone_allows_a_header_without_data():
    head = handmade([("a", "F32", [2], b"\0" * 8)], data=b"")
    header = parse_header(head)
    assert header.data_size == 8 and header.tensors["a"].shape == (2,)
