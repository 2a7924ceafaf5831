"""The safetensors file format, read and written without torch.

A file is an 8-byte little-endian length N, N bytes of JSON header, then the data region.
The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
(offsets into the data region) and may hold "__metadata__", a map of strings to strings.

Reading validates the header strictly (what the safetensors library refuses is refused
here too: offsets out of range, holes or overlaps in the data region, unknown dtypes, sizes
that are not prod(shape) * itemsize) and memory-maps the data, so tensors are hashed and
compared straight from the page cache. Writing either reproduces a file from its original
header (byte-identical round trips) or produces the canonical layout the safetensors
library writes itself.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrl.errors import CheckpointError, CorruptObjectError

MAX_HEADER = 100_000_000  # the safetensors library's own limit
ALIGN = 8  # the library pads the header with spaces to a multiple of 8 bytes

# safetensors dtype code -> (dtype name as manifests spell it, item size). Listed in the
# library's Dtype order, which decides its canonical tensor order (biggest type first).
DTYPES: dict[str, tuple[str, int]] = {
    "BOOL": ("bool", 1), "U8": ("uint8", 1), "I8": ("int8", 1),
    "F8_E5M2": ("float8_e5m2", 1), "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", 1), "F8_E5M2FNUZ": ("float8_e5m2fnuz", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1), "I16": ("int16", 2), "U16": ("uint16", 2),
    "F16": ("float16", 2), "BF16": ("bfloat16", 2), "I32": ("int32", 4), "U32": ("uint32", 4),
    "F32": ("float32", 4), "C64": ("complex64", 8), "F64": ("float64", 8), "I64": ("int64", 8),
    "U64": ("uint64", 8),
}
CODES = {name: code for code, (name, _) in DTYPES.items()}
_RANK = {code: i for i, code in enumerate(DTYPES)}
# numpy type strings of arrays a checkpoint may hold -> safetensors code
_NUMPY_CODES = {"|b1": "BOOL", "|u1": "U8", "|i1": "I8", "<i2": "I16", "<u2": "U16",
                "<f2": "F16", "<i4": "I32", "<u4": "U32", "<f4": "F32", "<c8": "C64",
                "<f8": "F64", "<i8": "I64", "<u8": "U64"}


class RawTensor:
    """A dense tensor as raw little-endian bytes: what vrl stores, without torch.

    `dtype` is the manifest's dtype name ("float32", "bfloat16", ... or "numpy:<f4");
    `data` is a byte view (usually of a memory-mapped file). Identity matters: two names
    holding the same RawTensor object are tied (one storage), as with torch tensors.
    """

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype: str, shape: tuple[int, ...], data: Any) -> None:
        view = memoryview(data)
        self.data = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        size = _itemsize(dtype)
        if size is not None and self.data.nbytes != math.prod(self.shape) * size:
            raise CheckpointError(f"{self.data.nbytes} bytes cannot hold a {dtype} tensor of "
                                  f"shape {list(self.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def __repr__(self) -> str:
        return f"RawTensor({self.dtype}, {list(self.shape)})"


def _itemsize(dtype: str) -> int | None:
    """Bytes per element of a manifest dtype name, where this module knows it."""
    if dtype.startswith("numpy:"):
        code = _NUMPY_CODES.get(dtype[6:])
        return DTYPES[code][1] if code else None
    code = CODES.get(dtype)
    return DTYPES[code][1] if code else None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    code: str  # safetensors dtype code, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # offsets into the data region
    end: int

    @property
    def dtype(self) -> str:
        return DTYPES[self.code][0]


@dataclass(frozen=True)
class Header:
    """A parsed, validated safetensors header."""

    size: int  # 8 + N: where the data region starts
    tensors: dict[str, TensorInfo]  # in header (JSON) order
    metadata: dict[str, str] | None
    data_size: int

    def by_offset(self) -> list[TensorInfo]:
        """Tensors in the order their bytes lie in the data region."""
        return sorted(self.tensors.values(), key=lambda t: (t.begin, t.end))


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_header(head: bytes | memoryview, file_size: int | None = None) -> Header:
    """Validate the first bytes of a file (at least 8 + N of them); raise ValueError.

    With `file_size` the data region must end exactly at the end of the file; without, the
    region is as long as the tensors say (used for a stored header alone).
    """
    head = memoryview(head)
    if len(head) < 8:
        raise ValueError("shorter than the 8-byte header length")
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER:
        raise ValueError(f"header length {n} is over the {MAX_HEADER}-byte limit")
    if 8 + n > (len(head) if file_size is None else file_size) or len(head) < 8 + n:
        raise ValueError(f"header length {n} runs past the end of the file")
    try:
        text = bytes(head[8:8 + n]).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("header is not UTF-8") from None
    if not text.startswith("{"):
        raise ValueError("header is not a JSON object")
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constants)
    except ValueError as exc:
        raise ValueError(f"header is not valid JSON ({exc})") from None
    metadata = raw.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(v, str) for v in metadata.values())):
        raise ValueError("__metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, info in raw.items():
        if not isinstance(info, dict):
            raise ValueError(f"tensor {name!r}: not an object")
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if code not in DTYPES:
            raise ValueError(f"tensor {name!r}: unsupported dtype {code!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ValueError(f"tensor {name!r}: shape {shape!r} is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                _is_int(o) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"tensor {name!r}: bad data_offsets {offsets!r}")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPES[code][1]:
            raise ValueError(f"tensor {name!r}: {offsets[1] - offsets[0]} bytes of data for "
                             f"shape {shape} of {code}")
        tensors[name] = TensorInfo(name, code, tuple(shape), offsets[0], offsets[1])
    position = 0
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != position:  # the library refuses these too
            what = "a hole before" if t.begin > position else "overlapping data in"
            raise ValueError(f"{what} tensor {t.name!r} (offset {t.begin}, expected "
                             f"{position}); tensors must cover the data region back to back")
        position = t.end
    if file_size is not None and position != file_size - 8 - n:
        raise ValueError(f"data region is {file_size - 8 - n} bytes but the tensors take "
                         f"{position} (truncated, or trailing bytes)")
    return Header(8 + n, tensors, metadata, position)


@dataclass
class SafetensorsFile:
    """A safetensors file opened for reading: its verbatim header and memory-mapped data."""

    path: Path
    header_bytes: memoryview  # the first 8 + N bytes, exactly as in the file
    header: Header
    tensors: dict[str, RawTensor]  # in header order


def read_file(path: str | Path) -> SafetensorsFile:
    """Open and validate a safetensors file; a bad file is one CheckpointError line."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise ValueError("shorter than the 8-byte header length")
            # copy-on-write: tensors handed to torch may be written in place, never the file
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except ValueError as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file: {exc}") from exc
    view = memoryview(mapped)
    try:
        header = parse_header(view, size)
    except ValueError as exc:
        raise CheckpointError(f"{path}: not a valid safetensors file: {exc}") from exc
    base = header.size
    tensors = {name: RawTensor(t.dtype, t.shape, view[base + t.begin:base + t.end])
               for name, t in header.tensors.items()}
    return SafetensorsFile(path, view[:base], header, tensors)


# ------------------------------------------------------------------------------ writing


def header_bytes(entries: Iterable[tuple[str, str, tuple[int, ...], int]],
                 metadata: Mapping[str, str] | None = None) -> tuple[bytes, list[str]]:
    """The canonical header for (name, code, shape, nbytes) entries, and the names in data
    order: the layout the safetensors library writes (biggest dtype first, then by name;
    compact JSON; padded with spaces to 8 bytes), metadata keys sorted so the same snapshot
    always gives the same bytes."""
    ordered = sorted(entries, key=lambda e: (-_RANK[e[1]], e[0]))
    doc: dict[str, Any] = {}
    if metadata:
        doc["__metadata__"] = dict(sorted(metadata.items()))
    offset = 0
    for name, code, shape, nbytes in ordered:
        doc[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset,
                                                                           offset + nbytes]}
        offset += nbytes
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % ALIGN)
    return len(text).to_bytes(8, "little") + text, [e[0] for e in ordered]


def code_of(dtype: str) -> str:
    """The safetensors dtype code of a manifest dtype name."""
    code = _NUMPY_CODES.get(dtype[6:]) if dtype.startswith("numpy:") else CODES.get(dtype)
    if code is None:
        raise CheckpointError(f"dtype {dtype} cannot be written to a safetensors file; "
                              "export to .pt instead")
    return code


class FileSlice:
    """`nbytes` bytes of an open file from `offset` (a tensor in a store object), written
    into another file by the kernel (copy_file_range), not through Python's memory.
    Whoever takes it closes it."""

    __slots__ = ("fd", "offset", "nbytes")

    def __init__(self, fd: int, offset: int, nbytes: int) -> None:
        self.fd, self.offset, self.nbytes = fd, offset, nbytes

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def copy_to(self, out: int) -> None:
        """Append the bytes to `out` at its file position."""
        offset, left = self.offset, self.nbytes
        while left:
            try:
                n = _copy_file_range(self.fd, out, left, offset)
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                n = _pread_write(self.fd, out, left, offset)
            if n == 0:  # the object file shrank after its header was checked
                raise CorruptObjectError(f"a stored tensor ended {left} bytes early (its "
                                         "object file was cut short); run `vrl fsck`")
            offset += n
            left -= n


def _pread_write(src: int, out: int, count: int, offset: int) -> int:
    return os.write(out, os.pread(src, min(count, 1 << 24), offset))


_copy_file_range = getattr(os, "copy_file_range", _pread_write)  # Linux only
# refused for some pairs of files (across filesystems before Linux 5.3, some network and
# FUSE filesystems): those bytes go through memory instead
_UNSUPPORTED = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP}


def size_of(chunk: bytes | memoryview | FileSlice) -> int:
    return chunk.nbytes if isinstance(chunk, FileSlice) else memoryview(chunk).nbytes


def write_stream(path: Path, head: bytes | memoryview,
                 chunks: Iterable[bytes | memoryview | FileSlice], size: int | None = None
                 ) -> None:
    """Write a header and then each tensor's bytes (in data order) to `path`.

    Given the file's `size`, its space is reserved first: a full disk fails before anything
    is written, and ext4 does not then start writing the whole file back to disk inside
    the rename over an older one (auto_da_alloc), a good part of a checkout's time.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0),
                 0o666)
    try:
        if size and hasattr(os, "posix_fallocate"):  # not on macOS
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:  # a full disk; not filesystems that cannot reserve
                if exc.errno not in _UNSUPPORTED:
                    raise
        _write_all(fd, head)
        for chunk in chunks:
            if isinstance(chunk, FileSlice):
                try:
                    chunk.copy_to(fd)
                finally:
                    chunk.close()
            else:
                _write_all(fd, chunk)
        if size and os.lseek(fd, 0, os.SEEK_CUR) != size:
            raise ValueError(f"wrote {os.lseek(fd, 0, os.SEEK_CUR)} of {size} bytes")
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def reproduce(head: bytes | memoryview,
              data_of: Callable[[str], memoryview | bytes | FileSlice]
              ) -> tuple[Header, Iterable[memoryview | bytes | FileSlice]]:
    """Check a stored header and list the bytes that follow it, tensor by tensor."""
    header = parse_header(head)
    if header.size != len(memoryview(head)):
        raise ValueError("stored header has trailing bytes")

    def chunks() -> Iterable[memoryview | bytes | FileSlice]:
        for t in header.by_offset():
            data = data_of(t.name)
            if size_of(data) != t.end - t.begin:
                if isinstance(data, FileSlice):
                    data.close()
                raise ValueError(f"tensor {t.name!r} has {size_of(data)} bytes, "
                                 f"the header says {t.end - t.begin}")
            yield data

    return header, chunks()


# ------------------------------------------------------------------------------ numpy views


def as_numpy(value: RawTensor) -> Any:
    """An ndarray viewing a raw tensor whose dtype numpy has (numpy arrays in a checkpoint)."""
    import numpy as np

    if value.dtype.startswith("numpy:"):
        dtype = np.dtype(value.dtype[6:])
    elif value.dtype in _NUMPY_OF:
        dtype = np.dtype(_NUMPY_OF[value.dtype])
    else:
        raise TypeError(f"numpy has no {value.dtype} arrays")
    return np.frombuffer(value.data, dtype=dtype).reshape(value.shape)


_NUMPY_OF = {"bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2", "uint16": "<u2",
             "float16": "<f2", "int32": "<i4", "uint32": "<u4", "float32": "<f4",
             "complex64": "<c8", "float64": "<f8", "int64": "<i8", "uint64": "<u8",
             "complex128": "<c16"}
