"""Small shortcuts of every commit against their plain definitions: the time text, the
bounded metadata caches, the packs' size classes that decide an automatic merge."""

import datetime
import os
import random

import torch

from vrl import Repo, pack_merge
from vrl import object_store as store_module
from vrl import refs as refs_module
from vrl.repo import _Bounded


def test_utc_now_is_the_iso_text_of_the_clock(monkeypatch):
    rng = random.Random(0)
    clock = [0]
    monkeypatch.setattr(refs_module.time, "time_ns", lambda: clock[0])
    start = 1_700_000_000 * 10**9
    times = [start + rng.randrange(0, 10**9) for _ in range(50)]  # within one second
    times += [start + rng.randrange(0, 400 * 86400 * 10**9) for _ in range(300)]
    times += [start + 10**9 - 1, start + 10**9, start + 10**9 + 1, 0, 951782400 * 10**9]
    for ns in times:
        clock[0] = ns
        when = datetime.datetime.fromtimestamp(ns // 1000 / 1e6, datetime.timezone.utc)
        micros = ns // 1000 % 1_000_000
        assert refs_module.utc_now() == when.strftime("%Y-%m-%dT%H:%M:%S.") + \
            f"{micros:06d}Z"


def test_a_bounded_cache_keeps_the_newest_and_at_most_its_limit():
    cache = _Bounded(64)
    for i in range(1000):
        cache[i] = str(i)
        assert len(cache) <= 64
        assert cache[i] == str(i) and i - 1 not in cache or cache.get(i - 1) == str(i - 1)
    kept = sorted(cache)
    assert kept == list(range(1000 - len(kept), 1000)) and len(kept) >= 48


def _due_reference(objects, landing=None):
    """FileObjectStore._due as defined before its size classes were kept."""
    classes = ([], [])
    for name in sorted(objects._packs):
        try:
            size = os.stat(f"{objects._pack_dir}/{name}").st_size
        except FileNotFoundError:
            continue
        if size < pack_merge.MERGED_MAX:
            classes[size >= pack_merge.FRESH_MAX].append(name)
    if landing is not None and landing < pack_merge.MERGED_MAX:
        classes[landing >= pack_merge.FRESH_MAX].append("")
    if len(objects._packs) + (landing is not None) < pack_merge.AUTO_MERGE:
        return None
    return next((names for names in classes if len(names) >= pack_merge.AUTO_MERGE), None)


def test_the_kept_size_classes_decide_as_a_fresh_look(tmp_path, monkeypatch):
    monkeypatch.setattr(pack_merge, "AUTO_MERGE", 4)
    monkeypatch.setattr(pack_merge, "FRESH_MAX", 3000)
    repo = Repo.init(tmp_path)
    rng = random.Random(1)
    state = {"a.w": torch.zeros(16), "b.w": torch.zeros(1024)}
    for _ in range(40):
        state["a.w"].add_(1.0)
        if rng.random() < 0.3:
            state["b.w"].add_(1.0)  # a bigger pack: the other size class
        repo.commit(state, env=False)
        repo.sync()
        objects = repo.objects
        for landing in (None, 100, 5000, pack_merge.MERGED_MAX):
            assert objects._due(landing) == _due_reference(objects, landing)
        if rng.random() < 0.2:
            objects.consolidate()  # packs go away and a merged one appears
            assert objects._due() == _due_reference(objects)
        elif rng.random() < 0.2:  # merged by another object: files gone under our tables
            Repo(tmp_path).objects.consolidate()
            for landing in (None, 100):
                assert objects._due(landing) == _due_reference(objects, landing)
    other = Repo(tmp_path)  # (a fresh look from another object agrees too)
    other.objects._refresh()
    assert other.objects._due() == _due_reference(other.objects)


def test_a_packs_size_follows_from_its_layout(tmp_path):
    from vrl import pack

    rng = random.Random(2)
    for n in [0, 1, 2, 5, 40]:
        objects = []
        for _ in range(n):
            payload = os.urandom(rng.choice([0, 1, 63, 64, 65, 1000, 5000]))
            raw = store_module.header("tensor", len(payload)) + payload
            objects.append((store_module.hash_object("tensor", payload), raw))
        name, chunks, entries = pack.build(objects)
        assert pack.file_size(entries) == sum(memoryview(c).nbytes for c in chunks)
    repo = Repo.init(tmp_path)
    for i in range(3):
        repo.commit({"w": torch.full((64,), float(i)), "b": torch.zeros(3)}, env=False)
    repo.sync()
    for name, size in repo.objects._pack_sizes.items():
        assert size == os.stat(f"{repo.objects._pack_dir}/{name}").st_size
    assert repo.objects._pack_sizes


def _entry(rng, store, dtype="float32", shape=None):
    from vrl.objects import TensorEntry, hash_object
    from vrl.safetensors_file import RawTensor

    shape = shape if shape is not None else rng.choice([(), (3,), (2, 2), (4, 1)])
    value = torch.randn(shape) * 3
    if rng.random() < 0.1 and value.numel():
        value.view(-1)[0] = rng.choice([float("nan"), float("inf"), -0.0])
    data = value.numpy().tobytes()
    oid = hash_object("tensor", data)
    store[oid] = RawTensor(dtype, shape, data)
    return TensorEntry(oid, dtype, tuple(shape), len(data))


NAMES = ["model/a.0.weight", "model/a.0.bias", "model/a.10.weight", "model/b.weight",
         "algo/optimizer/state/0/exp_avg", "algo/optimizer/state/1/exp_avg", "step", "x.w",
         "x.b", "y"]


def test_kept_layer_texts_give_the_statistics_text_of_the_definition():
    """Layers found unchanged as before keep their LayerChange and its text: the commit
    text assembled with them is canonical_json of the statistics, whatever moved."""
    from vrl.diff import compare
    from vrl.objects import Commit, Manifest, _clean, _stats_json, canonical_json

    for seed in range(30):
        rng = random.Random(seed)
        torch.manual_seed(seed)
        store: dict = {}
        names = rng.sample(NAMES, rng.randint(1, len(NAMES)))
        if rng.random() < 0.5:  # (without a model prefix: no kinds in the statistics)
            names = [n.replace("model/", "net/") for n in names]
        old = {n: _entry(rng, store) for n in names}
        hits = 0
        for step in range(8):
            new = {}
            for name, entry in old.items():
                r = rng.random()
                new[name] = entry if r < 0.7 else _entry(rng, store, shape=entry.shape) \
                    if r < 0.9 else _entry(rng, store)
            parent = None if step == 0 else "ab" * 32
            result = compare(Manifest(old, None), Manifest(new, None),
                             store_load(store), threshold=rng.choice([0.01, 1, 1e-9]))
            stats = result.to_json()
            stats["parent"] = parent
            texts = result.layer_texts()
            hits += len(texts)
            expected = canonical_json(_clean(stats)).decode()
            assert _stats_json(stats, texts) == _stats_json(stats) == expected
            commit = Commit(manifest="cd" * 32, parents=(), message="", author="a",
                            time="t", stats=stats)
            assert commit.to_bytes(_stats_json(stats, texts)) == \
                canonical_json(commit.to_json())
            old = new
        assert hits or len(names) == 1


def store_load(store):
    return lambda entry: store[entry.id]
