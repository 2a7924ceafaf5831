"""What a hostile remote can make a fetch hold: bounded by the metadata caps.

A forged manifest or commit (valid hash) is refused quickly and within ~256 MB: one over
`MAX_MANIFEST_BYTES` is never read whole, one whose text would take more than
`MAX_PARSE_BYTES` to parse (many tiny values) is refused before parsing, and the costliest
one under both is parsed within them. Real manifests of huge models pass. Memory is the
peak RSS of a `vrl clone --no-checkout` process, over that of the same clone of a tiny
forged manifest.
"""

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

import blake3
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vrl.remote.fetching as fetching
from vrl.errors import CorruptObjectError, VrlError
from vrl.objects import ObjectId, header
from vrl.remote import add_remote, clone, fetch, open_named, push
from vrl.remote.base import object_key
from vrl.remote.transfer import MAX_MANIFEST_BYTES, MAX_PARSE_BYTES, parse_cost, parse_remote
from vrl.repo import Repo
from vrl.testing.remote_conformance import make_big_history

MB = 10**6

# Runs one command of the CLI in a process of its own and reports its exit code, time,
# error and peak RSS. The command runs as a child of a small wrapper: Linux keeps a
# process's peak RSS across exec, so a process forked from pytest (which holds torch)
# would report pytest's; its children start from the wrapper's. (ru_maxrss is in KiB.)
_MEASURE = """
import json, resource, subprocess, sys, time
start = time.monotonic()
run = subprocess.run([sys.executable, "-m", "vrl", *sys.argv[1:]], capture_output=True,
                     text=True)
print(json.dumps({"code": run.returncode, "seconds": time.monotonic() - start,
                  "stderr": run.stderr,
                  "rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def _clone(remote: Path, into: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", _MEASURE, "clone", "--no-checkout", "-q",
                          str(remote), str(into)], capture_output=True, text=True,
                         timeout=600)
    return json.loads(run.stdout.strip().splitlines()[-1])


def _forge(root: Path, payload: bytes | None = None,
           chunks: Callable[[], Iterable[bytes]] | None = None) -> Path:
    """A local-path remote with a real first commit and, on main, a commit (valid hash)
    whose manifest is `payload`, or the parts `chunks()` yields (streamed: never held
    whole)."""
    src = Repo.init(root / "src")
    src.commit({"w": torch.zeros(4)}, message="base", env=False)
    remote = root / "remote"
    add_remote(src, "origin", str(remote), create=True)
    store = open_named(src, "origin")
    push(src, store, "origin")
    parts = chunks if chunks is not None else lambda: [payload]
    size = sum(len(p) for p in parts())
    hasher = blake3.blake3(header("manifest", size))
    tmp = root / "manifest.tmp"
    with open(tmp, "wb") as out:
        out.write(header("manifest", size))
        for part in parts():
            hasher.update(part)
            out.write(part)
    mid = ObjectId(hasher.hexdigest())
    path = remote / object_key(mid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(path)
    cid = _put_commit(store, mid, [src.head()])
    store.put("refs/heads/main", f"{cid}\n".encode())
    return remote


def _put_commit(store, manifest: str, parents: list[str], **fields) -> ObjectId:
    """A commit (valid hash) stored on the remote; returns its id."""
    data = {"format": 1, "manifest": manifest, "parents": parents, "message": "forged",
            "author": "mallory", "time": "2026-01-01T00:00:00.000000Z", "hparams": {},
            "metrics": {}, "env": {}, "step": None, "stats": {}, "meta": {}, **fields}
    body = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    raw = header("commit", len(body)) + body
    cid = ObjectId(blake3.blake3(raw).hexdigest())
    store.put(object_key(cid), raw)
    return cid


def _entries(n: int, start: int | None = None) -> bytes:
    """A manifest of `n` valid, minimal tensor entries (the costliest per byte that a
    manifest of real entries can be): what a forger makes to exhaust memory. With
    `start`, just the entries (numbered from there)."""
    ents = b",".join(b'"%d":{"dtype":"int8","id":"%064x","nbytes":0,"shape":[0]}' % (i, i + 1)
                     for i in range(start or 0, (start or 0) + n))
    return ents if start is not None else b'{"format":1,"tensors":{' + ents + b'},"tree":{}}'


def _astral(n: int) -> bytes:
    """A manifest whose tree is one string of `n` characters, one of them astral: the text
    and the string each take 4 bytes a character once decoded."""
    return b'{"format":1,"tensors":{},"tree":["' + "\U0001F600".encode() + b"a" * n + b'"]}'


def _costliest_under_the_caps(make: Callable[[int], bytes]) -> bytes:
    """`make(n)` for the largest `n` both caps let through."""
    lo, hi = 1, MAX_MANIFEST_BYTES // (len(make(2)) - len(make(1)))  # (the size cap's n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        p = make(mid)
        fits = len(p) <= MAX_MANIFEST_BYTES and \
            parse_cost(header("manifest", len(p)) + p) <= MAX_PARSE_BYTES
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return make(lo)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> int:
    """Peak RSS of the same clone refused the same way, for a 3-entry forged manifest."""
    root = tmp_path_factory.mktemp("baseline")
    got = _clone(_forge(root, _entries(3)), root / "clone")
    assert got["code"] == 1 and "missing" in got["stderr"], got
    return got["rss"]


# ------------------------------------------------------------------------------ the CLI


def test_a_227_mb_forged_manifest_is_refused_in_seconds_without_being_read(tmp_path,
                                                                         baseline):
    """The issue's case: 227 MB of tensor entries (1.9 million), under the old 256 MiB
    cap, were parsed before the first missing tensor refused them: 206 s and 6.8 GiB on
    9ac282a (the issue's manifest: 4.5 minutes, 2.3 GB)."""
    def chunks():
        yield b'{"format":1,"tensors":{'
        size, block = 0, 0
        while size < 227 * MB:
            part = (b"," if block else b"") + _entries(1 << 12, start=block << 12)
            size, block = size + len(part), block + 1
            yield part
        yield b'},"tree":{}}'

    got = _clone(_forge(tmp_path, chunks=chunks), tmp_path / "clone")
    assert got["code"] == 1
    assert got["stderr"].count("\n") == 1 and "too large for a vrl manifest" in got["stderr"]
    assert got["seconds"] < 20  # (it reads the cap's worth: ~0.1 s)
    assert got["rss"] - baseline < 64 << 20
    assert not (tmp_path / "clone").exists()


def test_a_manifest_of_tiny_values_under_the_size_cap_is_refused_before_parsing(tmp_path,
                                                                              baseline):
    """16 MiB of `{"a":0},` would take ~450 MiB to parse (28 times its size)."""
    payload = b'{"format":1,"tensors":{},"tree":[' + b",".join([b'{"a":0}'] * (2 << 20)) \
        + b"]}"
    assert len(payload) < MAX_MANIFEST_BYTES
    got = _clone(_forge(tmp_path, payload), tmp_path / "clone")
    assert got["code"] == 1 and got["stderr"].count("\n") == 1
    assert f"over the {MAX_PARSE_BYTES >> 20} MiB a manifest may take" in got["stderr"]
    assert got["seconds"] < 20
    assert got["rss"] - baseline < 96 << 20  # the text, hashed and counted; never parsed


@pytest.mark.parametrize("make", [_entries, _astral], ids=["entries", "astral"])
def test_the_costliest_manifests_under_both_caps_stay_within_256_mib(tmp_path, baseline,
                                                                     make):
    """~200,000 minimal valid entries (parsed, then refused at the first tensor the remote
    lacks; before: ~880 MB and 16 s on the machine these bounds were set on), or a 27 MiB
    string that takes 8 times its size once decoded (cloned: it is a valid manifest)."""
    payload = _costliest_under_the_caps(make)
    got = _clone(_forge(tmp_path, payload), tmp_path / "clone")
    if make is _entries:
        assert got["code"] == 1 and "is missing on" in got["stderr"], got["stderr"]
    else:
        assert got["code"] == 0, got["stderr"]
    assert got["rss"] - baseline < 256 << 20, (got["rss"] - baseline) >> 20
    assert got["seconds"] < 60


# ------------------------------------------------------------------------------ the bounds


def _huge_model_manifest() -> bytes:
    """The manifest vrl writes for a DeepSeek-V3-shaped checkpoint (its names, shapes and
    dtypes; FP8 weights with block scales): 90,427 tensors, ~26 MiB."""
    from vrl.objects import ITEMSIZE, Manifest, TensorEntry

    def tensors():
        h, v = 7168, 129280
        yield "model.embed_tokens.weight", "bfloat16", (v, h)
        for layer in range(61):
            p = f"model.layers.{layer}."
            yield p + "input_layernorm.weight", "bfloat16", (h,)
            yield p + "post_attention_layernorm.weight", "bfloat16", (h,)
            for name, shape in [("q_a_proj", (1536, h)), ("q_b_proj", (24576, 1536)),
                                ("kv_a_proj_with_mqa", (576, h)), ("kv_b_proj", (32768, 512)),
                                ("o_proj", (h, 16384))]:
                yield p + f"self_attn.{name}.weight", "float8_e4m3fn", shape
                yield p + f"self_attn.{name}.weight_scale_inv", "float32", \
                    ((shape[0] + 127) // 128, (shape[1] + 127) // 128)
            yield p + "self_attn.q_a_layernorm.weight", "bfloat16", (1536,)
            yield p + "self_attn.kv_a_layernorm.weight", "bfloat16", (512,)
            mlps = [("mlp.", 18432)] if layer < 3 else \
                [("mlp.shared_experts.", 2048)] + [(f"mlp.experts.{e}.", 2048) for e in range(256)]
            if layer >= 3:
                yield p + "mlp.gate.weight", "bfloat16", (256, h)
                yield p + "mlp.gate.e_score_correction_bias", "float32", (256,)
            for q, inter in mlps:
                for proj, shape in [("gate_proj", (inter, h)), ("up_proj", (inter, h)),
                                    ("down_proj", (h, inter))]:
                    yield p + q + proj + ".weight", "float8_e4m3fn", shape
                    yield p + q + proj + ".weight_scale_inv", "float32", \
                        ((shape[0] + 127) // 128, (shape[1] + 127) // 128)
        yield "model.norm.weight", "bfloat16", (h,)
        yield "lm_head.weight", "bfloat16", (v, h)

    entries = {}
    for name, dtype, shape in tensors():
        n = 1
        for d in shape:
            n *= d
        entries[name] = TensorEntry(ObjectId(blake3.blake3(name.encode()).hexdigest()), dtype,
                                    shape, n * ITEMSIZE[dtype])
    tree = {"$d": [[name, {"$t": name}] for name in entries]}  # a flat state dict's
    return Manifest(entries, tree).to_bytes()


def test_a_real_manifest_of_a_huge_model_fits_both_caps_and_clones(tmp_path):
    payload = _huge_model_manifest()
    raw = header("manifest", len(payload)) + payload
    assert len(payload) < MAX_MANIFEST_BYTES * 0.85  # headroom
    assert parse_cost(raw) < MAX_PARSE_BYTES
    manifest = parse_remote(ObjectId("0" * 64), raw, "manifest", "here")
    assert len(manifest.tensors) == 90_427
    # a metadata-only clone takes it (the tensors are not there to fetch)
    remote = _forge(tmp_path, payload)
    copy = clone(str(remote), tmp_path / "copy", metadata_only=True)
    assert len(copy.read_manifest(copy.read_commit(copy.head()).manifest).tensors) == 90_427


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=6),
    max_leaves=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=JSON, entries=st.integers(0, 3), ascii_only=st.booleans())
def test_parse_cost_bounds_the_memory_parsing_takes(value, entries, ascii_only):
    """Whatever the JSON, parsing (text decoded, objects built, tensor entries checked)
    never takes more than `parse_cost` says (traced allocations, peak)."""
    unit = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))
    copies = max(1, (256 << 10) // (len(unit.encode()) + 1))
    tree = "[" + ",".join([unit] * copies) + "]"
    tensors = ",".join(f'"t{i}":{{"dtype":"int8","id":"{i + 1:064x}","nbytes":0,"shape":[0]}}'
                       for i in range(entries * copies // 4))
    payload = f'{{"format":1,"tensors":{{{tensors}}},"tree":{tree}}}'.encode()
    raw = header("manifest", len(payload)) + payload
    tracemalloc.start()
    try:
        manifest = parse_remote(ObjectId("0" * 64), raw, "manifest", "here")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del manifest
    assert peak <= parse_cost(raw), (peak, parse_cost(raw), unit[:80])


@pytest.mark.parametrize("shape", ["empty dicts", "one-key dicts", "empty lists", "numbers",
                                   "nested lists", "astral", "escaped astral",
                                   "astral and escapes", "entries"])
def test_parse_cost_bounds_the_costliest_shapes(shape):
    n = 1 << 18
    tree = {"empty dicts": "[" + ",".join(["{}"] * n) + "]",
            "one-key dicts": "[" + ",".join(['{"a":0}'] * n) + "]",
            "empty lists": "[" + ",".join(["[]"] * n) + "]",
            "nested lists": "[" + ",".join(["[[[[0]]]]"] * n) + "]",
            "numbers": "[" + ",".join(["1234567.5"] * n) + "]",
            "astral": '["' + "\U0001F600" + "a" * (4 * n) + '"]',
            "escaped astral": '["\\ud83d\\ude00' + "a" * (4 * n) + '"]',
            "astral and escapes": '["' + "\U0001F600" + "a" * (4 * n) + '\\n"]',
            "entries": "{}"}[shape]
    payload = (_entries(n // 8)[:-len(b',"tree":{}}')] + b',"tree":' + tree.encode() + b"}") \
        if shape == "entries" else f'{{"format":1,"tensors":{{}},"tree":{tree}}}'.encode()
    raw = header("manifest", len(payload)) + payload
    tracemalloc.start()
    try:
        parse_remote(ObjectId("0" * 64), raw, "manifest", "here")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= parse_cost(raw) <= 4 * peak, (peak, parse_cost(raw))


def test_a_commit_of_tiny_values_is_refused_before_parsing(tmp_path):
    repo = Repo.init(tmp_path / "src")
    make_big_history(repo, 1)
    add_remote(repo, "origin", str(tmp_path / "remote"), create=True)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    hparams = {"x": [{"a": 0}] * 1_000_000}
    cid = _put_commit(store, repo.read_commit(repo.head()).manifest, [repo.head()],
                      hparams=hparams)
    raw = store.get(object_key(cid))
    assert len(raw) < fetching.MAX_COMMIT_BYTES and parse_cost(raw) > MAX_PARSE_BYTES
    store.put("refs/heads/main", f"{cid}\n".encode())
    with pytest.raises(CorruptObjectError, match="a commit may take"):
        clone(str(tmp_path / "remote"), tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_push_refuses_a_manifest_no_fetch_would_accept(tmp_path, monkeypatch):
    """Caps lowered so a small real manifest is over them: the push says so and moves no
    ref (else it would succeed and every clone fail)."""
    repo = Repo.init(tmp_path / "src")
    make_big_history(repo, 1)
    add_remote(repo, "origin", str(tmp_path / "remote"), create=True)
    monkeypatch.setattr(fetching, "MAX_MANIFEST_BYTES", 64)
    store = open_named(repo, "origin")
    with pytest.raises(VrlError, match="too big to push"):
        push(repo, store, "origin")
    assert store.read_ref("refs/heads/main")[0] is None
    monkeypatch.setattr(fetching, "MAX_MANIFEST_BYTES", 32 << 20)
    monkeypatch.setattr(fetching, "MAX_PARSE_BYTES", 64)
    with pytest.raises(VrlError, match="up to 0 MiB to read"):
        push(repo, store, "origin")
    assert store.read_ref("refs/heads/main")[0] is None


# ------------------------------------------------------------------------------ fetched sizes


def _lying_about_a_size(tmp_path) -> tuple[Path, ObjectId, int]:
    """A remote whose main names, in a manifest with a valid hash, a real loose tensor of
    1.2 MB as a 4-byte one (shape, dtype and size agree with each other, not with it)."""
    src = Repo.init(tmp_path / "src")
    make_big_history(src, 1)
    remote = tmp_path / "remote"
    add_remote(src, "origin", str(remote), create=True)
    store = open_named(src, "origin")
    push(src, store, "origin")
    manifest = src.read_manifest(src.read_commit(src.head()).manifest)
    big = manifest.tensors["big0"].id
    assert (remote / object_key(big)).is_file()  # sent loose
    real = manifest.tensors["big0"].nbytes
    payload = json.dumps({"format": 1, "tensors": {"w": {"dtype": "float32", "id": big,
                                                        "nbytes": 4, "shape": [1]}},
                          "tree": {"$t": "w"}}, sort_keys=True, separators=(",", ":")).encode()
    raw = header("manifest", len(payload)) + payload
    mid = blake3.blake3(raw).hexdigest()
    store.put(object_key(mid), raw)
    cid = _put_commit(store, mid, [src.head()])
    store.put("refs/heads/evil", f"{cid}\n".encode())
    return remote, ObjectId(big), real


def test_a_fetched_tensor_of_another_size_than_its_manifest_says_is_not_written(tmp_path):
    remote, big, real = _lying_about_a_size(tmp_path)
    repo = Repo.init(tmp_path / "dst")
    add_remote(repo, "origin", str(remote))
    with pytest.raises(CorruptObjectError) as err:
        fetch(repo, open_named(repo, "origin"), "origin")
    assert f"tensor {big[:12]}" in str(err.value)
    assert f"has {real} bytes but its manifest says 4; nothing was written" in str(err.value)
    assert not repo.objects.has(big)
    assert repo.refs.read("refs/remotes/origin/evil") is None


def test_a_tensor_fetched_on_demand_of_another_size_is_not_written(tmp_path):
    remote, big, real = _lying_about_a_size(tmp_path)
    lazy = clone(str(remote), tmp_path / "lazy", metadata_only=True, branch="evil")
    with pytest.raises(VrlError, match=f"has {real} bytes but its manifest says 4"):
        lazy.load("evil")
    assert not lazy.objects.has(big)
    assert lazy.fsck()["ok"]


def test_a_fetch_stops_at_the_first_tensor_the_remote_lacks(tmp_path):
    """A manifest naming 20,000 tensors the remote does not have: the fetch asks for a
    few (one per worker in flight), not for every one (it did, after queueing them all)."""
    remote = _forge(tmp_path, _entries(20_000))
    repo = Repo.init(tmp_path / "dst")
    add_remote(repo, "origin", str(remote))
    store = open_named(repo, "origin")
    asked: list[str] = []
    real = store.get

    def get(key: str) -> bytes:
        asked.append(key)
        return real(key)

    store.get = get
    with pytest.raises(VrlError, match="is missing on"):
        fetch(repo, store, "origin", jobs=8)
    tensors = [k for k in asked if k.startswith("objects/") and "/pack/" not in k]
    assert 1 <= len(tensors) <= 16, len(tensors)
