"""Hostile packs on a remote: Hypothesis rewrites the pack a clone lacks - offsets shifted,
lengths that claim 4 GiB or run into the index, overlapping or duplicated entries,
entries swapped (each id now points at another object's bytes), trailer counts and index
offsets that lie, flipped and truncated bytes - with a valid index checksum and a name
that matches it, so only vrl's own checks stand in the way. Clone, metadata-only clone
(then on-demand loads), fetch and pull must work or fail with a one-line VrlError, leave
no half-made clone and no moved ref, keep `fsck` clean, and never allocate a claimed
size. (The loose-object attacks are vrl/testing/hostile.py's.)"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vrl import pack
from vrl.errors import VrlError
from vrl.remote import add_remote, clone, fetch, open_named, pull, push
from vrl.remote.base import RemoteStore, pack_key
from vrl.remote.packs import RemotePacks
from vrl.repo import Repo
from vrl.testing.hostile import MEMORY_SLACK, _vm_peak
from vrl.testing.remote_conformance import (
    RemoteCase,
    azure_case,
    gcs_case,
    memory_case,
    s3_case,
    ssh_case,
)

BOMB = 1 << 32
EXAMPLES = int(os.environ.get("VRL_HOSTILE_EXAMPLES", "30"))


def forge(region: bytes, entries: list[tuple[bytes, int, int]], index_at: int | None = None,
          count: int | None = None) -> tuple[str, bytes]:
    """A pack of `region` (header + objects) and these index entries, with a valid
    checksum (and so a valid name) whatever the entries say."""
    index = b"".join(pack.ENTRY.pack(*e) for e in entries)
    head = pack.TRAILER.pack(pack.TRAILER_MAGIC, len(region) if index_at is None else index_at,
                             len(entries) if count is None else count, b"\0" * 8,
                             b"\0" * 32)[:32]
    digest = blake3.blake3(index + head).digest()
    return digest.hex(), region + index + head + digest


Attack = Callable[[bytes, list[tuple[bytes, int, int]]], tuple[str | None, bytes]]


MODES = ["shift", "bomb", "stretch", "overlap", "swap", "dup", "count", "index_at", "tiny",
         "flip", "truncate", "empty"]
# with these parameters each of these attacks leaves no usable copy of a needed object
REFUSED = {"bomb": (0, 1, 5), "stretch": (0, 1, 5), "overlap": (0, 1, 0), "swap": (0, 1, 0),
           "dup": (0, 1, 0), "count": (0, 1, 5), "index_at": (0, 1, 64), "tiny": (0, 1, 5),
           "truncate": (1, 0, 0), "empty": (0, 0, 0), "shift": (0, 1, 64)}


@st.composite
def attacks(draw: st.DrawFn) -> Attack:
    return make_attack(draw(st.sampled_from(MODES)), draw(st.integers(0, 1 << 16)),
                       draw(st.integers(0, 1 << 16)), draw(st.integers(-4096, 4096)))


def make_attack(mode: str, i: int, j: int, delta: int) -> Attack:
    def apply(data: bytes, entries: list[tuple[bytes, int, int]]) -> tuple[str | None, bytes]:
        index_at = len(data) - len(entries) * pack.ENTRY.size - pack.TRAILER.size
        region = data[:index_at]
        e = [list(x) for x in entries]
        a, b = i % len(e), j % len(e)
        if mode == "flip":  # the name (index) stays valid: only the hash check can notice
            raw = bytearray(data)
            raw[(i * 7919 + j) % len(raw)] ^= 1 << (j % 8)
            return None, bytes(raw)
        if mode == "truncate":
            return None, data[:(i * 7919 + j) % len(data)]
        if mode == "empty":
            return None, b""
        if mode == "shift":
            e[a][1] = max(0, e[a][1] + delta)
        elif mode == "bomb":
            e[a][2] = BOMB + abs(delta)
        elif mode == "stretch":
            e[a][2] = index_at - e[a][1] + abs(delta) + 1
        elif mode == "overlap":
            e[b][1] = e[a][1]
        elif mode == "swap":
            e[a][1:], e[b][1:] = e[b][1:], e[a][1:]
        elif mode == "dup":
            e[b][0] = e[a][0]
        elif mode == "tiny":
            e[a][2] = abs(delta) % 64
        name, forged = forge(region, [tuple(x) for x in e],
                             index_at + delta if mode == "index_at" else None,
                             BOMB + abs(delta) if mode == "count" else None)
        return name, forged

    apply.__name__ = f"{mode}({i},{j},{delta})"
    return apply


def ok_or_clean(what: str, op: Callable[[], object]) -> bool:
    try:
        op()
        return True
    except VrlError as exc:
        assert "\n" not in str(exc).strip(), f"{what}: a multi-line error: {exc}"
        return False


class HostilePacks:
    @pytest.fixture
    def remote(self) -> RemoteCase:  # pragma: no cover - each backend provides it
        raise NotImplementedError

    examples = EXAMPLES

    def test_hostile_pack(self, tmp_path: Path, remote: RemoteCase) -> None:
        self._run(tmp_path, remote, None)

    def test_each_attack_is_refused(self, tmp_path: Path, remote: RemoteCase) -> None:
        """Deterministic cases with teeth: each attack, so placed, must be refused."""
        self._run(tmp_path, remote, [make_attack(m, *args) for m, args in REFUSED.items()])

    def _run(self, tmp_path: Path, remote: RemoteCase, fixed: list[Attack] | None) -> None:
        import torch

        src = Repo.init(tmp_path / "src")
        add_remote(src, "origin", remote.url, remote.options, create=True)
        state = {"a": torch.arange(16.0), "b": torch.arange(3), "c": torch.ones(40, 40)}
        for i in range(4):
            state = {**state, "a": state["a"] + 1, "c": state["c"] * 2}
            src.commit(state, message=f"c{i}", env=False, step=i)
            if i == 1:
                push(src, open_named(src, "origin"), "origin")
                clone(remote.url, tmp_path / "dst", options=remote.options)
        store: RemoteStore = open_named(src, "origin")
        push(src, store, "origin")
        dst = Repo(tmp_path / "dst")
        packs = RemotePacks(store).load()
        (key,) = [k for k, entries in packs.entries.items()
                  if not all(dst.objects.has(o) for o in entries)]
        pristine = store.get(key)
        entries = sorted((bytes.fromhex(o), off, n) for o, (off, n) in packs.entries[key].items())

        def trial(attack: Attack, must_refuse: bool = False) -> None:
            name, data = attack(pristine, entries)
            target = key if name is None else pack_key(name)
            store.delete(key)
            store.put(target, data)
            work = tmp_path / f"w-{uuid.uuid4().hex[:8]}"
            peak = _vm_peak()
            try:
                full = work / "full"
                if ok_or_clean("clone", lambda: clone(remote.url, full, options=remote.options)):
                    assert not must_refuse, f"{attack.__name__} was not refused"
                    assert Repo(full).fsck()["ok"]
                else:
                    assert not full.exists(), "a failed clone left its directory behind"
                lazy = work / "lazy"
                if ok_or_clean("lazy clone", lambda: clone(remote.url, lazy, metadata_only=True,
                                                           options=remote.options)):
                    repo = Repo(lazy)
                    for oid in dict.fromkeys(repo.refs.list().values()):
                        ok_or_clean("lazy load", lambda o=oid: repo.load(o))
                    assert Repo(lazy).fsck()["ok"]
                old = work / "old"
                shutil.copytree(tmp_path / "dst", old, symlinks=True)
                repo = Repo(old)
                refs = repo.refs.list()
                if not ok_or_clean("fetch", lambda: fetch(repo, open_named(repo, "origin"),
                                                          "origin")):
                    assert repo.refs.list() == refs, "a failed fetch moved refs"
                ok_or_clean("pull", lambda: pull(repo, open_named(repo, "origin"), "origin"))
                assert Repo(old).fsck()["ok"]
            finally:
                store.delete(target)
                store.put(key, pristine)
                shutil.rmtree(work, ignore_errors=True)
            grown = _vm_peak() - peak
            assert grown < MEMORY_SLACK, f"peak memory grew by {grown >> 20} MiB"

        if fixed is not None:
            for attack in fixed:
                trial(attack, must_refuse=True)
            return
        @settings(max_examples=self.examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(attack=attacks())
        def generated(attack: Attack) -> None:
            trial(attack)

        generated()


class TestHostilePacksLocal(HostilePacks):
    @pytest.fixture
    def remote(self, tmp_path):
        return RemoteCase(str(tmp_path / "remote.vrl"))


class TestHostilePacksMemory(HostilePacks):
    @pytest.fixture
    def remote(self):
        return memory_case()


class TestHostilePacksS3(HostilePacks):
    examples = EXAMPLES // 3  # each trial costs seconds against moto

    @pytest.fixture
    def remote(self, s3):
        return s3_case(s3)


class TestHostilePacksSsh(HostilePacks):
    examples = EXAMPLES // 3

    @pytest.fixture
    def remote(self, ssh):
        return ssh_case(ssh)


class TestHostilePacksGcs(HostilePacks):
    examples = EXAMPLES // 3

    @pytest.fixture
    def remote(self, gcs):
        return gcs_case(gcs)


class TestHostilePacksAzure(HostilePacks):
    examples = EXAMPLES // 3

    @pytest.fixture
    def remote(self, azurite):
        return azure_case(azurite)
