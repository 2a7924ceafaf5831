"""Push never spreads damage, and a damaged remote can be found and repaired.

`push` hashes every object it sends and refuses a damaged one, naming it, before the
remote's ref moves; `vrl fsck --remote NAME` (vrl.remote.check.check_remote) reads back
every object the remote's refs reach; `vrl push --repair` re-sends what is missing or
damaged there from a verified local copy. Each against a local-path and an S3 remote.
"""

import os
import subprocess
import sys

import pytest
from helpers import edit_object, vrl

from vrl.errors import CorruptObjectError, VrlError
from vrl.objects import HEADER_SIZE
from vrl.remote import add_remote, clone, open_named, push
from vrl.remote.base import KeyMissing, object_key
from vrl.repo import Repo
from vrl.testing.remote_conformance import (
    RemoteCase,
    assert_bit_exact,
    flip_remote_byte,
    make_big_history,
    remote_object,
    s3_case,
)


@pytest.fixture(params=["local", "s3"])
def case(request, tmp_path) -> RemoteCase:
    if request.param == "local":
        return RemoteCase(str(tmp_path / "remote.vrl"))
    return s3_case(request.getfixturevalue("s3"))


def _repo(tmp_path, case: RemoteCase, commits: int = 2) -> Repo:
    repo = Repo.init(tmp_path / "repo")
    make_big_history(repo, commits)
    add_remote(repo, "origin", case.url, case.options, create=True)
    return repo


def _objects(repo: Repo, rev: str = "HEAD") -> dict[str, str]:
    """The objects of `rev`'s snapshot by role: commit, manifest, a big (loose) tensor and
    the small (packed) one."""
    commit = repo.resolve(rev)
    mid = repo.read_commit(commit).manifest
    tensors = repo.read_manifest(mid).tensors
    return {"commit": commit, "manifest": mid, "big": tensors["big0"].id,
            "small": tensors["small"].id}


def _flip_local(repo: Repo, oid: str) -> None:
    """Flip one payload byte of a local object (inside a JSON string for metadata, so it
    still parses: only the hash can tell)."""
    def edit(raw: bytearray) -> None:
        if raw.startswith(b"vrl1 commit"):
            at = raw.index(b"big ", HEADER_SIZE) + 3  # "big 1" -> "big!1"
        elif raw.startswith(b"vrl1 manifest"):
            at = raw.index(b'{"$t":"small"}', HEADER_SIZE) + 11  # a name in the tree
        else:
            at = HEADER_SIZE + 5
        raw[at] ^= 0x01

    edit_object(repo, oid, edit)


# ------------------------------------------------------------------------------ push refuses


@pytest.mark.parametrize("role", ["big", "small", "manifest", "commit"])
def test_push_refuses_a_damaged_object_and_moves_no_ref(tmp_path, case, role):
    repo = _repo(tmp_path, case)
    oid = _objects(repo)[role]
    good = repo.objects.read_raw(oid)
    _flip_local(repo, oid)
    store = open_named(repo, "origin")
    with pytest.raises(CorruptObjectError) as info:
        push(repo, store, "origin")
    message = str(info.value)
    assert oid[:12] in message and "vrl fsck" in message and "\n" not in message
    assert store.read_ref("refs/heads/main")[0] is None  # the ref did not move
    # nothing damaged was sent: the object is absent there, or there intact
    where = remote_object_or_none(store, oid)
    if where is not None:
        key, offset, length = where
        assert store.get(key)[offset:offset + length] == good
    # restored, the push goes through and a clone is bit-exact
    edit_object(repo, oid, lambda raw: raw.__setitem__(slice(None), good))
    push(repo, store, "origin")
    copy = clone(case.url, tmp_path / "copy", options=case.options)
    assert_bit_exact(repo, copy)


def remote_object_or_none(store, oid):
    try:
        return remote_object(store, oid)
    except KeyMissing:
        return None


def test_cli_push_of_a_damaged_loose_tensor_exits_1_with_one_line(tmp_path, case):
    """The issue's reproduction, through the real `vrl` executable."""
    repo = _repo(tmp_path, case)
    oid = _objects(repo)["big"]
    path = repo.objects.loose_path(oid)
    assert path is not None
    good = path.read_bytes()
    _flip_local(repo, oid)
    env = {**os.environ, **case.env}
    run = subprocess.run([sys.executable, "-m", "vrl", "push", "-q"], cwd=repo.workdir,
                         capture_output=True, text=True, env=env)
    assert run.returncode == 1, run.stdout
    assert run.stderr.count("\n") == 1 and oid[:12] in run.stderr and "vrl fsck" in run.stderr
    assert "Traceback" not in run.stderr
    store = open_named(repo, "origin")
    assert store.read_ref("refs/heads/main")[0] is None
    os.chmod(path, 0o644)
    path.write_bytes(good)
    run = subprocess.run([sys.executable, "-m", "vrl", "push", "-q"], cwd=repo.workdir,
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert store.read_ref("refs/heads/main")[0] == repo.head()


# ------------------------------------------------------------------------------ fsck --remote


def _damage_remote(store, objects: dict[str, str]) -> None:
    """One byte flipped in the big tensor (loose there), the small one and the manifest
    (both in a pack: its index stays valid, only the objects' hashes tell)."""
    flip_remote_byte(store, objects["big"], HEADER_SIZE + 7)
    flip_remote_byte(store, objects["small"], -1)
    flip_remote_byte(store, objects["manifest"], -2)


def test_check_remote_names_every_damaged_object_and_repair_fixes_them(tmp_path, case):
    from vrl.remote.check import check_remote, repair_remote

    repo = _repo(tmp_path, case, commits=3)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    report = check_remote(repo, store, "origin")
    assert report.ok and report.refs == 1 and report.objects >= 3 + 3 + 4
    objects = _objects(repo)
    _damage_remote(store, objects)
    older = _objects(repo, "HEAD~1")["commit"]
    flip_remote_byte(store, older, HEADER_SIZE + 3)
    report = check_remote(repo, store, "origin")
    found = {(p.oid, p.kind) for p in report.problems}
    assert found == {(objects["big"], "tensor"), (objects["small"], "tensor"),
                     (objects["manifest"], "manifest"), (older, "commit")}
    assert not report.ok and not report.unchecked  # walked on through the local copies
    with pytest.raises(VrlError):  # what a clone meets
        clone(case.url, tmp_path / "broken", options=case.options)
    # a plain push sees nothing to do (the ref is where it should be)
    assert push(repo, store, "origin").updates[0].status == "up-to-date"
    fixed = repair_remote(repo, store, "origin")
    assert {p.oid for p in fixed.sent} == {o for o, _ in found} and not fixed.unrepaired
    assert check_remote(repo, store, "origin").ok
    copy = clone(case.url, tmp_path / "copy", options=case.options)
    for rev in ("HEAD", "HEAD~1", "HEAD~2"):
        assert_bit_exact(repo, copy, rev)


def test_check_remote_reports_missing_objects(tmp_path, case):
    from vrl.remote.check import check_remote

    repo = _repo(tmp_path, case)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    big = _objects(repo)["big"]
    store.delete(object_key(big))
    report = check_remote(repo, store, "origin")
    assert [(p.oid, p.problem) for p in report.problems] == [(big, "missing")]
    assert report.problems[0].message("origin") == f"tensor {big[:12]} on origin is missing"


def test_every_damaged_remote_object_is_found(tmp_path, case):
    """Each object on the remote in turn (loose or packed, every kind): a flipped byte is
    reported for exactly that object, and repair makes the remote check clean."""
    from vrl.remote.check import check_remote, repair_remote

    repo = _repo(tmp_path, case, commits=2)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    every = {oid: kind for c in repo.log() for oid, kind in [
        (c.id, "commit"), (repo.read_commit(c.id).manifest, "manifest")]}
    for c in list(every):
        if every[c] == "manifest":
            for entry in repo.read_manifest(c).data_entries().values():
                every[entry.id] = "tensor"
    for i, (oid, kind) in enumerate(sorted(every.items())):
        flip_remote_byte(store, oid, HEADER_SIZE + i * 7 if kind == "tensor" else -2,
                         1 << (i % 8))
        report = check_remote(repo, store, "origin")
        assert [(p.oid, p.kind, p.problem) for p in report.problems] == \
            [(oid, kind, "damaged")], oid
        assert [p.oid for p in repair_remote(repo, store, "origin").sent] == [oid]
        assert check_remote(repo, store, "origin").ok


def test_repair_without_a_good_local_copy_is_refused_in_one_line(tmp_path, case, capsys,
                                                                 monkeypatch):
    from vrl.remote.check import repair_remote

    repo = _repo(tmp_path, case)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    big = _objects(repo)["big"]
    flip_remote_byte(store, big, HEADER_SIZE)
    _flip_local(repo, big)  # no good copy here either
    fixed = repair_remote(repo, store, "origin")
    assert [p.oid for p in fixed.unrepaired] == [big] and not fixed.sent
    monkeypatch.chdir(repo.workdir)
    code, out, err = vrl(capsys, "push", "--repair", "-q")
    assert code == 1 and err.count("\n") == 1
    assert f"tensor {big[:12]} on origin is damaged" in err and "no good copy" in err


# ------------------------------------------------------------------------------ the CLI


def test_cli_fsck_remote_and_push_repair(tmp_path, case, capsys, monkeypatch):
    repo = _repo(tmp_path, case)
    store = open_named(repo, "origin")
    push(repo, store, "origin")
    objects = _objects(repo)
    monkeypatch.chdir(repo.workdir)
    code, out, _ = vrl(capsys, "fsck", "--remote", "origin")
    assert code == 0 and out.endswith("objects on origin (1 ref): ok\n")
    _damage_remote(store, objects)
    code, out, _ = vrl(capsys, "fsck", "--remote", "origin")
    assert code == 1
    lines = out.splitlines()
    assert f"error: tensor {objects['big'][:12]} on origin is damaged (its bytes do not " \
        "match its id)" in lines
    assert any(line.startswith(f"error: tensor {objects['small'][:12]} on origin is damaged")
               for line in lines)
    assert any(line.startswith(f"error: manifest {objects['manifest'][:12]} on origin is "
                               "damaged") for line in lines)
    assert lines[-1].endswith("3 problem(s); `vrl push --repair origin` re-sends them from "
                              "this repository")
    code, out, _ = vrl(capsys, "push", "-q")  # the old answer: nothing to do
    assert code == 0 and "up to date" in out
    code, out, err = vrl(capsys, "push", "--repair", "-q")
    assert code == 0, err
    assert sorted(out.splitlines()[:3]) == sorted(
        f"origin: re-sent {kind} {objects[role][:12]} (was damaged)"
        for role, kind in [("big", "tensor"), ("small", "tensor"), ("manifest", "manifest")])
    code, out, _ = vrl(capsys, "fsck", "--remote", "origin", "--json")
    assert code == 0 and '"ok": true' in out
    code, out, _ = vrl(capsys, "push", "--repair", "-q")
    assert code == 0 and "origin: nothing to repair" in out
    copy = clone(case.url, tmp_path / "copy", options=case.options)
    assert_bit_exact(repo, copy)


def test_cli_fsck_remote_unknown_name(tmp_path, capsys, monkeypatch):
    repo = Repo.init(tmp_path / "repo")
    monkeypatch.chdir(repo.workdir)
    code, _, err = vrl(capsys, "fsck", "--remote", "nowhere")
    assert code == 1 and err.startswith("error: unknown remote 'nowhere'")
