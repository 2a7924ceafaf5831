"""The object-store contract, run against the file store (loose and packed objects) and its
in-memory twin."""

import contextlib
import os

import pytest

from vrl.errors import CorruptObjectError, ObjectNotFoundError
from vrl.object_store import FileObjectStore, MemoryObjectStore
from vrl.objects import HEADER_SIZE, hash_object, header
from vrl.pack_set import PACK_MAX


@pytest.fixture(params=["loose", "packed", "memory"])
def store(request, tmp_path):
    if request.param == "memory":
        return MemoryObjectStore()
    store = FileObjectStore(tmp_path / "objects")
    store.test_packed = request.param == "packed"
    return store


def write_all(store, *objects):
    """Write (kind, payload) pairs: one batch (so one pack) for the packed variant."""
    packed = getattr(store, "test_packed", False)
    with store.batch() if packed else contextlib.nullcontext():
        ids = [store.write(kind, payload) for kind, payload in objects]
    if packed:
        assert all(store.loose_path(oid) is None for oid in ids)
        assert len(store.packs()) == 1
    return ids


def tamper(store, oid, payload_offset=-1):
    """Flip one payload byte of a stored object, wherever it lives."""
    if isinstance(store, MemoryObjectStore):
        kind, payload = store.objects[oid]
        data = bytearray(payload)
        data[payload_offset] ^= 1
        store.objects[oid] = (kind, bytes(data))
        return
    path, offset, length = store.locate(oid)
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[offset + (length + payload_offset if payload_offset < 0
                   else HEADER_SIZE + payload_offset)] ^= 1
    path.write_bytes(bytes(data))


def test_write_read_has_ids_delete(store):
    a, b = write_all(store, ("tensor", b"abc"), ("manifest", b'{"x":1}'))
    assert a == hash_object("tensor", b"abc")
    assert store.write("tensor", b"abc") == a  # idempotent
    assert store.has(a) and store.read(a) == ("tensor", b"abc")
    assert store.read(b) == ("manifest", b'{"x":1}')
    assert store.kind_and_size(b) == ("manifest", 7)
    assert store.read_raw(a) == header("tensor", 3) + b"abc"
    assert sorted(store.ids()) == sorted([a, b])
    assert store.ids_with_prefix(a[:5]) == [a]
    store.sync()
    store.delete(a)
    assert not store.has(a) and list(store.ids()) == [b]
    assert store.read(b) == ("manifest", b'{"x":1}')
    with pytest.raises(ObjectNotFoundError):
        store.read(a)


def test_delete_many_reports_count_and_bytes(store):
    ids = write_all(store, *[("tensor", bytes([i]) * 10) for i in range(4)])
    assert store.delete_many(ids[:2], dry_run=True) == (2, 2 * (HEADER_SIZE + 10))
    assert all(store.has(i) for i in ids)
    assert store.delete_many(ids[:2] + ["f" * 64]) == (2, 2 * (HEADER_SIZE + 10))
    assert [store.has(i) for i in ids] == [False, False, True, True]
    assert store.read(ids[3]) == ("tensor", bytes([3]) * 10)


def test_verify_detects_bytes_that_do_not_match_the_id(store):
    oid, other = write_all(store, ("tensor", b"payload"), ("tensor", b"other"))
    assert store.verify(oid) == "tensor"
    tamper(store, oid)
    with pytest.raises(CorruptObjectError):
        store.verify(oid)
    assert store.verify(other) == "tensor"  # its neighbour in the pack is unharmed


def test_batched_writes_are_all_in_place_after_the_batch(tmp_path):
    store = FileObjectStore(tmp_path / "objects", fsync=True)
    with store.batch():
        ids = [store.write("tensor", bytes([i]) * 1000) for i in range(20)]
        big = store.write("tensor", b"x" * PACK_MAX)
        assert all(store.has(i) for i in ids)  # staged objects are visible at once
        assert store.read(ids[3]) == ("tensor", bytes([3]) * 1000)
    assert all(store.has(i) for i in ids)
    assert not list(store.temp_files())
    assert len(store.packs()) == 1 and store.loose_path(big) is not None
    # another process (a fresh store) sees the pack
    fresh = FileObjectStore(tmp_path / "objects")
    assert sorted(fresh.ids()) == sorted([*ids, big])
    assert fresh.read(ids[5]) == ("tensor", bytes([5]) * 1000)


def test_a_failed_batch_leaves_no_pack(tmp_path):
    store = FileObjectStore(tmp_path / "objects")
    with pytest.raises(RuntimeError), store.batch():
        oid = store.write("tensor", b"abc")
        store.write("tensor", b"def")
        raise RuntimeError
    assert not store.has(oid) and store.packs() == []


def test_touch_and_mtime_of_packed_objects(tmp_path):
    store = FileObjectStore(tmp_path / "objects", fresh_for=1e12)  # any pack is fresh
    a, b = write_all_packed(store)
    path = store.locate(a)[0]
    os.utime(path, (1, 1))
    assert store.mtime(a) == 1 and store.mtime(b) == 1
    assert store.touch(a) and store.mtime(b) > 1  # the pack is freshened as a whole
    assert not store.touch(hash_object("tensor", b"absent"))


def write_all_packed(store):
    with store.batch():
        return [store.write("tensor", b"a"), store.write("tensor", b"b")]


def test_a_batch_beyond_the_spill_size_writes_several_packs(tmp_path, monkeypatch):
    """Staged objects are not all held in memory: past PACK_SPILL bytes they are written
    as a pack at once, and stay readable (in the batch and after it)."""
    import vrl.pack_set

    monkeypatch.setattr(vrl.pack_set, "PACK_SPILL", 10_000)
    store = FileObjectStore(tmp_path / "objects", fsync=True)
    with store.batch():
        ids = [store.write("tensor", bytes([i]) * 3000) for i in range(10)]
        assert len(store.packs()) >= 2  # spilled while the batch is open
        assert all(store.read(oid) == ("tensor", bytes([i]) * 3000)
                   for i, oid in enumerate(ids))
    # 3 objects of ~3 KiB per 10 KB pack; the tenth, alone, is cheaper as a loose file
    assert len(store.packs()) == 3 and store.loose_path(ids[-1]) is not None
    fresh = FileObjectStore(tmp_path / "objects")
    assert sorted(fresh.ids()) == sorted(ids)
    assert all(fresh.verify(oid) == "tensor" for oid in ids)


def test_a_big_object_is_written_while_the_next_is_hashed(tmp_path, monkeypatch):
    """Inside a batch a big object's bytes go to disk on a worker thread (the caller moves
    on to hash the next one); it is readable at once, and in place after the batch."""
    import threading

    import vrl.direct_io

    writers: list[str] = []
    real = vrl.direct_io.write_all

    def write_all(fd, data):
        writers.append(threading.current_thread().name)
        real(fd, data)

    monkeypatch.setattr(vrl.direct_io, "write_all", write_all)
    store = FileObjectStore(tmp_path / "objects", fsync=True)
    payload = os.urandom(PACK_MAX + 7)
    with store.batch():
        big = store.write("tensor", payload)
        assert store.read(big) == ("tensor", payload)  # waits for it if need be
    assert writers and all(name.startswith("vrl-fsync") for name in writers)
    assert store.loose_path(big) is not None and not list(store.temp_files())
    assert FileObjectStore(tmp_path / "objects").read(big) == ("tensor", payload)
