"""Object stores (S3, GCS, Azure) write objects and packs in place: an upload is atomic
there, and a temp name + rename would be a copy and a delete per object."""

import pytest

from vrl.remote import add_remote, clone, open_named, push
from vrl.repo import Repo
from vrl.testing.remote_conformance import azure_case, gcs_case, make_big_history, s3_case


@pytest.fixture(params=["s3", "gs", "az"])
def case(request):
    if request.param == "s3":
        return s3_case(request.getfixturevalue("s3"))
    if request.param == "gs":
        return gcs_case(request.getfixturevalue("gcs"))
    return azure_case(request.getfixturevalue("azurite"))


def test_push_writes_objects_in_place_without_renames(tmp_path, case):
    repo = Repo.init(tmp_path / "src")
    add_remote(repo, "origin", case.url, case.options, create=True)
    make_big_history(repo, 2)  # big tensors (put_file, loose) and a pack (put)
    store = open_named(repo, "origin")
    written: list[str] = []

    def refuse(*args, **kwargs):
        raise AssertionError(f"renamed or copied on an object store: {args}")

    for name in ("mv", "copy", "cp_file"):
        setattr(store.fs, name, refuse)
    def recording(real, where: int):
        def call(*args, **kwargs):
            written.append(str(args[where]))  # the remote path
            return real(*args, **kwargs)
        return call

    store.fs.pipe_file = recording(store.fs.pipe_file, 0)  # (path, data)
    store.fs.put_file = recording(store.fs.put_file, 1)  # (local, path)
    push(repo, store, "origin")
    assert written and not any("/.tmp-" in str(p) for p in written), written
    assert any("/objects/pack/pack-" in str(p) for p in written)
    assert not [k for k in store.list("") if ".tmp-" in k]
    dst = clone(case.url, tmp_path / "dst", options=case.options)
    assert dst.head() == repo.head() and dst.fsck()["ok"]
