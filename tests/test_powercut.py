"""Crash consistency at a power cut, in SQLite's spirit: an injected I/O layer models a
filesystem that keeps only what was fsynced (a "lazy-fsync" filesystem, the worst case
POSIX allows), and the repository is checked at a power cut before every single write,
fsync, rename, unlink and mkdir of init, commit, branch, prune and gc, and of push to a
local remote, clone and fetch from it.

The model works at the os level, so it covers whatever files vrl writes (objects, packs,
refs, reflogs, the pruned list, config):
- a file's durable content is its content at its last fsync (a new file never fsynced is
  empty after the cut);
- a directory's durable entries (creates, renames, unlinks in it) are those it had at its
  last fsync; a directory never fsynced since it was created has none.
Every other write simply happens on the real disk, so vrl runs unchanged; the durable state
at each step is rebuilt into a fresh directory and checked: `fsck` passes, every commit
reported done is on its branch and loads bit-exactly, and each ref's reflog ends with the
ref's value. Removing any one fsync (of objects, object directories, refs, ref
directories, reflogs) must make some power cut fail: the tests show it does.

For transfers: a push reported done is complete on the remote (a fresh fetch of the rebuilt
remote loads it bit-exactly), no remote ref ever names a commit with objects missing, a
fetch or clone reported done is loadable in the fetching repository from its durable
remote-tracking ref, and both repositories pass fsck.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from lazyfs import Cut, LazyFS, rebuild

from vrl import Repo

# ------------------------------------------------------------------ the scenario


def make_state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    slow = torch.Generator().manual_seed(100 + seed // 2)
    return {"actor.weight": torch.randn(8, 4, generator=g),  # new every commit
            "actor.bias": torch.randn(8, generator=slow),  # reused every other commit
            "critic.weight": torch.randn(300, 64, generator=slow),  # large: memory-mapped
            "step": torch.tensor(seed)}


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def run_and_cut(tmp_path: Path, monkeypatch, ignore: frozenset[str] = frozenset(),
                fsync: bool = True) -> tuple[list[Cut], LazyFS]:
    """Init, commit, branch, prune and gc under the I/O layer, recording a cut at every
    step."""
    work = tmp_path / "work"
    work.mkdir()
    done: list[tuple[str, dict[str, torch.Tensor]]] = []
    lazy = LazyFS(work, ignore)
    cuts: list[Cut] = []
    last_tree: list = [None]

    def on_step(op: str) -> None:
        tree = lazy.durable_tree()
        if cuts and tree == last_tree[0]:
            cuts[-1].done = list(done)  # same durable state: check it with the latest done
            return
        last_tree[0] = tree
        cuts.append(Cut(len(lazy.steps), op, tree, list(done)))

    lazy.on_step = on_step
    with lazy.installed(monkeypatch):
        Repo.init(work)
        done.append(("init", {}))
        repo = Repo(work, fsync=fsync)
        for seed in (0, 1, 2, 3):
            state = make_state(seed)
            done.append((repo.commit(state, message=f"c{seed}", env=False), state))
        repo.branch("side")  # a new ref, its directory entry and its reflog
        state = make_state(4)
        done.append((repo.commit(state, message="c4", env=False,
                                 ref="refs/heads/feature/deep"), state))  # new directories
        repo.prune(keep_last=2)
        repo.gc(grace=0)
        # the OS may write any directory back on its own: here, the object directories
        # with gc's deletions (prune's list must already be durable by then)
        lazy.write_back(lambda rel: rel.startswith(".vrl/objects/"))
        for seed in (5, 6):  # commits after gc: their fsyncs must not publish gc's deletes
            state = make_state(seed)           # before prune's list is durable
            done.append((repo.commit(state, message=f"c{seed}", env=False), state))
        # back to c5, outside the commit journal: replaying c6's record after a cut must
        # not move main forward again (main holds the record's old value once more)
        c5, c6 = done[-2][0], done[-1][0]
        done[-1] = ("reset", {"main": (c6, c5)})  # while it runs: either
        repo.reset("HEAD~1")
        done[-1] = ("reset", {"main": (c5,)})
        on_step("end")
    return cuts, lazy


def check_cut(cut: Cut, where: Path) -> list[str]:
    """Rebuild the durable tree and check it; return the problems found."""
    rebuild(cut.tree, where)
    problems: list[str] = []
    if not cut.done:  # `vrl init` had not returned: no repository is a fine outcome
        if not (where / ".vrl/HEAD").exists():
            return []
    try:
        repo = Repo(where, verify=True)
    except Exception as exc:  # noqa: BLE001 - any failure to open is the finding
        return [f"does not open: {type(exc).__name__}: {exc}"]
    try:
        report = repo.fsck()
    except Exception as exc:  # noqa: BLE001
        return [f"fsck raised {type(exc).__name__}: {exc}"]
    problems += report["problems"]
    pruned = repo.pruned()
    for cid, state in cut.done[1:]:  # after ("init", {})
        if cid == "reset":  # a reset reported done: main is where it was reset to
            try:
                if repo.refs.read("refs/heads/main") not in state["main"]:
                    problems.append("main is not where the reset left it")
            except Exception as exc:  # noqa: BLE001 - a damaged ref is a finding too
                problems.append(f"main after the reset: {type(exc).__name__}: {exc}")
            continue
        branch = "refs/heads/feature/deep" if state["step"].item() == 4 else "refs/heads/main"
        try:
            tip = repo.refs.read(branch)
            if cid not in repo.first_parent_chain(tip):
                problems.append(f"commit {cid[:12]} reported done is not on {branch}")
                continue
            if cid in pruned:
                continue
            got = repo.load(cid)
            for name, t in state.items():
                if got[name].dtype != t.dtype or raw(got[name]) != raw(t):
                    problems.append(f"commit {cid[:12]}: {name} differs")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"commit {cid[:12]} reported done: {type(exc).__name__}: {exc}")
    for name, oid in repo.refs.list().items():
        # the reflog is written first: its newest entry is the ref's value, or a move
        # from the ref's value that the cut stopped before the ref was written
        log = repo.refs.reflog(name)
        if not log or oid not in (log[0].new, log[0].old):
            problems.append(f"reflog of {name} does not end at its value {oid[:12]}")
    return problems


def sweep(tmp_path, monkeypatch, first_only: bool = False, run=None, check=None, **kw
          ) -> tuple[list[tuple[Any, list[str]]], LazyFS]:
    """Run a scenario (`run`, default: the store's) and check the durable state at every
    cut with `check`; return the failing cuts."""
    cuts, lazy = (run or run_and_cut)(tmp_path, monkeypatch, **kw)
    failures = []
    # the state after a cut is opened after a reboot: the commit journal is replayed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("vrl.journal.boot_id", lambda: "booted-again")
        for i, cut in enumerate(cuts):
            problems = (check or check_cut)(cut, tmp_path / f"cut{i}")
            if problems:
                failures.append((cut, problems))
                if first_only:
                    break
    return failures, lazy


@pytest.mark.parametrize("external", [False, True], ids=["packs-journaled", "packs-own-file"])
def test_every_power_cut_leaves_a_consistent_repository(tmp_path, monkeypatch, external):
    """`packs-own-file`: every commit's pack is written to its own file and fsynced in the
    record's round (as a big one is), instead of inside the journal's record."""
    if external:
        monkeypatch.setattr("vrl.journal.EXTERNAL_MIN", 0)
    failures, lazy = sweep(tmp_path, monkeypatch)
    assert len(lazy.steps) > 100  # every write, rename, fsync ... of the scenario
    # vrl runs unchanged (nothing is stopped): a cut is the durable state at that step
    assert not failures, "\n".join(f"cut before step {c.step} ({c.op}): {p}"
                                   for c, p in failures[:5])
    for kind in ("object", "object-dir", "ref", "ref-dir", "reflog", "journal"):
        assert lazy.fsyncs.get(kind), (kind, lazy.fsyncs)


@pytest.mark.parametrize("kind", ["object", "object-dir", "ref", "ref-dir", "reflog", "dir",
                                  "reflog-dir", "journal"])
def test_removing_one_kind_of_fsync_is_caught(tmp_path, monkeypatch, kind):
    """The sweep has teeth: without the fsyncs of one kind, some power cut loses data."""
    failures, lazy = sweep(tmp_path, monkeypatch, first_only=True, ignore=frozenset({kind}))
    assert lazy.fsyncs.get(kind), lazy.fsyncs
    assert failures


@pytest.mark.parametrize("broken", ["replay", "checkpoint", "epoch"])
def test_the_journals_replay_and_checkpoint_are_both_needed(tmp_path, monkeypatch, broken):
    """Teeth for the commit journal: without re-applying its records after a reboot, cuts
    lose reported commits; without checkpointing before a ref change outside it, the
    replay moves main forward again after the reset; so it does where records of an
    older epoch (left in place by a checkpoint, intact) were taken for current ones."""
    import vrl.journal as journal
    import vrl.journal_format as journal_format

    with pytest.MonkeyPatch.context() as mutant:  # (the sweep undoes its own patches)
        if broken == "replay":
            real = journal.Journal._apply
            mutant.setattr(journal.Journal, "_apply", lambda self, record, recovering,
                           sealed=None: None if recovering else
                           real(self, record, recovering, sealed))
        elif broken == "checkpoint":
            mutant.setattr(journal.Journal, "_checkpoint",
                           lambda self, handle, records, drop=False: None)
        else:  # (parse reads it from the format's module, the journal's own checks here)
            def at_record(raw, header):
                return raw[:4] == b"VJR2"

            mutant.setattr(journal_format, "at_record", at_record)
            mutant.setattr(journal, "at_record", at_record)
        failures, _ = sweep(tmp_path, monkeypatch)
    assert failures
    if broken != "replay":
        assert all(p == ["main is not where the reset left it"] for _, p in failures)


def test_without_fsync_a_power_cut_loses_commits(tmp_path, monkeypatch):
    failures, _ = sweep(tmp_path, monkeypatch, first_only=True, fsync=False)
    assert failures


# ------------------------------------------------------------------ push and fetch


@dataclass
class TransferCut:
    """The durable state at one step of the push / fetch scenario, and what was done."""

    step: int
    op: str
    tree: dict[str, bytes | None]
    pushed: list[tuple[str, str, dict[str, torch.Tensor]]]  # (remote ref, commit, state)
    fetched: list[tuple[str, str, dict[str, torch.Tensor]]]  # (tracking ref, commit, state)


def run_transfers(tmp_path: Path, monkeypatch, ignore: frozenset[str] = frozenset()
                  ) -> tuple[list[TransferCut], LazyFS]:
    """Push to a new local remote, clone it, then commit, push and fetch twice more (one
    branch in new directories), under the I/O layer; a cut at every step of the transfers.
    Repository `a` and its first commit exist before (their cuts are the sweep above's)."""
    from vrl.remote import pushing
    from vrl.remote.local import LocalRemote
    from vrl.remote.transfer import clone, fetch, push

    # critic.weight (77 KB) goes loose: the cuts cover both ways a push sends objects
    monkeypatch.setattr(pushing, "REMOTE_PACK_MAX", 64 << 10)
    work = tmp_path / "work"
    work.mkdir()
    repo = Repo.init(work / "a")
    states = {seed: make_state(seed) for seed in (0, 1, 2)}
    first = repo.commit(states[0], message="c0", env=False)
    repo.sync()  # (everything on disk now counts as durable: its files written first)
    lazy = LazyFS(work, ignore)
    cuts: list[TransferCut] = []
    pushed: list[tuple[str, str, dict[str, torch.Tensor]]] = []
    fetched: list[tuple[str, str, dict[str, torch.Tensor]]] = []
    last_tree: list = [None]

    def on_step(op: str) -> None:
        tree = lazy.durable_tree()
        if cuts and tree == last_tree[0]:
            cuts[-1].pushed, cuts[-1].fetched = list(pushed), list(fetched)
            return
        last_tree[0] = tree
        cuts.append(TransferCut(len(lazy.steps), op, tree, list(pushed), list(fetched)))

    lazy.on_step = on_step
    remote = work / "remote"
    with lazy.installed(monkeypatch):
        push(repo, LocalRemote(remote), "origin", create=True, jobs=1)
        pushed.append(("refs/heads/main", first, states[0]))
        other = clone(str(remote), work / "b", jobs=1, checkout=False)
        fetched.append(("refs/remotes/origin/main", first, states[0]))
        for seed, branch in ((1, "main"), (2, "feature/deep")):
            ref = f"refs/heads/{branch}"
            cid = repo.commit(states[seed], message=f"c{seed}", env=False, ref=ref)
            push(repo, LocalRemote(remote), "origin", [ref], jobs=1)
            pushed.append((ref, cid, states[seed]))
            fetch(other, LocalRemote(remote), "origin", jobs=1)
            fetched.append((f"refs/remotes/origin/{branch}", cid, states[seed]))
        on_step("end")
    return cuts, lazy


def _loads_exactly(repo: Repo, tip: str | None, cid: str, state: dict[str, torch.Tensor],
                   what: str) -> list[str]:
    try:
        if tip is None or cid not in repo.first_parent_chain(tip):
            return [f"{what}: commit {cid[:12]} is not on it"]
        got = repo.load(cid)
        return [f"{what}: commit {cid[:12]}: {name} differs" for name, t in state.items()
                if got[name].dtype != t.dtype or raw(got[name]) != raw(t)]
    except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
        return [f"{what}: commit {cid[:12]}: {type(exc).__name__}: {exc}"]


def check_transfer_cut(cut: TransferCut, where: Path) -> list[str]:
    """Rebuild the durable tree; check both repositories and the remote (by fetching all
    of it into a fresh repository)."""
    from vrl.remote.local import LocalRemote
    from vrl.remote.transfer import fetch

    rebuild(cut.tree, where)
    problems: list[str] = []
    for name in ("a", "b"):
        if name == "b" and not cut.fetched and not (where / "b/.vrl/HEAD").exists():
            continue  # the clone had not returned: no repository is a fine outcome
        try:
            found = Repo(where / name, verify=True).fsck()["problems"]
            problems += [f"{name}: {p}" for p in found]
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    if cut.fetched and not problems:
        other = Repo(where / "b")
        for ref, cid, state in cut.fetched:
            problems += _loads_exactly(other, other.refs.read(ref), cid, state, f"b's {ref}")
    store = LocalRemote(where / "remote", fsync=False)
    if not cut.pushed and store.state() != "store":
        return problems  # the first push had not returned: no remote is a fine outcome
    Repo.init(where / "fresh")
    fresh = Repo(where / "fresh", fsync=False)
    try:
        # every ref on the remote must name a complete commit: fetching it all verifies
        # every object behind every ref
        fetch(fresh, store, "origin", jobs=1)
    except Exception as exc:  # noqa: BLE001
        return problems + [f"remote: a fresh fetch fails: {type(exc).__name__}: {exc}"]
    for ref, cid, state in cut.pushed:
        tracking = f"refs/remotes/origin/{ref[len('refs/heads/'):]}"
        problems += _loads_exactly(fresh, fresh.refs.read(tracking), cid, state,
                                   f"remote {ref}")
    return problems


def sweep_transfers(tmp_path, monkeypatch, first_only: bool = False, **kw
                    ) -> tuple[list[tuple[TransferCut, list[str]]], LazyFS]:
    return sweep(tmp_path, monkeypatch, first_only, run_transfers, check_transfer_cut, **kw)


def test_every_power_cut_in_push_and_fetch_keeps_what_was_reported(tmp_path, monkeypatch):
    """A push reported done is complete on the remote, a remote ref never names an
    incomplete commit, a fetch (or clone) reported done is durable in the fetching
    repository, and both repositories pass fsck, at a power cut before any step."""
    failures, lazy = sweep_transfers(tmp_path, monkeypatch)
    assert len(lazy.steps) > 100
    assert not failures, "\n".join(f"cut before step {c.step} ({c.op}): {p}"
                                   for c, p in failures[:5])
    for kind in ("remote-file", "remote-dir", "object", "ref", "reflog"):
        assert lazy.fsyncs.get(kind), (kind, lazy.fsyncs)
    # the cuts covered both ways a push sends objects: the small ones as one pack per
    # push, the big tensor (critic.weight) loose
    remote = tmp_path / "work/remote/objects"
    assert len(list(remote.glob("pack/pack-*.pack"))) == 3
    assert [f for f in remote.glob("??/*") if f.stat().st_size > 64 << 10]


@pytest.mark.parametrize("kind", ["remote-file", "remote-dir", "object", "object-dir", "ref",
                                  "ref-dir"])
def test_removing_one_kind_of_fsync_in_push_or_fetch_is_caught(tmp_path, monkeypatch, kind):
    failures, lazy = sweep_transfers(tmp_path, monkeypatch, first_only=True,
                                     ignore=frozenset({kind}))
    assert lazy.fsyncs.get(kind), lazy.fsyncs
    assert failures
