"""What a maintenance step may remove while commit journal records still need it, and what a
ref torn by a crash looks like: no acknowledged commit is lost at a power cut after a pack
merge, repack or gc, and an empty ref is reported with the way to restore it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import raw, vrl
from lazyfs import LazyFS, rebuild

import vrl.journal as journal
import vrl.journal_handles as journal_handles
import vrl.pack_merge as pack_merge
from vrl import Repo
from vrl.errors import RevisionError
from vrl.refs import ANY


def _state(i: int, tensors: int = 1, numel: int = 1000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return {f"layer{k}.weight": torch.randn(numel, generator=g) for k in range(tensors)}


def _power_cut_after(tmp_path: Path, monkeypatch, work, steps) -> tuple[Repo, list]:
    """Run `steps(repo)` (which returns [(commit, state)] acknowledged) under the
    lazy-fsync model, cut the power at its end, reboot: the repository as it comes back."""
    Repo.init(work)
    lazy = LazyFS(work)
    with lazy.installed(monkeypatch):
        repo = Repo(work)
        done = steps(repo)
        repo.sync()
        tree = lazy.durable_tree()
    monkeypatch.setattr(journal, "boot_id", lambda: "booted-again")
    rebuild(tree, tmp_path / "after")
    return Repo(tmp_path / "after", verify=True), done


def _lost(repo: Repo, done: list) -> list[str]:
    tip = repo.refs.read("refs/heads/main")
    chain = repo.first_parent_chain(tip) if tip else []
    lost = [cid[:12] for cid, _ in done if cid not in chain]
    for cid, state in done:
        if cid in chain:
            got = repo.load(cid)
            assert all(raw(got[k]) == raw(v) for k, v in state.items()), cid
    return lost


def _commits(n: int, **kw):
    def steps(repo: Repo) -> list:
        out = []
        for i in range(n):
            state = _state(i, **kw)
            out.append((repo.commit(state, message=f"c{i}", env=False), state))
        return out
    return steps


def test_power_cut_after_an_auto_merge_of_big_packs_loses_nothing(tmp_path, monkeypatch):
    """The issue's case at the real thresholds: 34 commits whose packs (6 x 800 KB tensors,
    each under the loose threshold) are external (over EXTERNAL_MIN); the 32nd merges."""
    repo, done = _power_cut_after(tmp_path, monkeypatch, tmp_path / "w",
                                  _commits(34, tensors=6, numel=200_000))
    assert not _lost(repo, done)
    assert repo.fsck()["ok"]


@pytest.mark.parametrize("external", [True, False], ids=["external", "journaled"])
def test_power_cut_after_auto_merges_loses_no_acknowledged_commit(tmp_path, monkeypatch,
                                                                  external):
    """Smaller thresholds, same protocol: a merge every 4 commits, every pack external (or
    in the journal's records)."""
    monkeypatch.setattr(pack_merge, "AUTO_MERGE", 4)
    if external:
        monkeypatch.setattr(journal, "EXTERNAL_MIN", 0)
    repo, done = _power_cut_after(tmp_path, monkeypatch, tmp_path / "w", _commits(19))
    assert not _lost(repo, done)
    assert repo.fsck()["ok"]
    assert len(repo.objects.packs()) < 8  # merges did happen


def test_power_cut_after_repack_loses_no_acknowledged_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "EXTERNAL_MIN", 0)

    def steps(repo: Repo) -> list:
        done = _commits(5)(repo)
        repo.repack()
        state = _state(99)
        return [*done, (repo.commit(state, message="after", env=False), state)]

    repo, done = _power_cut_after(tmp_path, monkeypatch, tmp_path / "w", steps)
    assert not _lost(repo, done)
    assert repo.fsck()["ok"]


def test_no_journal_record_names_a_pack_that_a_merge_removed(tmp_path, monkeypatch):
    """The invariant behind both tests above, checked after every commit: each record of
    the journal's current epoch (what a replay after a power cut re-applies) finds its
    pack once the commit (and the merge it ran) returned: a merge checkpoints the journal
    once the removal of the packs it merged is durable."""
    monkeypatch.setattr(pack_merge, "AUTO_MERGE", 4)
    monkeypatch.setattr(journal, "EXTERNAL_MIN", 0)
    repo = Repo.init(tmp_path / "w")
    merged = 0
    for i in range(13):
        repo.commit(_state(i), message=f"c{i}", env=False)
        repo.sync()
        data = (tmp_path / "w/.vrl/journal").read_bytes()
        header = journal.read_header(data)
        records, _ = journal.parse(data)
        records = [r for r in records if r.offset >= journal.HEADER.size]
        assert header is not None
        for record in records:
            assert repo.objects.pack_intact(record.pack), (i, record.pack)
        merged += len(records) == 0
    assert merged >= 2  # checkpoints happened (at the merges)


def test_a_replay_keeps_records_whose_pack_was_merged_into_another(tmp_path, monkeypatch):
    """Defence in depth: should a pack of a pending record go anyway (merged by a step
    that did not checkpoint first), the replay after a reboot still applies that record
    and every later one - only the last record can be unfinished."""
    monkeypatch.setattr(journal, "EXTERNAL_MIN", 0)

    def steps(repo: Repo) -> list:
        done = _commits(6)(repo)
        repo.sync()
        repo.objects.repack()  # straight at the object store: the journal is not told
        state = _state(99)
        return [*done, (repo.commit(state, message="after", env=False), state)]

    repo, done = _power_cut_after(tmp_path, monkeypatch, tmp_path / "w", steps)
    assert not _lost(repo, done)
    assert repo.fsck()["ok"]


def test_a_replay_still_drops_an_unfinished_last_record(tmp_path, monkeypatch):
    """The rule the defence keeps: a last record whose external pack is not whole (its
    round of fsyncs never ended) was never acknowledged, and is dropped."""
    monkeypatch.setattr(journal, "EXTERNAL_MIN", 0)
    work = tmp_path / "w"
    repo = Repo.init(work)
    first = repo.commit(_state(0), message="c0", env=False)
    second = repo.commit(_state(1), message="c1", env=False)
    repo.sync()
    data = (work / ".vrl/journal").read_bytes()
    last = [r for r in journal.parse(data)[0]][-1]
    assert last.new == second and last.external
    # as a power cut would leave it: the pack empty and the ref not yet moved
    (work / ".vrl/objects/pack" / last.pack).write_bytes(b"")
    (work / ".vrl/refs/heads/main").write_text(first + "\n")
    monkeypatch.setattr(journal, "boot_id", lambda: "booted-again")
    after = Repo(work)
    assert after.refs.read("refs/heads/main") == first
    assert after.fsck()["ok"]


# ------------------------------------------------------------------ a torn ref


def _two_commits(repo: Repo) -> tuple[str, str]:
    first = repo.commit(_state(0), message="c0", env=False)
    second = repo.commit(_state(1), message="c1", env=False)
    repo.sync()
    return first, second


def test_an_empty_ref_is_damage_not_an_unborn_branch(repo):
    _, tip = _two_commits(repo)
    repo.sync()
    (repo.vrl_dir / "refs/heads/main").write_bytes(b"")
    with pytest.raises(RevisionError, match=f"empty.*vrl branch -f main {tip[:12]}"):
        repo.head()
    assert "refs/heads/main" in repo.refs.damaged()
    # a commit (in a new process, as after the crash) does not start a new history
    script = ("import sys, torch; from vrl import Repo; from vrl.errors import VrlError\n"
              "try:\n    Repo(sys.argv[1]).commit({'w': torch.zeros(2)}, env=False)\n"
              "except VrlError as exc:\n    sys.exit(str(exc))")
    done = subprocess.run([sys.executable, "-c", script, str(repo.workdir)],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "refs/heads/main is empty" in done.stderr
    assert (repo.vrl_dir / "refs/heads/main").read_bytes() == b""
    report = repo.fsck()
    assert not report["ok"]
    assert any("refs/heads/main is empty" in p for p in report["problems"])


def test_an_empty_ref_fails_the_cli_and_its_hint_restores_it(tmp_path, capsys, monkeypatch):
    work = tmp_path / "r"
    _, tip = _two_commits(Repo.init(work))
    (work / ".vrl/refs/heads/main").write_bytes(b"\n")
    monkeypatch.chdir(work)
    code, out, err = vrl(capsys, "log")
    assert code != 0 and "No commits" not in out
    assert err.count("\n") == 1 and f"vrl branch -f main {tip[:12]}" in err
    code, out, _ = vrl(capsys, "fsck")
    assert code != 0 and "refs/heads/main is empty" in out
    hint = err.split("`")[1].split()
    assert vrl(capsys, *hint[1:])[0] == 0
    code, out, _ = vrl(capsys, "log", "--oneline")
    assert code == 0 and out.splitlines()[0].startswith(tip[:12])
    assert vrl(capsys, "fsck")[0] == 0


# ------------------------------------------------------------------ a move logged twice


def test_fsck_reports_a_reflog_line_written_twice(repo):
    _two_commits(repo)
    log = repo.vrl_dir / "logs/refs/heads/main"
    lines = log.read_bytes().splitlines(keepends=True)
    assert repo.fsck()["ok"]
    log.write_bytes(b"".join(lines + lines[-1:]))
    report = repo.fsck()
    assert not report["ok"]
    assert any("holds a line twice" in p for p in report["problems"])


def test_a_replay_that_applied_its_record_twice_is_caught(tmp_path, monkeypatch):
    """Teeth for the replay's idempotence: re-applying a record whose reflog line is in
    place must not append it again; with that check removed, a killed holder's replay
    doubles the line and fsck says so."""
    work = tmp_path / "w"
    repo = Repo.init(work)
    _two_commits(repo)
    data = (work / ".vrl/journal").read_bytes()
    header = journal.read_header(data)
    assert header is not None
    # as a holder killed after materialising, before marking it so: replayed at next open
    (work / ".vrl/journal").write_bytes(journal.HEADER.pack(
        journal.MAGIC, header.boot.encode().ljust(40), journal.HEADER.size, header.epoch)
        + data[journal.HEADER.size:])
    for checked in (True, False):
        if not checked:
            monkeypatch.setattr(journal, "_has_line", lambda path, line: False)
            (work / ".vrl/journal").write_bytes(journal.HEADER.pack(
                journal.MAGIC, header.boot.encode().ljust(40), journal.HEADER.size,
                header.epoch) + data[journal.HEADER.size:])
        journal_handles.HANDLES.clear()  # (a new process)
        again = Repo(work)
        again.sync()
        assert again.fsck()["ok"] is checked


# ------------------------------------------------------------------ compare-and-swap


@pytest.mark.parametrize("broken", [False, True], ids=["", "without-the-check"])
@pytest.mark.parametrize("journaled", [False, True], ids=["three-rounds", "journal"])
def test_a_commit_that_loses_the_race_for_its_ref_keeps_both(tmp_path, monkeypatch,
                                                             journaled, broken):
    """The interleaving forced, not timed: another writer commits on main between this
    commit's read of its parent and its compare-and-swap; the CAS fails, the commit is
    re-parented onto the other one, and neither is lost (with the check removed, the
    second write would overwrite the first)."""
    work = tmp_path / "w"
    Repo.init(work)
    first = Repo(work, journal=journaled)
    base = first.commit(_state(0), message="base", env=False)
    first.sync()
    other = Repo(work, journal=journaled)
    raced: list[str] = []
    target = (journal.Journal, "commit") if journaled else (type(first.refs), "update")
    real = getattr(*target)

    def racing(self, *args, **kwargs):
        if not raced:  # once: the other writer lands first
            raced.append("")
            with monkeypatch.context() as undo:
                undo.setattr(*target, real)
                raced[0] = other.commit(_state(1), message="other", env=False)
                other.sync()
        if broken:  # the compare-and-swap's expected value ignored
            args = (*args[:2], ANY, *args[3:]) if journaled else args
            kwargs = {**kwargs, "expected": ANY} if not journaled else kwargs
        return real(self, *args, **kwargs)

    monkeypatch.setattr(*target, racing)
    mine = first.commit(_state(2), message="mine", env=False)
    first.sync()
    monkeypatch.undo()
    chain = Repo(work).first_parent_chain(Repo(work).head())
    assert (chain[:3] == [mine, raced[0], base]) is not broken
