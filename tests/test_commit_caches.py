"""The shortcuts of a commit's Python work give exactly the bytes, ids and statistics of
the plain definitions: cached manifest entry texts, reused entries, the layer plan of
compare(), the directly written statistics and commit, the cached config values."""

import configparser
import math
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vrl import Repo
from vrl.diff import DiffResult, _compare_general, compare
from vrl.objects import Commit, Manifest, TensorEntry, _clean, canonical_json, hash_object
from vrl.safetensors_file import RawTensor

MANIFEST_ID = "2f1901ba397c602e1f9ef1634632eb50435e19db51acd16370521af97e95692b"


def manifest_reference(manifest: Manifest) -> bytes:
    data = {"format": 1, "tensors": {k: v.to_json() for k, v in manifest.tensors.items()},
            "tree": manifest.tree}
    if manifest.layout is not None:
        data["layout"] = manifest.layout.to_json()
    return canonical_json(data)


def commit_reference(commit: Commit) -> bytes:
    return canonical_json(commit.to_json())


# ---------------------------------------------------------------- manifest entry texts


def test_a_cached_entry_text_is_never_handed_to_another_entry_or_name():
    oid = hash_object("tensor", b"\0" * 16)
    entry = TensorEntry(oid, "float32", (4,), 16)
    tree = {"$t": "w"}
    first = Manifest({"w": entry}, tree).to_bytes()
    assert first == manifest_reference(Manifest({"w": entry}, tree))
    # the same name with a new dtype, shape or id; the same entry under another name; an
    # entry equal in value to the cached one but of other types (2.0 == 2, True == 1)
    others = [TensorEntry(oid, "int32", (4,), 16), TensorEntry(oid, "float32", (2, 2), 16),
              TensorEntry(hash_object("tensor", b"\1" * 16), "float32", (4,), 16),
              TensorEntry(oid, "float32", (4.0,), 16), TensorEntry(oid, "float32", (True,), 4)]
    for other in others:
        manifest = Manifest({"w": other}, tree)
        assert manifest.to_bytes() == manifest_reference(manifest) != first
    renamed = Manifest({"v": entry}, {"$t": "v"})
    assert renamed.to_bytes() == manifest_reference(renamed)
    assert Manifest({"w": entry}, tree).to_bytes() == first  # and the cached text again


def test_tree_depth_is_checked_whatever_the_bracket_count():
    from vrl.errors import MetadataError

    wide = {"$d": [[f"k{i}", [[{"$t": f"k{i}"}]]] for i in range(200)]}  # many brackets
    manifest = Manifest({}, wide)
    assert manifest.to_bytes() == manifest_reference(manifest)
    deep: list = []
    for _ in range(400):
        deep = [deep]
    with pytest.raises(MetadataError, match="nests too deeply"):
        Manifest({}, deep).to_bytes()
    with pytest.raises(MetadataError, match="nests too deeply"):  # refused before its
        Manifest({}, [deep, float("nan")]).to_bytes()  # encoding error is reported
    with pytest.raises(ValueError):
        Manifest({}, [float("nan")]).to_bytes()


def test_reused_entries_follow_dtype_shape_and_bytes(repo):
    """A commit reuses the last commit's entry for an unchanged tensor: a tensor with the
    same bytes under the same name but another dtype or shape gets its own entry."""
    states = [{"w": torch.zeros(4), "b": torch.ones(2)},
              {"w": torch.zeros(2, 2), "b": torch.ones(2)},
              {"w": torch.zeros(2, 2, dtype=torch.int32), "b": torch.ones(2)},
              {"w": torch.zeros(2, 2, dtype=torch.int32), "b": torch.ones(2)},
              {"w": torch.ones(4), "b": torch.ones(2)}]
    shapes = []
    for i, state in enumerate(states):
        repo.commit(state, env=False, allow_empty=True, message=str(i))
        manifest = repo.read_manifest(repo.read_commit(repo.head()).manifest)
        assert manifest.to_bytes() == manifest_reference(manifest)
        w = manifest.tensors["w"]
        assert (w.dtype, w.shape) == (str(state["w"].dtype)[6:], tuple(state["w"].shape))
        shapes.append(w)
    assert shapes[0].id == shapes[1].id == shapes[2].id != shapes[4].id
    # read back by a fresh repository object: the stored bytes are the definition's
    fresh = Repo(repo.workdir)
    for entry in fresh.log():
        payload = fresh.objects.read(entry.commit.manifest)[1]
        assert payload == manifest_reference(Manifest.from_bytes(payload))
        raw = fresh.objects.read(entry.id)[1]
        assert raw == commit_reference(Commit.from_bytes(raw))
        assert Commit.from_bytes(raw).to_bytes() == raw


# ---------------------------------------------------------------- compare's layer plan


def _random_entry(rng, store, shape=None, dtype=None):
    dtype = dtype or rng.choice(["float32", "float64", "int64"])
    shape = shape if shape is not None else rng.choice([(), (3,), (2, 2), (4, 1)])
    t = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}[dtype]
    value = (torch.randn(shape) * 3).to(t)
    if dtype != "int64" and rng.random() < 0.1 and value.numel():
        value.view(-1)[0] = rng.choice([float("nan"), float("inf")])
    data = value.numpy().tobytes()
    oid = hash_object("tensor", data)
    store[oid] = RawTensor(dtype, shape, data)
    return TensorEntry(oid, dtype, tuple(shape), len(data))


NAMES = ["model/a.0.weight", "model/a.0.bias", "model/a.10.weight", "model/a.2.weight",
         "algo/optimizer/state/0/step", "algo/optimizer/state/0/exp_avg",
         "algo/optimizer/state/1/exp_avg", "step", "env/pos", "x"]


def _mutated(rng, old, store, allow_removal):
    new = {}
    for name, entry in old.items():
        r = rng.random()
        if allow_removal and r < 0.1:
            continue  # removed
        if r < 0.4:
            new[name] = entry  # the same entry object
        elif r < 0.5:  # an equal entry, another object
            new[name] = TensorEntry(entry.id, entry.dtype, entry.shape, entry.nbytes)
        elif r < 0.8:  # new bytes, same dtype and shape
            new[name] = _random_entry(rng, store, entry.shape, entry.dtype)
        else:  # reshaped or another dtype
            new[name] = _random_entry(rng, store)
    for name in NAMES:
        if name not in old and rng.random() < 0.2:
            new[name] = _random_entry(rng, store)
    order = list(new)
    rng.shuffle(order)
    return {name: new[name] for name in order}


def _stats_bytes(result: DiffResult) -> bytes:
    return canonical_json(_clean(result.to_json()))


@pytest.mark.parametrize("seed", range(60))
def test_compare_by_plan_is_the_general_comparison(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    store: dict = {}
    old = {name: _random_entry(rng, store) for name in rng.sample(NAMES, rng.randint(1, 8))}
    for step in range(4):
        new = _mutated(rng, old, store, allow_removal=step == 3)
        old_m, new_m = Manifest(old, None), Manifest(new, None)
        for before in (old_m, None):
            got = compare(before, new_m, lambda e: store[e.id], threshold=0.01)
            entries = before.tensors if before else {}
            reference = DiffResult(_compare_general(entries, new, lambda e: store[e.id], 0.01),
                                   got.bytes_new, got.bytes_total, 0.01)
            assert _stats_bytes(got) == _stats_bytes(reference)
            assert got.summary() == reference.summary()
            assert [lc.layer for lc in got.layers] == [lc.layer for lc in reference.layers]
            if before is not None:
                stats = got.to_json()
                assert not math.isnan(stats["bytes_total"])
        old = new


def test_compare_of_a_declared_layout_keeps_its_kinds():
    store: dict = {}
    rng = random.Random(1)
    old = {name: _random_entry(rng, store, (3,), "float32") for name in NAMES[:7]}
    new = dict(old, **{"model/a.0.weight": _random_entry(rng, store, (3,), "float32")})
    result = compare(Manifest(old, None), Manifest(new, None), lambda e: store[e.id])
    meta = {"state_layout": {"model_prefix": "model/", "optimizer_params": ["p0", "p1"]}}
    declared = result.with_layout(meta).to_json()
    assert declared["layers"]["algo/optimizer/state/1"]["parameter"] == "p1"
    assert "parameter" not in result.to_json()["layers"]["algo/optimizer/state/1"]


# ---------------------------------------------------------------- commit bytes

_odd = st.none() | st.booleans() | st.integers(-3, 3) | st.floats() | st.just(-0.0) | \
    st.text(max_size=2) | st.just((1, 2)) | st.just([True]) | st.just({1: 2})
_shape = st.lists(st.integers(0, 1 << 33), max_size=3)
_layer = st.fixed_dictionaries(
    {"status": st.sampled_from(["changed", "unchanged", "added"]),
     "shapes": st.lists(_shape, max_size=3), "rel": st.none() | st.floats(),
     "max_abs": st.floats(), "material": st.booleans(), "nbytes": st.integers(0, 1 << 40)},
    optional={"kind": st.sampled_from(["model", "optimizer", "other"]),
              "parameter": st.text(max_size=3)})
_stats = st.fixed_dictionaries(
    {"bytes_new": st.integers(0, 1 << 40), "bytes_total": st.integers(0, 1 << 40),
     "layers": st.dictionaries(st.text(max_size=4), _layer, max_size=4),
     "summary": st.text(max_size=8), "threshold": st.floats(0, 1) | st.integers(0, 2),
     "parent": st.none() | st.just(MANIFEST_ID)})


@st.composite
def _odd_stats(draw):
    """Well-formed statistics with at most one value, key or container of another kind."""
    stats = draw(_stats)
    where = draw(st.integers(0, 5))
    odd = draw(_odd)
    layers = stats["layers"]
    if where == 1:
        stats[draw(st.sampled_from(sorted(stats)))] = odd
    elif where == 2 and layers:
        layer = layers[draw(st.sampled_from(sorted(layers)))]
        layer[draw(st.sampled_from(sorted(layer) + ["extra"]))] = odd
    elif where == 3 and layers:
        layer = layers[draw(st.sampled_from(sorted(layers)))]
        if layer["shapes"]:
            shape = layer["shapes"][0]
            layer["shapes"][0] = draw(st.sampled_from([tuple(shape), [*shape, odd], odd]))
    elif where == 4:
        layers[draw(st.integers(0, 3) | st.booleans())] = draw(_layer)
    elif where == 5 and draw(st.booleans()):
        del stats["parent"]
    return stats


@given(_odd_stats(), st.none() | st.integers(0, 1 << 62),
       st.lists(st.just(MANIFEST_ID), max_size=2), st.text(max_size=5),
       st.dictionaries(st.text(max_size=2), _odd, max_size=3))
def test_commit_bytes_are_the_canonical_json_of_its_fields(stats, step, parents, message,
                                                           metrics):
    commit = Commit(MANIFEST_ID, tuple(parents), message, "A <a@b>",
                    "2026-01-01T00:00:00.000000Z", metrics=metrics, step=step, stats=stats)
    assert commit.to_bytes() == commit_reference(commit)


def _layer_stats(**changes):
    layer = {"status": "changed", "shapes": [[2, 3], [3]], "rel": 0.5, "max_abs": 1.0,
             "material": True, "nbytes": 36, "kind": "model", **changes}
    return {"bytes_new": 1, "bytes_total": 2, "summary": "s", "threshold": 0.001,
            "parent": MANIFEST_ID, "layers": {"b": dict(layer), "a.1": layer}}


@pytest.mark.parametrize("stats", [
    _layer_stats(), _layer_stats(rel=None), _layer_stats(rel=float("nan")),
    _layer_stats(max_abs=float("-inf")), _layer_stats(rel=-0.0), _layer_stats(rel=1e-300),
    _layer_stats(shapes=[(2, 3), []]), _layer_stats(shapes=[[True, 2]]),
    _layer_stats(shapes=[{1: 2}]), _layer_stats(shapes=[[2.0]]), _layer_stats(shapes=[]),
    _layer_stats(shapes=["ab"]), _layer_stats(shapes=([1],)), _layer_stats(material=1),
    _layer_stats(nbytes=True), _layer_stats(parameter="p"), _layer_stats(parameter=""),
    _layer_stats(status="\u00e9\n\""), {**_layer_stats(), "threshold": 1},
    {**_layer_stats(), "layers": {1: _layer_stats()["layers"]["b"]}},
    {**_layer_stats(), "layers": {"x": {"status": "changed"}}},
    {**_layer_stats(), "parent": None}, {**_layer_stats(), "more": 1}])
def test_odd_statistics_are_encoded_as_json_would(stats):
    commit = Commit(MANIFEST_ID, (), "m", "a", "t", stats=stats)
    assert commit.to_bytes() == commit_reference(commit)


def test_commit_statistics_written_directly_match_the_generic_encoder(repo):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters())
    for i in range(4):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        if i == 2:
            with torch.no_grad():
                model[0].bias[0] = float("nan")
        repo.commit({"model": model.state_dict(), "optimizer": opt.state_dict()},
                    env=False, metrics={"i": i, "x": float("inf")}, step=i)
        commit = repo.read_commit(repo.head())
        assert repo.objects.read(repo.head())[1] == commit_reference(commit)
        layers = commit.stats["layers"]
        assert layers and all("kind" in v for v in layers.values())


# ---------------------------------------------------------------- config


def test_threshold_follows_config_changes(repo):
    assert repo.threshold == 0.001
    repo.config.set("diff", "threshold", "0.25")
    assert repo.threshold == 0.25
    repo.config.remove_section("diff")
    with pytest.raises(configparser.NoSectionError):
        _ = repo.threshold
    repo.config.set("diff", "threshold", "0.5")
    assert repo.threshold == 0.5


# ---------------------------------------------------------------- tensor_change's work array


def _tensor_change_reference(old, new):
    """tensor_change as first written (a fresh temporary per step): the kept work array
    must give bit-identical statistics."""
    import numpy as np

    from vrl.tensor_norms import CHUNK
    from vrl.tensor_norms import elements as _elements

    a_all, convert = _elements(old)
    b_all, _ = _elements(new)
    d2 = o2 = mx = 0.0
    for i in range(0, a_all.size, CHUNK):
        a, b = convert(a_all[i:i + CHUNK]), convert(b_all[i:i + CHUNK])
        d = b - a
        d2 += float(np.einsum("i,i->", d, d))
        o2 += float(np.einsum("i,i->", a, a))
        m = float(np.abs(d).max())
        if m > mx or m != m:
            mx = m
    return d2, o2, mx


def _raw(t):
    data = bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    return RawTensor(str(t.dtype).removeprefix("torch."), tuple(t.shape), memoryview(data))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16, torch.int32, torch.complex64])
def test_tensor_change_with_a_kept_work_array_is_bit_identical(dtype):
    import numpy as np

    from vrl.tensor_norms import CHUNK, tensor_change

    torch.manual_seed(0)
    # big, small, big again (the work array is reused, grown, sliced), odd sizes
    for n in (CHUNK + 12345, 7, 3 * CHUNK, 1, 1000, 20000, CHUNK, 0):
        old = (torch.randn(n) * 100).to(dtype)
        new = old.clone()
        if n:
            new.view(-1)[:: max(1, n // 50)] += 1
        if n > 10 and dtype.is_floating_point:
            new[3] = float("nan") if n % 2 else float("inf")
        got, want = tensor_change(old, new), _tensor_change_reference(old, new)
        assert np.array_equal(np.array(got), np.array(want), equal_nan=True), (n, got, want)
        # as the store holds them (raw bytes: float32 up to CHUNK takes a short way)
        got = tensor_change(_raw(old), _raw(new))
        assert np.array_equal(np.array(got), np.array(want), equal_nan=True), (n, got, want)
    # and for arrays (float32 work array, then float64)
    a = np.linspace(0, 1, 5000, dtype=np.float32)
    assert tensor_change(a, a[::-1].copy()) == _tensor_change_reference(a, a[::-1].copy())


# ---------------------------------------------------------------- golden commits

GOLDEN_COMMITS = ["f1d2b51bc2fbb7683d8f499fd1611fad670674222e11b35fdc5b715bc32a6495",
                  "c3b1139ea76dc0ddffd8dacf7ee5a9839c94fa9e242e187f8fd60a3aeae889a1",
                  "724e4889ab9fafb58fa3649b954c6b0fd9db4d96ad699a698ac70f0fe2073c26",
                  "5e3bdc74acf589a6e8d2e5615dc2fd7d4e7819cb6a53ba288412d8b738614fea"]


def test_commit_ids_of_a_training_sequence_are_pinned(repo):
    """Manifests, layer statistics (changed, unchanged, reshaped, NaN, counters, a removed
    tensor, an int threshold) and commits as the store wrote them before these shortcuts
    (ids taken from that code). Values whose sums are exact in float32, so the statistics
    do not depend on the CPU's vector width."""
    t = "2026-01-01T00:00:00.000000Z"
    state = {"model/l1.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3),
             "model/l1.bias": torch.ones(2), "model/l2.weight": torch.full((4,), 2.0),
             "algo/optimizer/state/0/step": torch.tensor(3.0),
             "algo/optimizer/state/0/exp_avg": torch.zeros(2, 3)}
    ids = [repo.commit(state, env=False, author="a", time=t, message="0")]
    state["model/l1.weight"] += 1
    state["algo/optimizer/state/0/step"] += 1
    ids.append(repo.commit(state, env=False, author="a", time=t, message="1"))
    state["model/l2.weight"] = torch.full((2, 2), 2.0)
    state["algo/optimizer/state/0/exp_avg"] = torch.full((2, 3), float("nan"))
    ids.append(repo.commit(state, env=False, author="a", time=t, message="2", threshold=1))
    del state["model/l1.bias"]
    ids.append(repo.commit(state, env=False, author="a", time=t, message="3"))
    assert ids == GOLDEN_COMMITS
