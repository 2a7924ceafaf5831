"""The durable-commit protocols of a small commit: the commit journal's one fdatasync, and
without it (core.journal = false, or no boot id) what is fsynced with what, and the reflog
line a power cut can leave behind (refs.interrupted). The whole protocol is swept at every
power cut by tests/test_powercut.py; these pin the pieces that make it cheap."""

from __future__ import annotations

import os
import secrets
import time

import pytest
import torch

from vrl import Repo
from vrl.refs import ReflogEntry, interrupted


def policy(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(32, 16, generator=g) for i in range(6)}


def test_pack_directory_is_synced_together_with_the_ref_files(tmp_path, monkeypatch):
    """The pack's directory entry is fsynced in the same round as the ref's temp file and
    reflog lines (one journal commit), not in a round of its own before the ref is
    written: when it is fsynced, the ref's temp file already exists."""
    Repo.init(tmp_path)
    repo = Repo(tmp_path, journal=False)  # the three-round protocol
    repo.commit(policy(0), env=False)
    pack_dir = os.path.realpath(repo.vrl_dir / "objects" / "pack")
    heads = repo.vrl_dir / "refs" / "heads"
    seen: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")) == pack_dir:
            seen.append(any(p.name.startswith(".tmp-") for p in heads.iterdir()))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    state = policy(1)
    cid = repo.commit(state, env=False)
    monkeypatch.undo()
    assert seen == [True]
    assert Repo(tmp_path).resolve("HEAD") == cid
    assert Repo(tmp_path, verify=True).fsck()["ok"]


def test_a_commit_makes_one_pack_and_freshens_each_reused_pack_once(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path)
    state = policy(0)
    repo.commit(state, env=False)
    repo.sync()  # (its pack in place: reused objects freshen it)
    utimes: list[str] = []
    real_utime = os.utime

    def utime(path, *a, **k):
        real_utime(path, *a, **k)  # a new object's loose path fails: not a freshening
        utimes.append(os.fspath(path))

    monkeypatch.setattr(os, "utime", utime)
    state["layer0.weight"].add_(1.0)  # five tensors reused from the first commit's pack
    repo.commit(state, env=False)
    repo.sync()
    monkeypatch.undo()
    assert len(utimes) == 1 and "/pack/pack-" in utimes[0]
    assert len(list((repo.vrl_dir / "objects" / "pack").glob("pack-*.pack"))) == 2


def test_interrupted_recognises_only_moves_that_never_happened():
    a, b, c, x = (secrets.token_hex(32) for _ in range(4))

    def e(old, new):
        return ReflogEntry(old, new, "t", "w", "commit")

    # newest first: a->b applied, then b->x logged and lost, then b->c applied
    log = [e(b, c), e(b, x), e(a, b), e(None, a)]
    assert interrupted(log, c) == [e(b, x)]
    # the newest line's move was lost: the ref still holds its old value
    assert interrupted([e(b, x), e(a, b)], b) == [e(b, x)]
    # a line whose new id is damaged still continues the chain from the true id
    assert interrupted([e(b, c), e(a, x)], c) == []
    assert interrupted([e(a, b)], b) == []


def lose_a_commit(repo: Repo) -> str:
    """The durable state after a power cut between the reflog's fsync and the pack
    directory's: a reflog line names a commit that is not there; the ref did not move."""
    head = repo.head()
    lost = secrets.token_hex(32)
    for log in ("logs/refs/heads/main", "logs/HEAD"):
        with open(repo.vrl_dir / log, "a") as f:
            f.write(f"{head} {lost} 2026-01-01T00:00:00.000000Z who\tcommit: lost\n")
    return lost


@pytest.mark.parametrize("then_commit", [False, True])
def test_a_lost_move_in_the_reflog_is_a_warning_not_damage(tmp_path, then_commit):
    repo = Repo.init(tmp_path)
    first = repo.commit(policy(0), env=False)
    lost = lose_a_commit(repo)
    if then_commit:  # the next commit moves from the same old value
        repo.commit(policy(1), env=False)
    repo = Repo(tmp_path, verify=True)
    report = repo.fsck()
    assert report["ok"], report["problems"]
    assert any(lost[:12] in str(w) and "never happened" in str(w) for w in report["warnings"])
    repo.gc(grace=0)  # not blocked: the lost commit protects nothing
    assert repo.load(first)["layer0.weight"].shape == (32, 16)


def test_a_damaged_applied_reflog_line_is_still_damage(tmp_path):
    repo = Repo.init(tmp_path)
    repo.commit(policy(0), env=False)
    second = repo.commit(policy(1), env=False)
    repo.sync()
    log = repo.vrl_dir / "logs" / "refs" / "heads" / "main"
    bad = "0" if second[0] != "0" else "1"
    log.write_text(log.read_text().replace(f" {second} ", f" {bad}{second[1:]} "))
    report = Repo(tmp_path).fsck()
    assert not report["ok"]
    assert any("missing" in str(p) for p in report["problems"])


def test_the_ref_is_prepared_while_the_pack_is_fsynced_and_a_failed_pack_moves_nothing(
        tmp_path, monkeypatch):
    """The pack's fsync runs on a worker thread while the ref's lock, reflog lines and
    temp file are written; if that fsync fails, the commit fails with nothing moved: the
    ref, its reflog and the pack directory are as before, and the next commit works."""
    from vrl.errors import StorageError

    Repo.init(tmp_path)
    repo = Repo(tmp_path, journal=False)  # the three-round protocol
    first = repo.commit(policy(0), env=False)
    heads = repo.vrl_dir / "refs" / "heads"
    log = repo.vrl_dir / "logs" / "refs" / "heads" / "main"
    packs = sorted((repo.vrl_dir / "objects" / "pack").iterdir())
    before_log = log.read_bytes()
    real_fsync = os.fsync
    lock_seen: list[bool] = []

    def fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "/objects/pack/.tmp-" in path:
            time.sleep(0.2)  # a slow disk: the ref's files are written meanwhile
            lock_seen.append((heads / "main.lock").exists())
            raise OSError(5, "Input/output error")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(StorageError, match="I/O error"):
        repo.commit(policy(1), env=False)
    monkeypatch.undo()
    assert lock_seen == [True]
    assert repo.refs.read("refs/heads/main") == first
    assert log.read_bytes() == before_log
    assert sorted(heads.iterdir()) == [heads / "main"]  # no lock, no temp file
    assert sorted((repo.vrl_dir / "objects" / "pack").iterdir()) == packs
    state = policy(2)
    second = repo.commit(state, env=False)
    fresh = Repo(tmp_path, verify=True)
    assert fresh.refs.read("refs/heads/main") == second
    assert fresh.fsck()["ok"]
    assert torch.equal(fresh.load(second)["layer0.weight"], state["layer0.weight"])
