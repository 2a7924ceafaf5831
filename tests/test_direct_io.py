"""Big objects written with O_DIRECT (`FileObjectStore.direct`, on in the Snapshotter's
committer): the bytes on disk are exactly the object, whatever part of it went around the
page cache, and every case the kernel or the layout does not allow falls back to the usual
write."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil
import subprocess

import pytest
import torch

from vrl.direct_io import DIRECT_ALIGN, DIRECT_MIN, direct_offset
from vrl.errors import StorageError
from vrl.hooks import Snapshotter
from vrl.object_store import FileObjectStore
from vrl.objects import HEADER_SIZE, hash_object

SIZES = [DIRECT_MIN, DIRECT_MIN + 1, 3 * DIRECT_ALIGN * 256 + DIRECT_ALIGN - HEADER_SIZE,
         5_000_003]


def laid_out(sizes: list[int], shift: int = 0) -> tuple[mmap.mmap, list[memoryview]]:
    """Random payloads at `direct_offset`s (plus `shift`) of one anonymous mapping."""
    region = mmap.mmap(-1, sum(sizes) + len(sizes) * 2 * DIRECT_ALIGN)
    views, offset = [], 0
    for size in sizes:
        offset = direct_offset(offset) + shift
        region[offset:offset + size] = os.urandom(size)
        views.append(memoryview(region)[offset:offset + size])
        offset += size
    return region, views


def direct_store(root) -> FileObjectStore:
    store = FileObjectStore(root)
    store.direct = True
    return store


@pytest.fixture
def o_direct(tmp_path):
    """Skip where the test folder's file system refuses O_DIRECT (the store then writes
    as usual: the fallback tests cover that)."""
    fd = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system has no O_DIRECT")
    finally:
        os.close(fd)
        os.unlink(tmp_path / "probe")


def store_all(store: FileObjectStore, views: list[memoryview]) -> list[str]:
    ids = [hash_object("tensor", view) for view in views]
    with store.batch():
        for oid, view in zip(ids, views, strict=True):
            store.put("tensor", view, oid)
    store.sync()
    return ids


def assert_exact(root, ids: list[str], views: list[memoryview]) -> None:
    fresh = FileObjectStore(root)
    for oid, view in zip(ids, views, strict=True):
        assert fresh.read(oid) == ("tensor", bytes(view))
        assert fresh.verify(oid) == "tensor"
        loose = fresh.loose_path(oid)
        if view.nbytes >= DIRECT_MIN:
            assert os.path.getsize(loose) == HEADER_SIZE + view.nbytes
    assert not list(fresh.temp_files())


def resident_bytes(path) -> int | None:
    """Bytes of `path` in the page cache (`fincore`), None where that cannot be told: no
    fincore, or a file system whose files live in memory."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True,
                          text=True).stdout.strip()
    if shutil.which("fincore") is None or kind in ("tmpfs", "ramfs"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES",
                          str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_direct_writes_are_bit_exact_and_leave_the_page_cache_alone(tmp_path, o_direct):
    region, views = laid_out(SIZES)
    store = direct_store(tmp_path / "objects")
    ids = store_all(store, views)
    assert store.direct_writes == len(SIZES)
    for oid in ids:  # (before anything reads them back)
        resident = resident_bytes(store.loose_path(oid))
        if resident is not None:  # the first block and the tail at most
            assert resident <= 2 * DIRECT_ALIGN, resident
    assert_exact(tmp_path / "objects", ids, views)


def test_the_usual_write_is_the_same_bytes(tmp_path):
    """Without `direct` the same objects go through the page cache, byte for byte the same
    files (the direct write is an implementation detail of how, never of what)."""
    region, views = laid_out(SIZES)
    direct = direct_store(tmp_path / "a")
    usual = FileObjectStore(tmp_path / "b")
    ids = store_all(direct, views)
    assert store_all(usual, views) == ids and usual.direct_writes == 0
    for oid in ids:
        with open(direct.loose_path(oid), "rb") as a, open(usual.loose_path(oid), "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("shift,sizes", [(8, SIZES[:2]), (0, [DIRECT_MIN - 1, 1000])],
                         ids=["misaligned", "small"])
def test_misaligned_or_small_payloads_are_written_as_usual(tmp_path, shift, sizes):
    region, views = laid_out(sizes, shift)
    store = direct_store(tmp_path / "objects")
    ids = store_all(store, views)
    assert store.direct_writes == 0
    assert_exact(tmp_path / "objects", ids, views)


def test_a_file_system_without_o_direct_gets_the_usual_write(tmp_path, monkeypatch):
    real = fcntl.fcntl

    def refuse(fd, cmd, arg=0):
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", refuse)
    region, views = laid_out(SIZES[:2])
    store = direct_store(tmp_path / "objects")
    ids = store_all(store, views)
    assert store.direct_writes == 0
    assert_exact(tmp_path / "objects", ids, views)


def _direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)


def test_a_device_that_refuses_the_alignment_midway_gets_the_rest_as_usual(
        tmp_path, monkeypatch, o_direct):
    """A short direct write, then EINVAL (a device wanting another alignment): the rest of
    the object goes through the page cache, and the file is still exactly the object."""
    real, calls = os.pwrite, []

    def pwrite(fd, data, offset):
        if not _direct(fd):
            return real(fd, data, offset)
        calls.append(offset)
        if offset != DIRECT_ALIGN:  # (each object's second direct write)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, memoryview(data)[:3 * DIRECT_ALIGN], offset)  # short, aligned

    monkeypatch.setattr(os, "pwrite", pwrite)
    region, views = laid_out(SIZES)
    store = direct_store(tmp_path / "objects")
    ids = store_all(store, views)
    assert store.direct_writes == len(SIZES) and len(calls) == 2 * len(SIZES)
    assert_exact(tmp_path / "objects", ids, views)


def test_a_full_disk_during_a_direct_write_fails_cleanly(tmp_path, o_direct, monkeypatch):
    real = os.pwrite

    def pwrite(fd, data, offset):
        if _direct(fd):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    region, views = laid_out(SIZES[:1])
    store = direct_store(tmp_path / "objects")
    with pytest.raises(StorageError, match="disk full"):
        store_all(store, views)
    monkeypatch.setattr(os, "pwrite", real)
    fresh = FileObjectStore(tmp_path / "objects")
    assert not fresh.has(hash_object("tensor", views[0]))
    assert not list(fresh.temp_files())


def test_the_committer_writes_big_tensors_around_the_page_cache(repo, o_direct):
    """The Snapshotter lays its shared memory out for direct writes and its committer
    process uses them: every snapshot loads back bit-exactly, and right after it the big
    tensors' objects are not in the page cache (a buffered write would leave them there)."""
    state = {"big": torch.randn(300_001), "wide": torch.randn(400_000, dtype=torch.float64),
             "small": torch.randn(33)}
    expected = []
    with Snapshotter(repo, state, include_rng=False, committer="process") as snap:
        for i in range(3):
            with torch.no_grad():
                state["big"][i * 7] += 1.0
                state["small"].mul_(2.0)
            snap.step(i)
            expected.append({k: v.clone() for k, v in state.items()})
    commits = snap.commits
    assert len(commits) == 3
    manifest = repo.read_manifest(repo.read_commit(commits[-1]).manifest)
    sizes = []
    for name in ("big", "wide"):
        path = repo.objects.loose_path(manifest.tensors[f"model/{name}"].id)
        resident = resident_bytes(path)
        sizes.append(resident)
    if None not in sizes:  # (before anything reads them back)
        assert max(sizes) <= 2 * DIRECT_ALIGN, sizes
    for cid, want in zip(commits, expected, strict=True):
        got = repo.load(cid)
        for name, tensor in want.items():
            assert torch.equal(got["model"][name], tensor)
            assert got["model"][name].dtype == tensor.dtype


def test_the_committer_keeps_a_reused_region_mapped():
    """A region the trainer sends again (a new descriptor of the same memfd) is the same
    mapping, which sees what the trainer wrote since; beyond KEEP regions the oldest
    mapping is closed."""
    from vrl.committer import _Regions

    regions, fds = _Regions(), []

    def sent(fd: int) -> mmap.mmap:  # (what the committer does with a job's descriptor)
        dup = os.dup(fd)
        try:
            return regions.map(dup)
        finally:
            os.close(dup)

    for _ in range(_Regions.KEEP + 1):
        fd = os.memfd_create("test-region")
        os.ftruncate(fd, 3 * mmap.PAGESIZE)
        fds.append(fd)
    try:
        first = sent(fds[0])
        os.pwrite(fds[0], b"trainer wrote this", 100)
        again = sent(fds[0])
        assert again is first and again[100:118] == b"trainer wrote this"
        others = [sent(fd) for fd in fds[1:]]
        assert first.closed and not any(m.closed for m in others)
        assert sent(fds[0]) is not first  # mapped anew
    finally:
        for fd in fds:
            os.close(fd)
