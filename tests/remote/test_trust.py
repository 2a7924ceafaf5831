"""Issue 9 items 6 and 8: hostile manifests and remote data, and mistyped remotes."""

import os

import pytest
import torch
from helpers import vrl

from vrl import Repo
from vrl.errors import CorruptObjectError
from vrl.objects import ITEMSIZE, Commit, Manifest, TensorEntry, canonical_json, itemsize
from vrl.remote import add_remote, clone, fetch, open_named, push
from vrl.remote.base import object_key
from vrl.remote.errors import RemoteError
from vrl.testing.remote_conformance import make_history


def manifest_bytes(entry: dict) -> bytes:
    return canonical_json({"format": 1, "tensors": {"w": entry}, "tree": {"$t": "w"}})


# ------------------------------------------------------------------ manifests (item 6)

@pytest.mark.filterwarnings("ignore:ComplexHalf")
def test_itemsize_table_matches_torch_for_every_dtype():
    """Every dtype a dense tensor can have (not quantized, not sub-byte bit types) is in
    the torch-free table with torch's own element size."""
    import re

    checked = 0
    for dtype in {d for d in vars(torch).values() if isinstance(d, torch.dtype)}:
        name = str(dtype).removeprefix("torch.")
        if name.startswith(("q", "bits")) or re.fullmatch(r"u?int[1-7]", name):
            continue
        assert itemsize(name) == torch.empty(0, dtype=dtype).element_size(), name
        checked += 1
    assert checked == len(ITEMSIZE)
    assert itemsize("numpy:<f8") == 8 and itemsize("numpy:|b1") == 1
    for bad in ("numpy:O", "float99", "numpy:[('a', 'O')]", 7):
        with pytest.raises(CorruptObjectError):
            itemsize(bad)


@pytest.mark.parametrize("entry, why", [
    ({"id": "a" * 64, "dtype": "float32", "shape": [2**28], "nbytes": 0}, "inconsistent"),
    ({"id": "a" * 64, "dtype": "float32", "shape": [4], "nbytes": 15}, "inconsistent"),
    ({"id": "a" * 64, "dtype": "float32", "shape": [-4, -1], "nbytes": 16}, "invalid shape"),
    ({"id": "a" * 64, "dtype": "float32", "shape": [True], "nbytes": 4}, "invalid shape"),
    ({"id": "a" * 64, "dtype": "float32", "shape": "abcd", "nbytes": 16}, "invalid shape"),
    ({"id": "../../etc/passwd", "dtype": "float32", "shape": [], "nbytes": 4}, "not an object"),
    ({"id": "a" * 64, "dtype": "numpy:O", "shape": [1], "nbytes": 8}, "Python objects"),
    ({"id": "a" * 64, "dtype": "float32", "shape": [1], "nbytes": 4, "tie": "nope"}, "tied"),
    ({"id": "a" * 64, "dtype": "float32", "shape": [1] * 100, "nbytes": 4}, "invalid shape"),
])
def test_inconsistent_manifest_entries_are_refused(entry, why):
    with pytest.raises(CorruptObjectError, match=why):
        Manifest.from_bytes(manifest_bytes(entry))


def test_consistent_manifest_entries_pass():
    for dtype, shape, nbytes in (("bfloat16", [3, 5], 30), ("bool", [0, 7], 0),
                                 ("float64", [], 8), ("numpy:<i4", [2, 2], 16)):
        m = Manifest.from_bytes(manifest_bytes({"id": "a" * 64, "dtype": dtype,
                                                "shape": shape, "nbytes": nbytes}))
        assert m.tensors["w"].nbytes == nbytes


def test_load_entry_checks_the_object_size(repo):
    oid = repo.objects.write("tensor", b"\0" * 16)
    assert repo.load_entry(TensorEntry(oid, "float32", (4,), 16)).shape == (4,)
    # entries made in memory (not parsed) are checked too: no 1 GiB for an empty object
    empty = repo.objects.write("tensor", b"")
    with pytest.raises(CorruptObjectError, match="inconsistent"):
        repo.load_entry(TensorEntry(empty, "float32", (2**28,), 0))
    with pytest.raises(CorruptObjectError, match="not the 64-byte tensor"):
        repo.load_entry(TensorEntry(oid, "float32", (16,), 64))


def test_fsck_reports_a_bomb_manifest(repo):
    empty = repo.objects.write("tensor", b"")
    mid = repo.objects.write("manifest", manifest_bytes(
        {"id": empty, "dtype": "float32", "shape": [2**28], "nbytes": 0}))
    cid = repo.objects.write("commit", Commit(mid, (), "bomb", "x", "2026-01-01T00:00:00Z")
                             .to_bytes())
    repo.refs.update("refs/heads/main", cid)
    report = repo.fsck()
    assert not report["ok"]
    assert any("inconsistent" in p for p in report["problems"]), report


def _bomb_remote(tmp_path):
    """A remote whose only commit names an empty tensor as a 1 GiB one."""
    src = Repo.init(tmp_path / "src")
    add_remote(src, "origin", str(tmp_path / "r.vrl"), create=True)
    src.commit({"w": torch.zeros(0)}, env=False)
    store = open_named(src, "origin")
    push(src, store, "origin")
    empty = src.read_manifest(src.read_commit(src.head()).manifest).tensors["w"].id
    raw = manifest_bytes({"id": empty, "dtype": "float32", "shape": [2**28], "nbytes": 0})
    from vrl.objects import hash_object, header

    mid = hash_object("manifest", raw)
    store.put(object_key(mid), header("manifest", len(raw)) + raw)
    commit = Commit(mid, (), "bomb", "x", "2026-01-01T00:00:00Z").to_bytes()
    cid = hash_object("commit", commit)
    store.put(object_key(cid), header("commit", len(commit)) + commit)
    store.cas_ref("refs/heads/main", cid, store.read_ref("refs/heads/main")[1])
    return tmp_path / "r.vrl"


def test_bomb_manifest_from_a_remote_fails_cleanly(tmp_path, ws, capsys):
    url = _bomb_remote(tmp_path)
    code, out, err = vrl(capsys, "clone", str(url), "d")
    assert code == 1 and "inconsistent" in err and err.count("\n") == 1, err
    assert not (ws / "d").exists()
    dst = Repo.init(tmp_path / "dst")
    add_remote(dst, "origin", str(url))
    before = set(dst.objects.ids())
    with pytest.raises(CorruptObjectError, match="inconsistent"):
        fetch(dst, open_named(dst, "origin"), "origin")
    assert set(dst.objects.ids()) == before and dst.refs.list() == {}
    assert dst.fsck()["ok"]


# ------------------------------------------------------------------ remote refs (item 6)

def test_huge_remote_ref_is_refused_in_one_short_line(tmp_path, ws, capsys):
    src = Repo.init(tmp_path / "src")
    add_remote(src, "origin", str(tmp_path / "r.vrl"), create=True)
    make_history(src, 1)
    push(src, open_named(src, "origin"), "origin")
    (tmp_path / "r.vrl" / "refs" / "heads" / "big").write_bytes(b"Z" * 5_000_000)
    code, out, err = vrl(capsys, "clone", str(tmp_path / "r.vrl"), "d")
    assert code == 1 and len(err) < 400 and "ZZZZ" not in err and "too large" in err, err
    assert not (ws / "d").exists()


def test_symlinked_remote_ref_is_never_followed_nor_printed(tmp_path, ws, capsys):
    src = Repo.init(tmp_path / "src")
    add_remote(src, "origin", str(tmp_path / "r.vrl"), create=True)
    make_history(src, 1)
    push(src, open_named(src, "origin"), "origin")
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY----- TOPSECRET\n")
    os.symlink(secret, tmp_path / "r.vrl" / "refs" / "heads" / "leak")
    code, out, err = vrl(capsys, "clone", str(tmp_path / "r.vrl"), "d")
    assert code == 1 and "TOPSECRET" not in out + err and "symbolic link" in err, err
    assert not (ws / "d").exists()


def test_symlinked_objects_dir_is_never_written_through(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    src = Repo.init(tmp_path / "src")
    add_remote(src, "origin", str(tmp_path / "r.vrl"), create=True)
    (tmp_path / "r.vrl" / "objects").symlink_to(outside)
    make_history(src, 1)
    with pytest.raises(RemoteError, match="symbolic link"):
        push(src, open_named(src, "origin"), "origin")
    assert list(outside.rglob("*")) == []


# ------------------------------------------------------------------ mistyped remotes (item 8)

def _commit(ws, capsys):
    vrl(capsys, "init")
    from vrl.workspace import write_checkpoint

    write_checkpoint(torch.nn.Linear(2, 2).state_dict(), "policy.safetensors")
    assert vrl(capsys, "commit", "-m", "one", "--no-env")[0] == 0


def test_push_to_a_missing_path_needs_create(ws, capsys):
    (ws / "a").mkdir()
    os.chdir(ws / "a")
    _commit(ws, capsys)
    vrl(capsys, "remote", "add", "origin", str(ws / "typo.vrl"))
    code, out, err = vrl(capsys, "push")
    assert code == 1 and "--create" in err and "typo.vrl" in err
    assert not (ws / "typo.vrl").exists()
    code, out, err = vrl(capsys, "push", "--create")
    assert code == 0 and "(new)" in out, err
    vrl(capsys, "remote", "add", "second", str(ws / "second.vrl"), "--create")
    assert (ws / "second.vrl" / "HEAD").read_text() == "ref: refs/heads/main\n"
    code, out, err = vrl(capsys, "push", "second")
    assert code == 0, err
    # a directory the user made (empty) is accepted as a new remote
    (ws / "made").mkdir()
    vrl(capsys, "remote", "add", "made", str(ws / "made"))
    assert vrl(capsys, "push", "made")[0] == 0
    # a directory holding other files is never turned into a remote
    (ws / "docs").mkdir()
    (ws / "docs" / "notes.txt").write_text("mine")
    vrl(capsys, "remote", "add", "docs", str(ws / "docs"))
    code, out, err = vrl(capsys, "push", "docs", "--create")
    assert code == 1 and "not a vrl remote" in err
    assert sorted(p.name for p in (ws / "docs").iterdir()) == ["notes.txt"]


def test_clone_of_a_missing_or_ordinary_directory_fails(ws, capsys):
    code, out, err = vrl(capsys, "clone", str(ws / "missing" / "path"), "d")
    assert code == 1 and "cannot clone" in err and "nothing" in err, err
    assert not (ws / "d").exists()
    (ws / "plain").mkdir()
    (ws / "plain" / "file.txt").write_text("x")
    code, out, err = vrl(capsys, "clone", str(ws / "plain"), "d")
    assert code == 1 and "not a vrl remote" in err, err
    assert not (ws / "d").exists()
    (ws / "empty").mkdir()
    code, out, err = vrl(capsys, "clone", str(ws / "empty"), "d")
    assert code == 1 and "empty directory" in err, err
    assert not (ws / "d").exists()


def test_clone_of_a_repository_workspace(ws, capsys):
    (ws / "a").mkdir()
    os.chdir(ws / "a")
    _commit(ws, capsys)
    os.chdir(ws)
    code, out, err = vrl(capsys, "clone", "a", "b")
    assert code == 0, err
    assert Repo(ws / "b").head() == Repo(ws / "a").head()
    assert clone(str(ws / "a"), ws / "c").fsck()["ok"]


def test_on_demand_fetch_refuses_a_tensor_of_the_wrong_size(tmp_path):
    """A metadata-only clone cannot check tensor sizes up front; the on-demand fetch must
    refuse an object that is not what its manifest says before writing it."""
    src = Repo.init(tmp_path / "src")
    add_remote(src, "origin", str(tmp_path / "r.vrl"), create=True)
    src.commit({"w": torch.zeros(3)}, env=False)
    store = open_named(src, "origin")
    push(src, store, "origin")
    real = src.read_manifest(src.read_commit(src.head()).manifest).tensors["w"].id
    from vrl.objects import hash_object, header

    raw = manifest_bytes({"id": real, "dtype": "float64", "shape": [0], "nbytes": 0})
    mid = hash_object("manifest", raw)
    store.put(object_key(mid), header("manifest", len(raw)) + raw)
    commit = Commit(mid, (src.head(),), "lies", "x", "2026-01-01T00:00:00Z").to_bytes()
    cid = hash_object("commit", commit)
    store.put(object_key(cid), header("commit", len(commit)) + commit)
    store.cas_ref("refs/heads/main", cid, store.read_ref("refs/heads/main")[1])
    lazy = clone(str(tmp_path / "r.vrl"), tmp_path / "lazy", metadata_only=True)
    with pytest.raises(CorruptObjectError, match="12 bytes but its manifest says 0"):
        lazy.load(cid)
    assert not lazy.objects.has(real)
    assert lazy.fsck()["ok"]


def test_tied_tensor_sorting_before_its_target_loads(repo):
    """Manifests are stored with sorted names: a tie ("a" -> "z") may come first."""
    shared = torch.arange(3.0)
    oid = repo.commit({"z": shared, "a": shared}, env=False)
    state = Repo(repo.workdir).load(oid)  # a fresh process reads the sorted manifest
    assert torch.equal(state["a"], shared) and state["a"].data_ptr() == state["z"].data_ptr()
