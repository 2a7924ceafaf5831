"""Object kinds, ids and canonical bytes.

Every object is stored as a 64-byte header followed by its payload; the id is the blake3
hash of exactly those bytes, so the header binds the kind (a manifest can never collide
with a tensor holding the same bytes). The fixed header size keeps tensor payloads
64-byte aligned inside the file, so they can be memory-mapped as any dtype.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, NewType

import blake3

from vrl.errors import CorruptObjectError, MetadataError

ObjectId = NewType("ObjectId", str)

KINDS = ("tensor", "manifest", "commit")
HEADER_SIZE = 64
ID_HEX_LEN = 64
FORMAT = 1
# Metadata (commit fields, manifest trees) nests at most this deep: deeper JSON would hit
# Python's recursion limit in the parser or in the code that walks it.
MAX_DEPTH = 100
MAX_TREE_DEPTH = 3 * MAX_DEPTH  # a manifest's tree spends about 3 JSON levels per level
_HEADER_PREFIX = {kind: f"vrl{FORMAT} {kind} ".encode() for kind in KINDS}


def header(kind: str, size: int) -> bytes:
    """The canonical 64-byte header of an object of `kind` with a payload of `size` bytes."""
    prefix = _HEADER_PREFIX.get(kind)
    if prefix is None:
        raise ValueError(f"unknown object kind {kind!r}")
    return (prefix + b"%d" % size).ljust(HEADER_SIZE - 1) + b"\n"


@functools.lru_cache(maxsize=1024)
def tensor_header(nbytes: int) -> bytes:
    """`header("tensor", nbytes)`, cached: restores compare it with each object's."""
    return header("tensor", nbytes)


def parse_header(raw: bytes, oid: str = "") -> tuple[str, int]:
    """Return (kind, payload size) from the first 64 bytes of an object file (of object
    `oid`, which the error then names)."""
    try:
        magic, kind, size = raw[:HEADER_SIZE].decode("ascii").split()
        if magic != f"vrl{FORMAT}" or kind not in KINDS or len(raw) < HEADER_SIZE:
            raise ValueError
        return kind, int(size)
    except (ValueError, UnicodeDecodeError) as exc:
        if oid:
            raise CorruptObjectError(damaged(oid, "its header is not a vrl object header")) \
                from exc
        raise CorruptObjectError("object header is not a vrl object header") from exc


def hash_object(kind: str, payload: bytes | memoryview, threads: bool = False) -> ObjectId:
    """The id an object with this kind and payload has.

    `threads` hashes very large payloads on several cores (single-threaded blake3 already
    runs at several GB/s, so it only pays off above ~64 MB).
    """
    if type(payload) is bytes and len(payload) < 1 << 14:  # (a manifest, a commit: one call)
        return ObjectId(blake3.blake3(header(kind, len(payload)) + payload).hexdigest())
    view = memoryview(payload).cast("B")
    threads = threads and view.nbytes > (1 << 26)
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if threads else 1)
    hasher.update(header(kind, view.nbytes))
    hasher.update(view)
    return ObjectId(hasher.hexdigest())


def damaged(oid: str, what: str = "its bytes do not match its id") -> str:
    """What to tell a person about a damaged object."""
    return (f"object {oid[:12]} is corrupted: {what}; run `vrl fsck`, and take the snapshot "
            "from a remote or backup that holds it intact")


_HEX = "0123456789abcdef"


def is_object_id(text: str) -> bool:
    """64 lowercase hex digits (what `[0-9a-f]{64}` matches, without the regex engine: a
    commit checks several ids)."""
    return isinstance(text, str) and len(text) == ID_HEX_LEN and not text.strip(_HEX)


# ---------------------------------------------------------------------------- canonical JSON


def json_depth(value: Any, stop: int = MAX_TREE_DEPTH) -> int:
    """How deeply lists and dicts nest in `value` (0 for a scalar), without recursion;
    counting stops a level past `stop`. Level by level, scalars filtered in C: a trainer's
    checkpoint skeleton holds thousands of them, and every commit measures it."""
    depth = 0
    level = [value]
    while True:
        containers = [item for item in level if isinstance(item, (dict, list, tuple))]
        if not containers or depth > stop:
            return depth
        depth += 1
        level = []
        for item in containers:
            level.extend(item.values() if isinstance(item, dict) else item)


def check_depth(value: Any, what: str, limit: int = MAX_DEPTH) -> None:
    if json_depth(value) > limit:
        raise MetadataError(f"{what} nests deeper than {limit} levels; flatten it "
                            "(e.g. dotted keys)")


def _clean(value: Any, left: int = -1, what: str = "") -> Any:
    """Make metadata JSON-safe and deterministic: non-finite floats become strings.

    With `left` >= 0, nesting deeper than `left` containers raises MetadataError (as
    `check_depth(value, what, left)` would), checked in the same pass."""
    # the exact JSON types first, by type (a commit cleans its statistics every time)
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        if value - value == 0.0:  # finite (inf - inf and nan - nan are nan)
            return value
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if kind is dict or kind is list or isinstance(value, (dict, list, tuple)):
        if left == 0:
            raise MetadataError(f"{what} nests deeper than {MAX_DEPTH} levels; flatten it "
                                "(e.g. dotted keys)")
        left -= 1
        # (values of the exact JSON types are kept without a call: a commit's statistics
        # are mostly numbers and strings)
        if kind is dict:
            out = {}
            for k, v in value.items():
                kind = type(v)
                out[k if type(k) is str else str(k)] = v if (
                    kind is str or kind is int or kind is bool or v is None or
                    kind is float and v - v == 0.0) else _clean(v, left, what)
            return out
        if kind is list:
            return [v if (type(v) is int or type(v) is str) else _clean(v, left, what)
                    for v in value]
    return _clean_other(value, left, what)


def _clean_other(value: Any, left: int, what: str) -> Any:
    """`_clean` of anything but the exact JSON types (subclasses, tuples, numpy scalars)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v, left, what) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v, left, what) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "item"):  # numpy / torch scalars in metrics
        return _clean(value.item(), left, what)
    return str(value)


_json_str = json.encoder.encode_basestring  # a str as JSON, as canonical_json writes it
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)  # made once (json.dumps makes one per call)


def canonical_json(value: Any) -> bytes:
    """Byte-stable JSON: sorted keys, no whitespace, UTF-8, finite numbers only."""
    return _CANONICAL.encode(value).encode("utf-8")


def load_json(payload: bytes | str, what: str, limit: int = MAX_DEPTH) -> Any:
    try:
        data = json.loads(payload)
    except RecursionError:
        raise CorruptObjectError(f"{what} nests deeper than {limit} levels") from None
    except ValueError as exc:
        raise CorruptObjectError(f"{what} is not valid JSON") from exc
    # (no walk where the text has too few brackets to nest deeper than `limit`: every
    # level opens one, so their count bounds the depth; most commits hold a few dozen)
    if isinstance(payload, str):  # (decoded by a caller that spares a copy of the bytes)
        brackets = payload.count("[") + payload.count("{")
    else:
        brackets = payload.count(b"[") + payload.count(b"{") if isinstance(payload, bytes) \
            else limit + 1
    if brackets > limit and json_depth(data) > limit:
        raise CorruptObjectError(f"{what} nests deeper than {limit} levels")
    return data


# ---------------------------------------------------------------------------- manifest


# Bytes per element of every torch dtype name a manifest may hold (no torch import here:
# metadata commands and fetch validate manifests without it). The packed sub-byte types
# count their packed element (e.g. float4_e2m1fn_x2 holds two values per byte).
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "complex128": 16, "complex64": 8, "complex32": 4,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint64": 8, "uint32": 4, "uint16": 2, "uint8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
}
MAX_NDIM = 64


def itemsize(dtype: str) -> int:
    """Bytes per element of a manifest dtype name; CorruptObjectError if unknown."""
    if not isinstance(dtype, str):
        raise CorruptObjectError(f"manifest dtype {dtype!r} is not a string")
    if dtype.startswith("numpy:"):
        import numpy as np  # numpy only: no torch, and np.dtype of a string runs no code

        try:
            np_dtype = np.dtype(dtype[6:])
        except (TypeError, ValueError):
            raise CorruptObjectError(f"unknown array dtype {dtype[:40]!r} in manifest") from None
        if np_dtype.hasobject:
            raise CorruptObjectError(f"array dtype {dtype[:40]!r} holds Python objects")
        return np_dtype.itemsize
    try:
        return ITEMSIZE[dtype]
    except KeyError:
        raise CorruptObjectError(f"unknown tensor dtype {dtype[:40]!r} in manifest") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes live and how to read them back."""

    id: ObjectId
    dtype: str  # torch dtype name ("float32", "bfloat16", ...) or "numpy:<f8" for arrays
    shape: tuple[int, ...]
    nbytes: int
    tie: str | None = None  # name of the tensor this one shares storage with

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id, "dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes
        }
        if self.tie is not None:
            out["tie"] = self.tie
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TensorEntry:
        entry = cls(ObjectId(data["id"]), data["dtype"], tuple(data["shape"]), data["nbytes"],
                    data.get("tie"))
        entry.check()
        return entry

    def check(self) -> None:
        """`prod(shape) * itemsize == nbytes`, so no reader trusts a size it cannot back
        (a hostile `shape: [2**28]` on an empty tensor would allocate 1 GiB)."""
        if not is_object_id(self.id):
            raise CorruptObjectError("manifest names a tensor whose id is not an object id")
        if len(self.shape) > MAX_NDIM or not all(_is_int(d) for d in self.shape) or \
                not _is_int(self.nbytes):
            raise CorruptObjectError(f"tensor {self.id[:12]} has an invalid shape or size in "
                                     "its manifest")
        if math.prod(self.shape) * itemsize(self.dtype) != self.nbytes:
            raise CorruptObjectError(
                f"tensor {self.id[:12]} claims shape {list(self.shape)[:8]} of {self.dtype} "
                f"but {self.nbytes} bytes: the manifest is inconsistent")
        if self.tie is not None and not isinstance(self.tie, str):
            raise CorruptObjectError(f"tensor {self.id[:12]} has an invalid tie")


# The JSON text of a manifest entry, by the entry object: a commit reuses the entry objects
# of the tensors that did not change (vrl.repo), so their text is not written again. By
# identity, not equality (1 == 1.0 == True would hand out another value's text); each value
# keeps its entry alive, so an id cannot be reused while it is here.
_ENTRY_TEXT: dict[int, tuple[TensorEntry, str, str]] = {}
_ENTRY_TEXT_MAX = 1 << 14


def _tensors_json(tensors: dict[str, TensorEntry]) -> str | None:
    """canonical_json of a manifest's {name: entry.to_json()}, as text, written directly
    (every commit encodes its manifest; this is several times faster); None where a
    field is not of the type it should be (then only the generic encoder is exact)."""
    parts = []
    cache = _ENTRY_TEXT
    for name in sorted(tensors):
        e = tensors[name]
        hit = cache.get(id(e))
        if hit is not None and hit[0] is e and (hit[1] is name or
                                                (type(name) is str and hit[1] == name)):
            parts.append(hit[2])
            continue
        oid, dtype, shape, nbytes, tie = e.id, e.dtype, e.shape, e.nbytes, e.tie
        if type(name) is not str or type(oid) is not str or type(dtype) is not str or \
                type(nbytes) is not int or (tie is not None and type(tie) is not str) or \
                type(shape) is not tuple:
            return None
        for dim in shape:
            if type(dim) is not int:
                return None
        dims = ",".join([str(dim) for dim in shape])
        tied = "" if tie is None else f',"tie":{_json_str(tie)}'
        text = (f'{_json_str(name)}:{{"dtype":{_json_str(dtype)},"id":{_json_str(oid)},'
                f'"nbytes":{nbytes},"shape":[{dims}]{tied}}}')
        if len(cache) >= _ENTRY_TEXT_MAX:
            cache.clear()  # (all at once: no iteration another thread could disturb)
        cache[id(e)] = (e, name, text)
        parts.append(text)
    return "{" + ",".join(parts) + "}"


@dataclass(frozen=True)
class FileLayout:
    """The file a snapshot was committed from, so that checkout and export give back the
    same bytes: its format and its verbatim header, stored as a uint8 tensor object (one
    small object, shared by every commit of a file with the same header)."""

    format: str  # "safetensors"
    header: TensorEntry

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "header": self.header.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileLayout:
        return cls(data["format"], TensorEntry.from_json(data["header"]))


def _unordered(tree: Any) -> Any:
    """A manifest tree with every dict's items sorted: the order a file happened to
    store its keys in is no part of its content."""
    if isinstance(tree, list):
        return [_unordered(v) for v in tree]
    if isinstance(tree, dict):
        if set(tree) == {"$d"} and isinstance(tree["$d"], list):
            items = [(json.dumps(k, sort_keys=True), _unordered(v)) for k, v in tree["$d"]]
            return {"$d": sorted(items, key=lambda kv: kv[0])}
        return {k: _unordered(v) for k, v in tree.items()}
    return tree


LAYOUT_NAME = "(file header)"  # how data_entries() names the layout's header object


@dataclass(frozen=True)
class Manifest:
    """Every tensor of a snapshot by name, plus the structure (tree) around them."""

    tensors: dict[str, TensorEntry]
    tree: Any  # JSON skeleton; see vrl.tensors for the encoding
    layout: FileLayout | None = None  # absent for snapshots committed from memory

    def to_bytes(self, tree_text: str | None = None) -> bytes:
        """The canonical bytes; `tree_text`: `tree_json()` where the caller has it already
        (vrl.repo, for a skeleton vrl.tensors.ViewMemo hands out again)."""
        tree = self.tree_json() if tree_text is None else tree_text
        tensors = _tensors_json(self.tensors)
        if tensors is None:  # a field of an unusual type: the generic encoder decides
            data = {
                "format": FORMAT,
                "tensors": {k: v.to_json() for k, v in self.tensors.items()},
                "tree": self.tree,
            }
            if self.layout is not None:  # only then: older manifests keep their bytes and ids
                data["layout"] = self.layout.to_json()
            return canonical_json(data)
        # the same bytes, assembled: keys in sorted order (format, layout, tensors, tree)
        layout = "" if self.layout is None else \
            f'"layout":{_CANONICAL.encode(self.layout.to_json())},'
        return f'{{"format":{FORMAT},{layout}"tensors":{tensors},"tree":{tree}}}'.encode()

    def same_content(self, other: Manifest) -> bool:
        """Whether both hold the same tensors (by content id, dtype and shape) in the same
        structure, whatever file each came from: a `.pt` and a `.safetensors` of the same
        weights differ in their layout and in dict order, not in what they hold."""
        if len(self.tensors) != len(other.tensors):
            return False
        for name, entry in self.tensors.items():
            theirs = other.tensors.get(name)
            if theirs is None or (entry.id, entry.dtype, entry.shape) != \
                    (theirs.id, theirs.dtype, theirs.shape):
                return False
        return _unordered(self.tree) == _unordered(other.tree)

    def tree_json(self) -> str:
        """The tree's canonical JSON, once its depth is known to fit (room for
        {"tree": ...}). Each level of nesting opens a bracket, so their count bounds the
        depth: one scan of the text in C, the walk of the tree only where that is not
        enough (a deep tree is refused before any error of its encoding is reported)."""
        limit = MAX_TREE_DEPTH - 2
        try:
            text = _CANONICAL.encode(self.tree)
        except Exception:
            text = None
        if text is None or text.count("[") + text.count("{") > limit:
            if json_depth(self.tree) > limit:
                raise MetadataError(f"the checkpoint nests too deeply to store (about "
                                    f"{MAX_TREE_DEPTH // 3} levels of dicts and lists at "
                                    "most); flatten it")
            if text is None:
                text = _CANONICAL.encode(self.tree)  # raises its error again
        return text

    @classmethod
    def from_bytes(cls, payload: bytes | str) -> Manifest:
        data = load_json(payload, "manifest", MAX_TREE_DEPTH)
        try:
            tensors = {k: TensorEntry.from_json(v) for k, v in data["tensors"].items()}
            layout = FileLayout.from_json(data["layout"]) if "layout" in data else None
            manifest = cls(tensors, data["tree"], layout)
        except (KeyError, TypeError, AttributeError) as exc:
            raise CorruptObjectError(f"manifest is missing field {exc}") from exc
        for name, entry in tensors.items():
            tied = tensors.get(entry.tie) if entry.tie is not None else None
            if entry.tie is not None and (tied is None or tied.tie is not None or
                                          (tied.id, tied.nbytes) != (entry.id, entry.nbytes)):
                raise CorruptObjectError(f"tensor {name[:80]!r} is tied to a tensor that "
                                         "does not match it in the manifest")
        return manifest

    def data_entries(self) -> dict[str, TensorEntry]:
        """Every data object the snapshot needs: its tensors and its file header, if any.
        What walks objects (gc, fsck, push, fetch) walks these."""
        if self.layout is None:
            return self.tensors
        return {**self.tensors, LAYOUT_NAME: self.layout.header}

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data, counting each distinct object once."""
        return sum({e.id: e.nbytes for e in self.tensors.values()}.values())


# ---------------------------------------------------------------------------- commit


@dataclass(frozen=True)
class Commit:
    """A snapshot: manifest, lineage, and everything needed to understand and resume it."""

    manifest: ObjectId
    parents: tuple[ObjectId, ...]
    message: str
    author: str
    time: str  # ISO 8601 UTC, e.g. 2026-11-29T09:00:00.000000Z
    hparams: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    step: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)  # e.g. frozen layers, pruning

    def __post_init__(self) -> None:
        problem = _commit_problem(self.__dict__, strict_ids=False)
        if problem:
            raise MetadataError(f"invalid commit: {problem}")

    def to_json(self) -> dict[str, Any]:
        # each field cleaned and its depth checked in one pass
        clean = {name: _clean(getattr(self, name), MAX_DEPTH, f"commit {name}")
                 for name in _DICT_FIELDS}
        return {
            "format": FORMAT, "manifest": self.manifest, "parents": list(self.parents),
            "message": self.message, "author": self.author, "time": self.time,
            "hparams": clean["hparams"], "metrics": clean["metrics"], "env": clean["env"],
            "step": self.step, "stats": clean["stats"], "meta": clean["meta"],
        }

    def to_bytes(self, stats_text: str | None = None) -> bytes:
        """canonical_json(self.to_json()), assembled field by field (every commit writes
        one): the empty dicts and the layer statistics without the generic walk.
        `stats_text`: `_stats_json(self.stats)` where the caller has it already (vrl.repo,
        from the layer texts compare() kept)."""
        parts = []
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            text = "{}" if type(value) is dict and not value else \
                (stats_text or _stats_json(value)) if name == "stats" else None
            if text is None:
                text = _CANONICAL.encode(_clean(value, MAX_DEPTH, f"commit {name}"))
            parts.append(text)
        hparams, metrics, env, stats, meta = parts
        step = "null" if self.step is None else int.__repr__(self.step)
        parents = ",".join([_json_str(p) for p in self.parents])
        return (f'{{"author":{_json_str(self.author)},"env":{env},"format":{FORMAT},'
                f'"hparams":{hparams},"manifest":{_json_str(self.manifest)},'
                f'"message":{_json_str(self.message)},"meta":{meta},"metrics":{metrics},'
                f'"parents":[{parents}],"stats":{stats},"step":{step},'
                f'"time":{_json_str(self.time)}}}').encode()

    @classmethod
    def from_bytes(cls, payload: bytes | str) -> Commit:
        data = load_json(payload, "commit")
        if not isinstance(data, dict):
            raise CorruptObjectError("commit is not a JSON object")
        missing = [k for k in ("manifest", "parents", "message", "author", "time")
                   if k not in data]
        if missing:
            raise CorruptObjectError(f"commit is missing field {missing[0]!r}")
        # a hand-made or remote commit may hold anything: check every field's type here,
        # so that log/show/diff can rely on them
        problem = _commit_problem(data, strict_ids=True)
        if problem:
            raise CorruptObjectError(f"commit is malformed: {problem}")
        return cls(
            manifest=ObjectId(data["manifest"]),
            parents=tuple(ObjectId(p) for p in data["parents"]),
            message=data["message"], author=data["author"], time=data["time"],
            hparams=data.get("hparams", {}), metrics=data.get("metrics", {}),
            env=data.get("env", {}), step=data.get("step"), stats=data.get("stats", {}),
            meta=data.get("meta", {}),
        )


_DICT_FIELDS = ("hparams", "metrics", "env", "stats", "meta")


def _scalar_json(value: Any) -> str | None:
    """A scalar as canonical_json writes it after `_clean` (non-finite floats as strings);
    None for anything else."""
    kind = type(value)
    if kind is str:
        return _json_str(value)
    if kind is float:
        if value - value == 0.0:
            return float.__repr__(value)
        return '"nan"' if value != value else ('"inf"' if value > 0 else '"-inf"')
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    return None


_STATS_KEYS = frozenset({"bytes_new", "bytes_total", "layers", "parent", "summary",
                         "threshold"})
_LAYER_KEYS = frozenset({"status", "shapes", "rel", "max_abs", "material", "nbytes"})
_LAYER_KEYS_KIND = _LAYER_KEYS | {"kind"}
_LAYER_KEYS_PARAMETER = _LAYER_KEYS_KIND | {"parameter"}


def _stats_json(stats: Any, layer_texts: dict[str, str] | None = None) -> str | None:
    """canonical_json(_clean(stats)) of a commit's layer statistics (vrl.diff's
    `DiffResult.to_json()` plus "parent"), as text, written directly; None where `stats`
    is not of that shape or holds a value of another type (then the generic encoder).
    `layer_texts`: {name: text} of layers whose `_layer_json` text is known already."""
    if type(stats) is not dict or stats.keys() != _STATS_KEYS:
        return None
    layers = stats["layers"]
    if type(layers) is not dict:
        return None
    head = [_scalar_json(stats["bytes_new"]), _scalar_json(stats["bytes_total"])]
    tail = [_scalar_json(stats["parent"]), _scalar_json(stats["summary"]),
            _scalar_json(stats["threshold"])]
    if None in head or None in tail:
        return None
    names = list(layers)
    for name in names:
        if type(name) is not str:
            return None
    names.sort()
    parts = []
    known = layer_texts or {}
    for name in names:
        text = known.get(name)
        if text is None:
            text = _layer_json(name, layers[name])
            if text is None:
                return None
        parts.append(text)
    return (f'{{"bytes_new":{head[0]},"bytes_total":{head[1]},"layers":{{{",".join(parts)}}},'
            f'"parent":{tail[0]},"summary":{tail[1]},"threshold":{tail[2]}}}')


def _layer_json(name: str, v: Any) -> str | None:
    """`"name":{...}` of one layer of `_stats_json` (None: not of the usual types)."""
    if type(v) is not dict:
        return None
    keys = v.keys()
    if keys == _LAYER_KEYS:
        kind = parameter = ""
    elif keys == _LAYER_KEYS_KIND:
        kind, parameter = _scalar_json(v["kind"]), ""
    elif keys == _LAYER_KEYS_PARAMETER:
        kind, parameter = _scalar_json(v["kind"]), _scalar_json(v["parameter"])
    else:
        return None
    shapes = v["shapes"]
    if type(shapes) is not list:
        return None
    dims = []
    for shape in shapes:
        if type(shape) is not list and type(shape) is not tuple:
            return None
        for dim in shape:
            if type(dim) is not int:
                return None
        dims.append(",".join(map(int.__repr__, shape)))
    # the common types inline (a call each costs more than the rest of the text)
    material, max_abs, nbytes, rel, status = \
        v["material"], v["max_abs"], v["nbytes"], v["rel"], v["status"]
    material = "true" if material is True else "false" if material is False else \
        _scalar_json(material)
    max_abs = float.__repr__(max_abs) if type(max_abs) is float and \
        max_abs - max_abs == 0.0 else _scalar_json(max_abs)
    nbytes = int.__repr__(nbytes) if type(nbytes) is int else _scalar_json(nbytes)
    rel = float.__repr__(rel) if type(rel) is float and rel - rel == 0.0 else \
        _scalar_json(rel)
    status = _json_str(status) if type(status) is str else _scalar_json(status)
    if None in (material, max_abs, nbytes, rel, status, kind, parameter):
        return None
    kind = f'"kind":{kind},' if kind else ""
    parameter = f'"parameter":{parameter},' if parameter else ""
    return (f'{_json_str(name)}:{{{kind}"material":{material},"max_abs":{max_abs},'
            f'"nbytes":{nbytes},{parameter}"rel":{rel},'
            f'"shapes":[{"[" + "],[".join(dims) + "]" if dims else ""}],'
            f'"status":{status}}}')


def _commit_problem(fields: dict[str, Any], strict_ids: bool) -> str | None:
    """What is wrong with the types of a commit's fields (None if nothing)."""
    is_id = is_object_id if strict_ids else _is_str
    get = fields.get
    if not is_id(get("manifest")):
        return f"manifest must be an object id, not {_kind(get('manifest'))}"
    parents = get("parents")
    if not isinstance(parents, (list, tuple)) or not all(map(is_id, parents)):
        return "parents must be a list of object ids"
    for name in ("message", "author", "time"):
        if not isinstance(get(name), str):
            return f"{name} must be a string, not {_kind(get(name))}"
    step = get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        return f"step must be an integer or null, not {_kind(step)}"
    for name in _DICT_FIELDS:
        value = get(name, _NO_FIELD)
        if not isinstance(value, dict):
            return f"{name} must be a mapping, not {_kind(value)}"
    return None


_NO_FIELD: dict[str, Any] = {}  # (a missing dict field is an empty one; never changed)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_str(value: Any) -> bool:
    return isinstance(value, str)
