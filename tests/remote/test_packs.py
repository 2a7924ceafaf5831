"""Packs on remotes, on every backend: a push sends its small objects as one pack, a clone
reads it in a few requests, remotes holding loose objects (older pushes) and packs mix,
a metadata-only clone reads single tensors by ranges, damaged packs fail cleanly."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from vrl import pack
from vrl.errors import CorruptObjectError, VrlError
from vrl.objects import HEADER_SIZE, ObjectId
from vrl.remote import add_remote, clone, fetch, open_named, push
from vrl.remote import config as remote_config
from vrl.remote.base import RemoteStore, object_key
from vrl.remote.packs import WHOLE_PACK_MIN, RemotePacks
from vrl.repo import Repo
from vrl.testing.remote_conformance import (
    RemoteCase,
    assert_bit_exact,
    azure_case,
    flip_remote_byte,
    gcs_case,
    make_big_history,
    make_history,
    memory_case,
    s3_case,
    ssh_case,
)


class CountingStore(RemoteStore):
    """Wraps a store and counts the requests made through it (by method), and the bytes
    read by ranges."""

    def __init__(self, inner: RemoteStore) -> None:
        self.inner = inner
        self.url, self.guarantee = inner.url, inner.guarantee
        self.calls: Counter[str] = Counter()
        self.range_bytes = 0
        self.lock = threading.Lock()

    def _count(self, name: str) -> None:
        with self.lock:
            self.calls[name] += 1

    def get(self, key: str) -> bytes:
        self._count("get")
        return self.inner.get(key)

    def get_small(self, key: str, limit: int, what: str = "object") -> bytes:
        self._count("get")
        return self.inner.get_small(key, limit, what)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        self._count("get_range")
        data = self.inner.get_range(key, start, end)
        with self.lock:
            self.range_bytes += len(data)
        return data

    def put(self, key: str, data: bytes) -> None:
        self._count("put")
        self.inner.put(key, data)

    def put_file(self, key: str, local: Path) -> None:
        self._count("put")
        self.inner.put_file(key, local)

    def exists(self, key: str) -> bool:
        self._count("exists")
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        self._count("list")
        return self.inner.list(prefix)

    def list_sizes(self, prefix: str) -> dict[str, int]:
        self._count("list")
        return self.inner.list_sizes(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        self._count("get")
        return self.inner.read_versioned(key)

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        self._count("put")
        self.inner.swap(key, data, expected)

    def state(self) -> str:
        return self.inner.state()

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@pytest.fixture(params=["local", "memory", "s3", "ssh", "gs", "az"])
def remote(request, tmp_path) -> RemoteCase:
    if request.param == "local":
        return RemoteCase(str(tmp_path / "remote.vrl"))
    if request.param == "memory":
        return memory_case()
    if request.param == "s3":
        return s3_case(request.getfixturevalue("s3"))
    if request.param == "gs":
        return gcs_case(request.getfixturevalue("gcs"))
    if request.param == "az":
        return azure_case(request.getfixturevalue("azurite"))
    return ssh_case(request.getfixturevalue("ssh"))


def source(tmp_path: Path, remote: RemoteCase, name: str = "src") -> Repo:
    repo = Repo.init(tmp_path / name)
    add_remote(repo, "origin", remote.url, remote.options, create=True)
    return repo


def layout(store: RemoteStore) -> tuple[list[str], list[str]]:
    """(pack keys, loose object keys) on a remote."""
    keys = store.list_sizes("objects/")
    packs = sorted(k for k in keys if k.startswith("objects/pack/"))
    return packs, sorted(k for k in keys if k not in packs)


def push_loose(repo: Repo, store: RemoteStore, ref: str = "refs/heads/main") -> None:
    """What a client from before packs did: every object under its own key, then the ref."""
    tip = repo.refs.read(ref)
    for oid in repo.reachable(include_reflog=False):
        store.put(object_key(oid), repo.objects.read_raw(oid))
    store.cas_ref(ref, tip, store.read_ref(ref)[1])


def test_push_sends_one_pack_and_clone_costs_few_requests(tmp_path, remote):
    src = source(tmp_path, remote)
    ids = make_history(src, 12)  # every object is small
    counting = CountingStore(open_named(src, "origin"))
    first = push(src, counting, "origin")
    objects = sum(first.objects.values())
    assert objects == len(src.reachable(include_reflog=False)) > 40
    assert counting.calls["put"] == 1 + 1  # one pack, then the ref
    packs, loose = layout(counting.inner)
    assert len(packs) == 1 and loose == []

    dst = Repo.init(tmp_path / "dst")
    reading = CountingStore(open_named(src, "origin"))
    fetch(dst, reading, "origin")
    # refs (list + 1 read), the pack listing, its index, the whole pack; no per-object request
    assert reading.total <= 6, reading.calls
    dst.refs.update("refs/heads/main", ids[-1])
    for oid in ids:
        assert_bit_exact(src, dst, oid)
    assert dst.fsck()["ok"]
    # installed here as local packs (the store's own layout), not one file per object
    assert dst.objects.packs() and not any(dst.objects.loose_path(o)
                                           for o in dst.reachable(include_reflog=False))

    again = CountingStore(open_named(src, "origin"))
    assert push(src, again, "origin").updates[0].status == "up-to-date"
    assert again.calls["put"] == 0 and again.calls["list"] == 0
    make_history(src, 1, seed=4)
    step = CountingStore(open_named(src, "origin"))
    push(src, step, "origin")
    assert step.calls["put"] == 2 and step.calls["exists"] == 0, step.calls
    assert len(layout(step.inner)[0]) == 2
    fetch(dst, open_named(src, "origin"), "origin")
    assert dst.refs.read("refs/remotes/origin/main") == src.head()
    assert_bit_exact(src, dst, src.head())


def test_big_tensors_stay_loose(tmp_path, remote):
    src = source(tmp_path, remote)
    make_big_history(src, 4)
    push(src, open_named(src, "origin"), "origin")
    packs, loose = layout(open_named(src, "origin"))
    big = {o for o in src.reachable(include_reflog=False)
           if src.objects.kind_and_size(o) == ("tensor", 1_200_000)}
    assert len(packs) == 1 and {k[8:10] + k[11:] for k in loose} == big
    dst = clone(remote.url, tmp_path / "dst", options=remote.options)
    assert_bit_exact(src, dst)
    assert dst.fsck()["ok"]


def test_remote_with_loose_objects_and_packs(tmp_path, remote):
    """A remote an older client pushed to (every object loose) keeps working: clones read
    it, a new push adds a pack, and clones (full and lazy) read both."""
    old = source(tmp_path, remote, "old")
    old_ids = make_history(old, 3)
    push_loose(old, open_named(old, "origin"))
    new = clone(remote.url, tmp_path / "new", options=remote.options)
    assert_bit_exact(old, new)
    new_ids = make_history(new, 2, seed=9)
    push(new, open_named(new, "origin"), "origin")
    packs, loose = layout(open_named(new, "origin"))
    assert len(packs) == 1 and len(loose) == len(old.reachable(include_reflog=False))
    full = clone(remote.url, tmp_path / "full", options=remote.options)
    for oid in old_ids + new_ids:
        assert_bit_exact(new, full, oid)
    assert full.fsck()["ok"]
    lazy = clone(remote.url, tmp_path / "lazy", options=remote.options, metadata_only=True)
    assert_bit_exact(new, lazy, old_ids[0])  # tensors from loose keys
    assert_bit_exact(new, lazy, new_ids[-1])  # and from the pack
    assert lazy.fsck()["ok"]


def test_a_damaged_packed_copy_is_replaced_by_a_loose_one(tmp_path, remote):
    src = source(tmp_path, remote)
    ids = make_history(src, 2)
    store = open_named(src, "origin")
    push(src, store, "origin")
    tensor = next(iter(src.read_manifest(src.read_commit(ids[0]).manifest).tensors.values())).id
    flip_remote_byte(store, tensor, HEADER_SIZE)
    with pytest.raises(CorruptObjectError, match=tensor):
        clone(remote.url, tmp_path / "bad", options=remote.options)
    store.put(object_key(tensor), src.objects.read_raw(tensor))  # a good loose copy too
    dst = clone(remote.url, tmp_path / "dst", options=remote.options)
    assert_bit_exact(src, dst, ids[0])


def small_tensor_history(repo: Repo, commits: int) -> list[ObjectId]:
    """8 tensors just under the pack threshold; each commit changes one."""
    import torch

    gen = torch.Generator().manual_seed(3)
    state = {f"layer{i}.weight": torch.randn(15_000, generator=gen) for i in range(8)}
    ids = []
    for i in range(commits):
        state = {**state, f"layer{i % 8}.weight": state[f"layer{i % 8}.weight"] + 1}
        ids.append(repo.commit(state, message=f"c{i}", step=i, env=False))
    return ids


def test_lazy_clone_reads_single_tensors_by_ranges(tmp_path, remote, monkeypatch):
    src = source(tmp_path, remote)
    ids = small_tensor_history(src, 24)
    push(src, open_named(src, "origin"), "origin")
    packs, loose = layout(open_named(src, "origin"))  # the tensors', then the history's
    sizes = open_named(src, "origin").list_sizes("objects/pack/")
    size = max(sizes.values())
    assert loose == [] and len(packs) == 2 and size > WHOLE_PACK_MIN
    lazy = clone(remote.url, tmp_path / "lazy", options=remote.options, metadata_only=True)
    seen: list[CountingStore] = []
    real_open = remote_config.open_named

    def counting_open(repo: Repo, name: str) -> RemoteStore:
        seen.append(CountingStore(real_open(repo, name)))
        return seen[-1]

    monkeypatch.setattr(remote_config, "open_named", counting_open)
    lazy = Repo(lazy.workdir)
    manifest = src.read_manifest(src.read_commit(ids[5]).manifest)
    entry = manifest.tensors["layer3.weight"]
    lazy.load_entry(entry)  # one tensor on demand
    (store,) = seen
    # the pack listing (its index is cached since the clone) and one ranged read
    assert store.calls == {"list": 1, "get_range": 1}, store.calls
    assert store.range_bytes == entry.nbytes + HEADER_SIZE
    state = lazy.load(ids[-1])  # a whole snapshot: nearby tensors share a range
    assert sorted(state) == sorted(manifest.tensors)
    assert seen[-1].range_bytes < size
    assert_bit_exact(src, lazy, ids[-1])


@pytest.mark.parametrize("damage", ["index", "trailer", "truncate", "rename"])
def test_damaged_remote_pack_fails_cleanly(tmp_path, remote, damage):
    src = source(tmp_path, remote)
    make_history(src, 2)
    store = open_named(src, "origin")
    push(src, store, "origin")
    dst = clone(remote.url, tmp_path / "dst", options=remote.options)
    make_history(src, 2, seed=6)
    push(src, store, "origin")
    key = max(layout(store)[0], key=lambda k: (k not in dst_packs(dst, store), k))
    data = bytearray(store.get(key))
    if damage == "index":
        data[-pack.TRAILER.size - 5] ^= 0x40
    elif damage == "trailer":
        data[-48] ^= 0x01  # the object count
    elif damage == "truncate":
        del data[-10:]
    if damage == "rename":
        store.put(key.replace("pack-", "pack-0"), bytes(data))
        store.delete(key)
    else:
        store.put(key, bytes(data))
    tracking = dst.refs.read("refs/remotes/origin/main")
    with pytest.raises(VrlError, match="damaged|truncated|does not match|missing") as err:
        fetch(dst, open_named(dst, "origin"), "origin")
    assert "\n" not in str(err.value)
    assert dst.refs.read("refs/remotes/origin/main") == tracking
    assert dst.fsck()["ok"]
    with pytest.raises(VrlError):
        clone(remote.url, tmp_path / "dst2", options=remote.options)
    assert not (tmp_path / "dst2").exists()


def dst_packs(repo: Repo, store: RemoteStore) -> set[str]:
    """The remote packs whose objects `repo` already has (the older push's)."""
    packs = RemotePacks(store).load()
    return {k for k, entries in packs.entries.items()
            if all(repo.objects.has(o) for o in entries)}


def test_a_big_push_sends_tensor_packs_then_the_history(tmp_path, monkeypatch):
    from vrl.remote import pushing

    monkeypatch.setattr(pushing, "PACK_SPLIT", 140_000)
    monkeypatch.setattr(pushing, "ONE_PACK_MAX", 100_000)
    remote = RemoteCase(str(tmp_path / "remote.vrl"))
    src = source(tmp_path, remote)
    ids = small_tensor_history(src, 4)  # 11 tensors of 60 KB: in packs of 2
    order: list[str] = []
    store = open_named(src, "origin")
    real_put = store.put
    monkeypatch.setattr(store, "put", lambda k, d: (order.append(k), real_put(k, d)))
    push(src, store, "origin", jobs=1)
    packs = RemotePacks(store).load()
    kinds = {k: {src.objects.kind_and_size(o)[0] for o in e} for k, e in packs.entries.items()}
    assert len(kinds) == 7 and not packs.bad
    assert list(kinds.values()).count({"tensor"}) == 6
    assert kinds[order[-1]] == {"manifest", "commit"}  # the history, after all its data
    lazy = clone(remote.url, tmp_path / "lazy", metadata_only=True)
    assert lazy.log()[0].id == ids[-1]
    dst = clone(remote.url, tmp_path / "dst")
    for oid in ids:
        assert_bit_exact(src, dst, oid)
