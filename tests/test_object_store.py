"""The object-store contract, run against the file store and its in-memory twin."""

import pytest

from vrl.errors import CorruptObjectError, ObjectNotFoundError
from vrl.object_store import FileObjectStore, MemoryObjectStore
from vrl.objects import hash_object


@pytest.fixture(params=["file", "memory"])
def store(request, tmp_path):
    return FileObjectStore(tmp_path / "objects") if request.param == "file" \
        else MemoryObjectStore()


def test_write_read_has_ids_delete(store):
    a = store.write("tensor", b"abc")
    b = store.write("manifest", b'{"x":1}')
    assert a == hash_object("tensor", b"abc")
    assert store.write("tensor", b"abc") == a  # idempotent
    assert store.has(a) and store.read(a) == ("tensor", b"abc")
    assert store.read(b) == ("manifest", b'{"x":1}')
    assert sorted(store.ids()) == sorted([a, b])
    store.sync()
    store.delete(a)
    assert not store.has(a) and list(store.ids()) == [b]
    with pytest.raises(ObjectNotFoundError):
        store.read(a)


def test_verify_detects_bytes_that_do_not_match_the_id(store):
    oid = store.write("tensor", b"payload")
    assert store.verify(oid) == "tensor"
    if isinstance(store, MemoryObjectStore):
        store.objects[oid] = ("tensor", b"tampered")
    else:
        path = store.path(oid)
        path.chmod(0o644)
        data = bytearray(path.read_bytes())
        data[-1] ^= 1
        path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError):
        store.verify(oid)


def test_batched_writes_are_all_in_place_after_the_batch(tmp_path):
    store = FileObjectStore(tmp_path / "objects", fsync=True)
    with store.batch():
        ids = [store.write("tensor", bytes([i]) * 1000) for i in range(20)]
    assert all(store.has(i) for i in ids)
    assert not list(store.temp_files())
