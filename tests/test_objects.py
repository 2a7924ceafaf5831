"""Object encoding: headers, canonical bytes and ids are pinned (bytes are identity)."""

import json

import blake3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vrl.errors import CorruptObjectError
from vrl.objects import (
    HEADER_SIZE,
    Commit,
    Manifest,
    TensorEntry,
    canonical_json,
    hash_object,
    header,
    parse_header,
)

PAYLOAD = bytes(range(16))
TENSOR_ID = "0cf5c119ced892a8595d18cf00f75162d2bfe3447c5a723a897e3dca31f03ecf"
MANIFEST_ID = "2f1901ba397c602e1f9ef1634632eb50435e19db51acd16370521af97e95692b"
COMMIT_ID = "60b930bbd3a14c877b94d7edd25f5cb0ac0eb07b5b4f03db5e872210b7056706"


def golden_manifest() -> Manifest:
    return Manifest({"w": TensorEntry(TENSOR_ID, "float32", (2, 2), 16)},
                    {"$d": [["w", {"$t": "w"}]]})


def golden_commit() -> Commit:
    return Commit(manifest=MANIFEST_ID, parents=(), message="first", author="A <a@b>",
                  time="2026-01-01T00:00:00.000000Z", hparams={"lr": 0.001},
                  metrics={"return": 1.5}, step=3)


def test_header_is_64_bytes_and_parses_back():
    h = header("tensor", 123)
    assert len(h) == HEADER_SIZE
    assert h.startswith(b"vrl1 tensor 123 ") and h.endswith(b"\n")
    assert parse_header(h) == ("tensor", 123)


def test_bad_header_is_reported_as_corruption():
    with pytest.raises(CorruptObjectError):
        parse_header(b"not an object at all")


def test_golden_tensor_id_is_blake3_of_header_and_payload():
    assert hash_object("tensor", PAYLOAD) == TENSOR_ID
    assert blake3.blake3(header("tensor", 16) + PAYLOAD).hexdigest() == TENSOR_ID
    assert hash_object("tensor", b"") == \
        "6c4f5087d5316283772321f41b5da0969909ef0d87a9c07e6d228a4e9ccf1c40"


def test_kind_is_part_of_the_id():
    assert hash_object("manifest", PAYLOAD) != hash_object("tensor", PAYLOAD)


def test_golden_manifest_bytes_and_id():
    m = golden_manifest()
    assert m.to_bytes() == (
        b'{"format":1,"tensors":{"w":{"dtype":"float32","id":"' + TENSOR_ID.encode()
        + b'","nbytes":16,"shape":[2,2]}},"tree":{"$d":[["w",{"$t":"w"}]]}}')
    assert hash_object("manifest", m.to_bytes()) == MANIFEST_ID
    assert Manifest.from_bytes(m.to_bytes()) == m


def test_golden_commit_id_and_round_trip():
    c = golden_commit()
    assert hash_object("commit", c.to_bytes()) == COMMIT_ID
    assert Commit.from_bytes(c.to_bytes()) == c


def test_canonical_json_is_order_independent_and_compact():
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == canonical_json({"a": [1.5, "é"], "b": 1})
    assert canonical_json({"b": 1, "a": 2}) == b'{"a":2,"b":1}'


def test_non_finite_metrics_are_stored_as_strings():
    c = Commit(MANIFEST_ID, (), "m", "a", "t", metrics={"loss": float("nan"),
                                                       "r": float("inf")})
    back = Commit.from_bytes(c.to_bytes())
    assert back.metrics == {"loss": "nan", "r": "inf"}


def test_garbage_commit_is_reported_as_corruption():
    with pytest.raises(CorruptObjectError):
        Commit.from_bytes(b"{not json")
    with pytest.raises(CorruptObjectError):
        Commit.from_bytes(b'{"format":1}')


def _depth_reference(value, stop):
    """Nesting depth by plain recursion (the definition json_depth computes faster)."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        return 0
    if stop < 1:
        return 1
    return 1 + max((_depth_reference(v, stop - 1) for v in value), default=0)


_json = st.recursive(st.none() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=4) |
                     st.tuples(inner, inner) |
                     st.dictionaries(st.text(max_size=2), inner, max_size=4),
                     max_leaves=40)


@given(_json, st.integers(min_value=0, max_value=8))
def test_json_depth_is_the_nesting_depth(value, stop):
    from vrl.objects import json_depth

    assert json_depth(value, stop) == _depth_reference(value, stop)


def _manifest_reference(manifest: Manifest) -> bytes:
    """A manifest's bytes by the definition (the generic canonical encoder); to_bytes
    writes the common case directly and must give exactly these."""
    data = {"format": 1, "tensors": {k: v.to_json() for k, v in manifest.tensors.items()},
            "tree": manifest.tree}
    if manifest.layout is not None:
        data["layout"] = manifest.layout.to_json()
    return canonical_json(data)


_names = st.text(st.characters(codec="utf-8"), max_size=6)
_entries = st.builds(
    TensorEntry, st.just(TENSOR_ID), st.sampled_from(["float32", "bfloat16", "numpy:<f4"]),
    st.lists(st.integers(0, 1 << 40), max_size=3).map(tuple), st.integers(0, 1 << 40),
    st.none() | _names)


_trees = st.recursive(st.none() | st.booleans() | st.integers() |
                      st.floats(allow_nan=False, allow_infinity=False) | _names,
                      lambda inner: st.lists(inner, max_size=4) |
                      st.dictionaries(_names, inner, max_size=3), max_leaves=20)


@given(st.dictionaries(_names, _entries, max_size=6), _trees, st.booleans())
def test_manifest_bytes_are_the_canonical_json_of_its_fields(tensors, tree, with_layout):
    from vrl.objects import FileLayout

    layout = FileLayout("safetensors", TensorEntry(TENSOR_ID, "uint8", (16,), 16)) \
        if with_layout else None
    manifest = Manifest(tensors, tree, layout)
    assert manifest.to_bytes() == _manifest_reference(manifest)


def test_manifest_fields_of_unusual_types_are_encoded_as_json_would():
    # (a bool is an int to Python but not to JSON: the direct writer must not be used)
    odd = Manifest({"w": TensorEntry(TENSOR_ID, "float32", (True, 2), 8)}, [])
    assert odd.to_bytes() == _manifest_reference(odd)
    assert b'"shape":[true,2]' in odd.to_bytes()


def _clean_reference(value):
    """What commit metadata becomes (the definition `_clean` implements faster)."""
    import math

    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean_reference(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_reference(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    if hasattr(value, "item"):
        return _clean_reference(value.item())
    return str(value)


_metadata = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner) |
    st.dictionaries(st.text(max_size=2) | st.integers() | st.booleans() | st.none(), inner,
                    max_size=4),
    max_leaves=30)


@given(_metadata)
def test_commit_metadata_is_cleaned_as_defined(value):
    import enum

    import numpy as np

    class Level(enum.IntEnum):
        HIGH = 2

    value = {"v": value, "odd": [np.float32(1.5), np.float64("nan"), np.int64(3), Level.HIGH,
                                 {Level.HIGH: 1}, b"x"]}
    commit = Commit(MANIFEST_ID, (), "m", "a", "t", metrics=value)
    assert commit.to_bytes() == canonical_json({
        "format": 1, "manifest": MANIFEST_ID, "parents": [], "message": "m", "author": "a",
        "time": "t", "hparams": {}, "metrics": _clean_reference(value), "env": {},
        "step": None, "stats": {}, "meta": {}})


@given(st.one_of(st.text(alphabet="0123456789abcdefABCDEFg \n-é", min_size=62, max_size=66),
                 st.text(max_size=70), st.binary(max_size=64), st.none(), st.integers()))
def test_an_object_id_is_what_the_id_pattern_matches(text):
    """is_object_id without the regex engine: exactly the texts `[0-9a-f]{64}` matches."""
    import re

    from vrl.objects import is_object_id

    want = isinstance(text, str) and re.fullmatch(r"[0-9a-f]{64}", text) is not None
    assert is_object_id(text) is want
    assert is_object_id("0123456789abcdef" * 4)


@given(st.sampled_from(["tensor", "manifest", "commit"]), st.integers(0, 10**30))
def test_a_header_is_its_text_padded_to_64_bytes(kind, size):
    text = f"vrl1 {kind} {size}".encode()
    assert header(kind, size) == text + b" " * (HEADER_SIZE - 1 - len(text)) + b"\n"


@pytest.mark.parametrize("depth,siblings", [(100, 0), (101, 0), (99, 200), (101, 200)])
def test_a_stored_object_nesting_past_the_limit_is_refused_however_many_brackets(
        depth, siblings):
    """Reading a commit refuses one whose metadata nests deeper than MAX_DEPTH (100 levels
    with the commit itself), whether or not its brackets are few enough to skip the walk."""
    payload = golden_commit().to_bytes()
    nested = b"[" * (depth - 2) + b"]" * (depth - 2)  # (the commit and meta: two levels)
    flat = b",".join([b"[]"] * siblings)
    payload = payload.replace(b'"meta":{}', b'"meta":{"a":' + nested + b',"b":[' + flat + b"]}")
    if depth > 100:
        with pytest.raises(CorruptObjectError, match="nests deeper than 100 levels"):
            Commit.from_bytes(payload)
    else:
        meta = Commit.from_bytes(payload).meta
        assert meta["a"] == json.loads(nested) and len(meta["b"]) == siblings
