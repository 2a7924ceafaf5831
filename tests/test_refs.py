"""Refs keep what they point to, and damage is never silent (issue 9, items 1-6): failed
checkouts and resets move nothing, pruned snapshots are protected by refs, damaged refs and
reflogs are reported by fsck and stop gc, ref-name clashes and long names are refused at
once, and fsck lists every problem."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest
import torch
from helpers import edit_object, remove_object
from test_failures import one_line_error, small_disk, snapshot_of_disk  # noqa: F401

from vrl import Repo
from vrl.cli import main
from vrl.errors import InvalidRefNameError, PrunedError, RefConflictError, VrlError
from vrl.workspace import read_checkpoint, write_checkpoint


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("VRL_DEBUG", raising=False)
    monkeypatch.setenv("VRL_AUTHOR", "tester")


def state(i: int, n: int = 64) -> dict[str, torch.Tensor]:
    """A snapshot whose every tensor is its own (nothing shared with other i)."""
    return {"w": torch.full((n,), float(i)), "b": torch.full((3,), float(i) + 0.5)}


def history(path: Path, n: int, size: int = 64) -> tuple[Repo, list[str]]:
    repo = Repo.init(path)
    ids = [repo.commit(state(i, size), env=False, message=f"s{i}") for i in range(n)]
    repo.sync()  # (the tests read and damage the files themselves)
    return repo, ids


def vrl(path: Path, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-C", str(path), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def refs_and_logs(path: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot_of_disk(path / ".vrl").items()
            if k == "HEAD" or k.startswith(("refs/", "logs/"))}


def tensors_of(repo: Repo, oid: str) -> list[str]:
    return [e.id for e in repo.read_manifest(repo.read_commit(oid).manifest).tensors.values()]


# ------------------------------------------------------------------ item 1: data, then refs


@pytest.mark.parametrize("how", ["pruned", "missing"])
def test_failed_checkout_moves_nothing(tmp_path, capsys, how):
    path = tmp_path / "repo"
    repo, ids = history(path, 3)
    vrl(path, capsys, "checkout", "main", "--force")
    if how == "pruned":
        assert repo.prune(keep_last=1) == [ids[1], ids[0]]
        repo.gc(grace=0, expire_reflog=True)
    else:
        for oid in tensors_of(repo, ids[0]):
            remove_object(repo, oid)
    before = refs_and_logs(path)
    workspace = (path / "policy.safetensors").read_bytes()
    for argv in (["checkout", ids[0][:12]], ["checkout", ids[0][:12], "--force"],
                 ["checkout", "-b", "old", ids[0][:12]], ["reset", "--hard", ids[0][:12]]):
        code, out, err = vrl(path, capsys, *argv)
        assert code == 1, argv
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert ("pruned" if how == "pruned" else "not in this repository") in err
        assert refs_and_logs(path) == before, argv
        assert (path / "policy.safetensors").read_bytes() == workspace
    # the repository still works: status, commit
    assert vrl(path, capsys, "status")[1].startswith("On branch main\n")
    assert vrl(path, capsys, "commit", "-m", "next", "--allow-empty", "--no-env")[0] == 0
    if how == "pruned":
        with pytest.raises(PrunedError, match="freed its tensors"):
            Repo(path).checkout(ids[0])  # moving HEAD alone is refused too
        assert Repo(path).current_branch() == "main"


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f:  # nothing left to flush at close
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_reset_checkout_export_on_a_full_disk(small_disk, capsys):  # noqa: F811
    path = small_disk / "repo"
    repo, ids = history(path, 2, size=40_000)  # 160 kB per snapshot
    repo.branch("dev", ids[0])
    vrl(path, capsys, "checkout", "main", "--force")
    _fill(small_disk)
    before = refs_and_logs(path)
    workspace = (path / "policy.safetensors").read_bytes()
    for argv in (["reset", "--hard", "HEAD~1"], ["checkout", "dev"],
                 ["checkout", "-b", "new", ids[0]], ["checkout", ids[0]],
                 ["export", "HEAD~1", str(small_disk / "out.safetensors")],
                 ["export", "HEAD~1", str(small_disk / "out.pt")]):
        code, out, err = vrl(path, capsys, *argv)
        assert code == 1, argv
        assert err.startswith("error: disk full") and err.count("\n") == 1, (argv, err)
        assert refs_and_logs(path) == before, argv
        assert (path / "policy.safetensors").read_bytes() == workspace
        assert not [p for p in small_disk.rglob("*") if ".tmp" in p.name]
    (small_disk / "filler").unlink()
    assert vrl(path, capsys, "reset", "--hard", "HEAD~1")[0] == 0
    assert torch.equal(read_checkpoint(path / "policy.safetensors")["w"], state(0, 40_000)["w"])


def test_reset_undo_hint_matches_the_mode(tmp_path, capsys):
    path = tmp_path / "repo"
    _, ids = history(path, 2)
    vrl(path, capsys, "checkout", "HEAD", "--force")
    out = vrl(path, capsys, "reset", "HEAD~1")[1]
    assert out.endswith(f"(was {ids[1][:12]}; `vrl reset {ids[1][:12]}` undoes this)\n")
    out = vrl(path, capsys, "reset", "--hard", ids[1])[1]
    assert out.endswith(f"(was {ids[0][:12]}; `vrl reset --hard {ids[0][:12]}` undoes this)\n")


# ------------------------------------------------------------------ item 2: refs keep data


def test_tag_or_branch_unprunes_a_pruned_snapshot(tmp_path, capsys):
    """The issue's reproduction: prune, tag an old snapshot, gc, export the tag."""
    path = tmp_path / "repo"
    repo, ids = history(path, 4)
    assert vrl(path, capsys, "prune", "--keep-last", "1")[0] == 0
    assert Repo(path).pruned() == set(ids[:3])
    assert vrl(path, capsys, "tag", "keep", "HEAD~2")[0] == 0
    assert vrl(path, capsys, "branch", "old", "HEAD~3")[0] == 0
    assert Repo(path).pruned() == {ids[2]}  # tagging and branching un-pruned 1 and 0
    assert vrl(path, capsys, "gc", "--grace", "0")[0] == 0
    for rev, i in (("keep", 1), ("old", 0)):
        out = path / f"{rev}.safetensors"
        assert vrl(path, capsys, "export", rev, str(out))[0] == 0
        assert torch.equal(read_checkpoint(out)["w"], state(i)["w"])
    assert Repo(path).fsck()["ok"]
    # ids[2] was freed: a ref to it is refused with a clear message, nothing created
    for argv in (["tag", "late", ids[2]], ["branch", "late", ids[2]],
                 ["checkout", "-b", "late", ids[2]], ["checkout", ids[2], "--no-workspace"]):
        code, _, err = vrl(path, capsys, *argv)
        assert code == 1 and "pruned" in err and err.count("\n") == 1, argv
    assert "late" not in Repo(path).tags() and "late" not in Repo(path).branches()


def test_checkout_of_a_pruned_snapshot_warns_and_head_keeps_it(tmp_path, capsys):
    path = tmp_path / "repo"
    repo, ids = history(path, 3)
    repo.prune(keep_last=1)
    code, out, err = vrl(path, capsys, "checkout", ids[0], "--force")
    assert code == 0 and err.startswith(f"warning: snapshot {ids[0][:12]} was pruned")
    repo.gc(grace=0)  # HEAD is on it: its tensors stay
    assert Repo(path, verify=True).load("HEAD")["w"][0] == 0.0
    assert Repo(path).fsck()["ok"]
    vrl(path, capsys, "checkout", "main", "--force")
    repo.gc(grace=0, expire_reflog=True)  # HEAD moved on: now they go
    with pytest.raises(PrunedError):
        Repo(path).load(ids[0])


def test_prune_across_branches(tmp_path):
    path = tmp_path / "repo"
    repo, main_ids = history(path, 4)  # main: 0 1 2 3
    repo.checkout(main_ids[1], create_branch="dev")
    dev_ids = [repo.commit(state(10 + i), env=False) for i in range(3)]  # dev: 1 - 10 11 12
    # only main's history; what dev's last 3 reach (10, 11, 12) is kept
    assert repo.prune(keep_last=3, refs=["refs/heads/main"]) == [main_ids[0]]
    # every branch: main keeps 2 and 3, dev keeps 11 and 12; 1 is on both
    assert repo.prune(keep_last=2) == [dev_ids[0], main_ids[1]]
    assert repo.pruned() == {dev_ids[0], main_ids[1], main_ids[0]}
    assert repo.prune(keep_last=2) == []
    repo.gc(grace=0, expire_reflog=True)
    for oid in (main_ids[2], main_ids[3], dev_ids[1], dev_ids[2]):
        Repo(path, verify=True).load(oid)
    for oid in (main_ids[0], main_ids[1], dev_ids[0]):
        with pytest.raises(PrunedError):
            Repo(path).load(oid)
    assert Repo(path).fsck()["ok"]


def test_gc_drops_the_commits_it_collects_from_the_pruned_list(tmp_path):
    """Found by the state machine: a pruned commit that gc collected (no ref or reflog
    reaches it any more) stayed listed as pruned, though nothing of it is left."""
    path = tmp_path / "repo"
    repo, ids = history(path, 3)
    assert repo.prune(keep_last=1) == [ids[1], ids[0]]
    repo.reset(ids[0])  # ids[0] is un-pruned (a branch points at it again); ids[1] not
    assert repo.pruned() == {ids[1]}
    repo.gc(grace=0, expire_reflog=True)  # ids[1] and ids[2] are unreachable now: gone
    assert set(Repo(path).iter_commits()) == {ids[0]}
    assert Repo(path).pruned() == set()
    assert Repo(path).fsck()["ok"]


def test_fsck_reports_a_ref_to_a_freed_snapshot(tmp_path):
    path = tmp_path / "repo"
    repo, ids = history(path, 3)
    repo.prune(keep_last=1)
    repo.gc(grace=0, expire_reflog=True)
    (path / ".vrl/refs/tags/old").write_text(ids[0] + "\n")  # written behind vrl's back
    report = Repo(path).fsck()
    assert not report["ok"]
    assert [e["where"] for e in report["errors"]] == ["refs/tags/old"]
    assert "tensors are gone" in report["problems"][0]


def test_prune_says_when_gc_can_free_the_space(tmp_path, capsys):
    path = tmp_path / "repo"
    history(path, 3)
    code, out, _ = vrl(path, capsys, "prune", "--keep-last", "1")
    assert code == 0
    last = out.splitlines()[-1]
    assert last.startswith("`vrl gc` frees nothing yet: ") and "freeable in 60 min" in last \
        and "vrl gc --now" in last
    code, out, err = vrl(path, capsys, "gc")
    assert out.startswith("Removed 0 unreachable objects") and "freeable in 60 min" in out
    code, out, err = vrl(path, capsys, "gc", "--now")
    assert code == 0 and "Removed 4 unreachable objects" in out
    # no warning: commits in flight hold the gc lock, so no grace period can break one
    assert err == ""
    assert vrl(path, capsys, "gc", "--grace", "0")[2] == ""


# ------------------------------------------------------------------ item 3: reflog damage


def _damage_lines(log: Path, oid: str, how: str) -> None:
    lines = log.read_bytes().split(b"\n")
    for i, line in enumerate(lines):
        if oid.encode() in line.split(b" ")[1:2]:  # the entry that moved the ref to oid
            if how == "byte":
                lines[i] = line[:30] + b"\xff" + line[31:]
            else:  # a hex digit flipped: still parses, names a commit that does not exist
                digit = b"1" if line[30:31] != b"1" else b"2"
                lines[i] = line[:30] + digit + line[31:]
    log.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("how", ["byte", "hexdigit"])
def test_damaged_reflog_is_reported_and_stops_gc(tmp_path, capsys, how):
    path = tmp_path / "repo"
    repo, ids = history(path, 3)
    repo.reset(ids[0])  # ids[1], ids[2] are now kept by the reflog alone
    for log in ("HEAD", "refs/heads/main"):
        _damage_lines(path / ".vrl/logs" / log, ids[2], how)
    report = Repo(path).fsck()
    assert not report["ok"]
    assert {e["where"] for e in report["errors"]} == {"logs/HEAD", "logs/refs/heads/main"}
    assert {e["kind"] for e in report["errors"]} == {"reflog"}
    if how == "byte":  # `vrl reflog` still lists the rest, and says what it skipped
        code, out, err = vrl(path, capsys, "reflog")
        assert code == 0 and len(out.splitlines()) == 3
        assert err.startswith("warning: logs/HEAD: line 3 is damaged")
    objects = set(repo.objects.ids())
    code, _, err = vrl(path, capsys, "gc", "--grace", "0")
    assert code == 1 and "gc cannot tell which snapshots" in err and err.count("\n") == 1
    assert set(repo.objects.ids()) == objects
    Repo(path, verify=True).load(ids[2])
    # forgetting the reflog on purpose is allowed
    assert vrl(path, capsys, "gc", "--grace", "0", "--expire-reflog")[0] == 0


def test_torn_last_reflog_line_is_a_warning(tmp_path, capsys):
    path = tmp_path / "repo"
    repo, ids = history(path, 2)
    with open(path / ".vrl/logs/HEAD", "ab") as f:
        f.write(b"0000")  # a crash mid-append
    report = Repo(path).fsck()
    assert report["ok"] and len(report["warnings"]) == 1
    assert "incomplete" in report["warnings"][0]["message"]
    assert Repo(path).gc(grace=0) == (0, 0)
    assert [e.new for e in repo.refs.reflog("HEAD")] == ids[::-1]


# ------------------------------------------------------------------ item 4: garbage refs


def test_one_garbage_ref_breaks_nothing(tmp_path, capsys):
    path = tmp_path / "repo"
    repo, ids = history(path, 2)
    repo.branch("junk", ids[0])
    repo.tag("bad", ids[0])
    (path / ".vrl/refs/heads/junk").write_bytes(b"\x00garbage\xff\n")
    (path / ".vrl/refs/tags/bad").write_bytes(b"not an id\n")
    report = Repo(path).fsck()
    assert {e["where"] for e in report["errors"]} == {"refs/heads/junk", "refs/tags/bad"}
    assert vrl(path, capsys, "fsck")[0] == 1
    code, out, err = vrl(path, capsys, "log", "--oneline")
    assert code == 0 and len(out.splitlines()) == 2
    assert "refs/heads/junk is damaged" in err and "vrl branch -d junk" in err
    code, out, err = vrl(path, capsys, "branch")
    assert code == 0 and out.startswith("* main") and "junk" in err
    code, out, err = vrl(path, capsys, "tag")
    assert code == 0 and out == "" and "vrl tag -d bad" in err
    # gc works: the damaged refs' reflogs name what they held
    assert vrl(path, capsys, "gc", "--grace", "0")[0] == 0
    Repo(path, verify=True).load(ids[0])
    # a plain create refuses to overwrite it, --force overwrites, -d deletes
    code, _, err = vrl(path, capsys, "branch", "junk")
    assert code == 1 and "damaged" in err and "--force" in err
    assert vrl(path, capsys, "branch", "-f", "junk", ids[1])[0] == 0
    assert Repo(path).branches()["junk"] == ids[1]
    code, out, _ = vrl(path, capsys, "tag", "-d", "bad")
    assert code == 0 and out == "Deleted tag bad (it was damaged)\n"
    (path / ".vrl/refs/heads/junk").write_bytes(b"zzz")
    assert vrl(path, capsys, "branch", "-d", "junk")[0] == 0
    assert Repo(path).fsck()["ok"]


def test_gc_stops_on_a_garbage_ref_nothing_can_explain(tmp_path, capsys):
    path = tmp_path / "repo"
    repo, ids = history(path, 2)
    (path / ".vrl/refs/heads/stray").write_text("garbage\n")  # no reflog says what it held
    objects = set(repo.objects.ids())
    code, _, err = vrl(path, capsys, "gc", "--grace", "0")
    assert code == 1 and "refs/heads/stray is damaged" in err and "vrl branch -d stray" in err
    assert set(repo.objects.ids()) == objects


# ------------------------------------------------------------------ item 5: names


def test_branch_and_folder_clash_is_refused_at_once(tmp_path):
    repo, ids = history(tmp_path, 1)
    repo.branch("x")
    start = time.monotonic()
    with pytest.raises(RefConflictError, match="refs/heads/x exists") as info:
        repo.branch("x/y")
    assert "'x'" in str(info.value)
    repo.branch("a/b")
    with pytest.raises(RefConflictError, match="refs/heads/a/b exists"):
        repo.branch("a")
    with pytest.raises(RefConflictError, match="refs/tags/t exists"):
        repo.tag("t") and repo.tag("t/u")
    assert time.monotonic() - start < 2
    assert not list((tmp_path / ".vrl").rglob("*.lock"))
    repo.delete_branch("a/b")  # the folder goes with its last ref, so `a` can be a branch
    repo.branch("a")
    assert sorted(repo.branches()) == ["a", "main", "x"]
    assert Repo(tmp_path).fsck()["ok"]


def test_too_long_names_are_refused_up_front(tmp_path, capsys):
    repo, _ = history(tmp_path, 1)
    with pytest.raises(InvalidRefNameError, match="longer than 240 bytes"):
        repo.branch("b" * 300)
    with pytest.raises(InvalidRefNameError, match="longer than 1000 bytes"):
        repo.tag("/".join(["t" * 200] * 6))
    repo.branch("b" * 240)  # the longest allowed component works
    code, _, err = vrl(tmp_path, capsys, "branch", "c" * 300)
    assert code == 1 and "longer than" in err and "I/O" not in err


# ------------------------------------------------------------------ item 6: fsck


def test_fsck_lists_every_problem_and_json(tmp_path, capsys):
    path = tmp_path / "repo"
    repo, ids = history(path, 4)
    # a corrupt tensor, a missing parent, a missing manifest, a garbage ref, a bad reflog line
    tensor = tensors_of(repo, ids[3])[0]
    edit_object(repo, tensor, lambda b: b.__setitem__(-1, b[-1] ^ 0xFF))
    remove_object(repo, ids[0])
    remove_object(repo, repo.read_commit(ids[2]).manifest)
    (path / ".vrl/refs/heads/junk").write_text("junk\n")
    with open(path / ".vrl/logs/HEAD", "ab") as f:
        f.write(b"bad line\n")
    code, out, _ = vrl(path, capsys, "fsck", "--json")
    assert code == 1
    report = json.loads(out)
    kinds = sorted((e["kind"], e["where"]) for e in report["errors"])
    assert ("object", tensor) in kinds
    assert ("connectivity", ids[1]) in kinds  # its parent ids[0] is missing
    assert ("connectivity", ids[2]) in kinds  # its manifest is missing
    assert ("ref", "refs/heads/junk") in kinds
    assert ("reflog", "logs/HEAD") in kinds  # the bad line, and ids[0] named but missing
    assert all(set(e) == {"kind", "where", "message"} for e in report["errors"])
    assert len(report["problems"]) == len(report["errors"]) and not report["ok"]
    code, out, _ = vrl(path, capsys, "fsck")
    assert code == 1 and f"{len(report['errors'])} problem" in out


def test_status_and_commit_after_damage_are_one_line_errors(tmp_path, capsys):
    """HEAD's branch damaged: status and commit fail with one line, naming the fix."""
    path = tmp_path / "repo"
    history(path, 1)
    write_checkpoint(state(5), path / "policy.safetensors")
    (path / ".vrl/refs/heads/main").write_text("broken\n")
    for argv in (["status"], ["commit", "--no-env"]):
        code, _, err = vrl(path, capsys, *argv)
        assert code == 1 and err.count("\n") == 1 and "vrl branch -d main" in err, argv
    with pytest.raises(VrlError):
        Repo(path).head()


def test_fsck_checks_manifest_consistency(tmp_path):
    """Hand-made manifests, one whose tie points nowhere and one whose entry names no
    object id: both reported (each names its manifest), neither stops fsck."""
    from vrl.objects import Commit, Manifest, TensorEntry

    path = tmp_path / "repo"
    repo, ids = history(path, 1)
    good = repo.read_manifest(repo.read_commit(ids[0]).manifest).tensors["w"]
    bad = {"tie": TensorEntry(good.id, good.dtype, good.shape, good.nbytes, tie="x"),
           "id": TensorEntry("../../etc", good.dtype, good.shape, good.nbytes)}
    mids = {}
    for what, entry in bad.items():
        mid = repo.objects.write("manifest", Manifest({"w": good, "v": entry}, tree={})
                                 .to_bytes())
        cid = repo.objects.write("commit", Commit(manifest=mid, parents=(ids[0],),
                                                  message=what, author="t",
                                                  time="2026-01-01T00:00:00Z").to_bytes())
        repo.refs.update(f"refs/heads/odd-{what}", cid)
        mids[what] = mid
    report = Repo(path).fsck()
    found = {e["where"]: e["message"] for e in report["errors"] if e["kind"] == "manifest"}
    assert set(found) == set(mids.values()) and len(report["errors"]) == 2
    assert "id is not an object id" in found[mids["id"]]
    assert "tensor 'v' is tied to a tensor that does not match it" in found[mids["tie"]]


def test_reset_hard_and_checkout_when_the_writer_fails(tmp_path, capsys, monkeypatch):
    """Without a tmpfs: the checkpoint writer fails as on a full disk."""
    from vrl import workspace

    path = tmp_path / "repo"
    _, ids = history(path, 2)
    vrl(path, capsys, "checkout", "main", "--force")
    before = refs_and_logs(path)
    written = (path / "policy.safetensors").read_bytes()

    def full(file, *args):
        Path(file).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(workspace, "write_stream", full)
    for argv in (["reset", "--hard", "HEAD~1"], ["checkout", ids[0]],
                 ["checkout", "-b", "new", ids[0]], ["export", "HEAD", "x.safetensors"]):
        code, _, err = vrl(path, capsys, *argv)
        assert code == 1 and err.startswith("error: disk full") and err.count("\n") == 1
        assert refs_and_logs(path) == before, argv
        assert (path / "policy.safetensors").read_bytes() == written
        assert not [p for p in path.iterdir() if ".tmp" in p.name]


def test_a_ref_move_fsyncs_its_reflogs_and_the_ref_together(tmp_path, monkeypatch):
    """The branch's reflog, HEAD's reflog and the ref's temp file are fsynced at once
    (one journal commit instead of three in a row), all before the rename: the barrier
    below is passed only by three concurrent fsyncs (one after another, it times out)."""
    import os
    import threading

    history(tmp_path / "repo", 1)
    repo = Repo(tmp_path / "repo", journal=False)  # a ref move outside the commit journal
    repo.journal.checkpoint()  # the first commit's record (its fsyncs are not counted here)
    barrier = threading.Barrier(3, timeout=5)
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "/logs/" in path or "/.tmp-" in path and "/refs/" in path:
            barrier.wait()
            order.append("fsync")
        return real_fsync(fd)

    def replace(src, dst):
        if str(dst).endswith("refs/heads/main"):
            order.append("rename")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    repo.commit(state(5), env=False)
    assert order == ["fsync"] * 3 + ["rename"]
    assert [e.new for e in repo.refs.reflog("refs/heads/main")][0] == repo.head()
    assert repo.refs.reflog("HEAD")[0].new == repo.head()


@pytest.mark.parametrize("size", [4095, 4096, 4097, 70000])
def test_a_ref_file_is_read_whole_whatever_its_size(tmp_path, size):
    """A ref is read with as few read calls as its size allows (one for a real ref): a
    big (damaged) file must still be read to its end, as its damage report shows it."""
    repo = Repo.init(tmp_path)
    text = ("x" * (size - 1) + "\n").encode()
    (tmp_path / ".vrl/refs/heads/big").write_bytes(text)
    assert repo.refs.read_raw("refs/heads/big") == text.decode().strip()
    (tmp_path / ".vrl/refs/heads/empty").write_bytes(b"")
    assert repo.refs.read_raw("refs/heads/empty") == ""  # damage, not an unborn ref
