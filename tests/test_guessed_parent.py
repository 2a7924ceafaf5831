"""A repository object's commits take its own last commit as the parent without reading
the ref, while nothing else was seen to move it (vrl.commit_engine.CommitEngine.commit).
The journal's compare-and-swap still decides: whatever moved the ref meanwhile (another repository
object, another process, a reset, a checkout), no commit is lost, every commit's parent
and statistics are the ref's value at its swap, and a stale guess leaves nothing behind."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vrl import Repo
from vrl.refs import RefStore

ROOT = Path(__file__).resolve().parents[1]


def _state(value: float) -> dict:
    return {"l.w": torch.full((8, 8), value), "l.b": torch.ones(8), "m.w": torch.zeros(4)}


@pytest.fixture
def path(tmp_path):
    Repo.init(tmp_path)
    repo = Repo(tmp_path)
    if not repo._journaled:
        pytest.skip("no commit journal on this system (the parent is always read)")
    return tmp_path


def _check_chain(path, expected_ids):
    """The branch's history is exactly `expected_ids` (newest first), each commit's parent
    and statistics naming the one before, and the repository checks clean."""
    fresh = Repo(path, verify=True)
    history = [e.id for e in fresh.log()]
    assert history == expected_ids
    for child, parent in zip(history, history[1:], strict=False):
        commit = fresh.read_commit(child)
        assert commit.parents == (parent,)
        assert commit.stats["parent"] == parent
    report = fresh.fsck()
    assert report["ok"] and not report["dangling_commits"], report


def test_a_lone_writer_reads_the_ref_no_more(path, monkeypatch):
    repo = Repo(path)
    ids = [repo.commit(_state(i), env=False) for i in range(3)]
    reads = []
    real = RefStore.read
    monkeypatch.setattr(RefStore, "read", lambda self, name: reads.append(name) or
                        real(self, name))
    ids += [repo.commit(_state(i), env=False) for i in range(3, 6)]
    assert "HEAD" not in reads  # (the journal's swap reads the branch itself, locked)
    _check_chain(path, ids[::-1])


def test_two_repository_objects_alternating_lose_nothing(path):
    a, b = Repo(path), Repo(path)
    ids = []
    for i in range(12):
        writer = a if i % 3 else b  # runs of two by `a`, so it comes to guess
        ids.append(writer.commit(_state(i), env=False, message=str(i)))
    _check_chain(path, ids[::-1])


def test_a_commit_of_another_process_is_the_next_parent(path):
    repo = Repo(path)
    ids = [repo.commit(_state(i), env=False) for i in range(3)]
    script = ("import sys, torch; from vrl import Repo; "
              "print(Repo(sys.argv[1]).commit({'l.w': torch.full((8, 8), 42.0), "
              "'l.b': torch.ones(8), 'm.w': torch.ones(4)}, env=False))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()[-1]
    ids.append(out)
    ids.append(repo.commit(_state(7), env=False))
    stats = repo.read_commit(ids[-1]).stats
    assert stats["parent"] == out and stats["layers"]["m"]["status"] == "changed"
    _check_chain(path, ids[::-1])


def test_a_reset_and_gc_elsewhere_leaves_no_stale_commit(path):
    repo = Repo(path)
    ids = [repo.commit(_state(i), env=False) for i in range(4)]
    other = Repo(path)
    other.reset(ids[1])
    other.gc(grace=0, expire_reflog=True)
    mine = repo.commit(_state(9), env=False)
    _check_chain(path, [mine, ids[1], ids[0]])
    assert set(Repo(path).objects.ids()) == set(Repo(path).objects.ids())  # (readable)


def test_a_checkout_elsewhere_commits_onto_the_new_branch(path):
    repo = Repo(path)
    ids = [repo.commit(_state(i), env=False) for i in range(3)]
    other = Repo(path)
    other.branch("side", ids[0])
    other.checkout("side")
    mine = repo.commit(_state(5), env=False)
    assert Repo(path).current_branch() == "side"
    assert repo.read_commit(mine).parents == (ids[0],)
    assert Repo(path).branches()["main"] == ids[-1]
    other.checkout(ids[1])  # detached
    detached = repo.commit(_state(6), env=False)
    assert repo.read_commit(detached).parents == (ids[1],)
    assert Repo(path).head() == detached


def test_the_same_state_again_after_another_commit_is_not_nothing_changed(path):
    """The guessed parent holds this very snapshot, but the ref moved on to another one:
    the commit is made (onto it), as a read parent would have it."""
    repo = Repo(path)
    for i in range(3):
        last = repo.commit(_state(1), env=False, allow_empty=True, message=str(i))
    theirs = Repo(path).commit(_state(2), env=False)
    again = repo.commit(_state(1), env=False)
    assert repo.read_commit(again).parents == (theirs,)
    from vrl.errors import WorkspaceError

    with pytest.raises(WorkspaceError, match="nothing changed"):
        repo.commit(_state(1), env=False)
    assert last != again


def test_a_reset_elsewhere_costs_a_round_and_leaves_no_commit_object_behind(path):
    repo = Repo(path)
    ids = [repo.commit(_state(i), env=False) for i in range(4)]
    Repo(path).reset(ids[1])  # (every object stays: the stale guess's swap is refused)
    mine = repo.commit(_state(9), env=False)
    assert repo.read_commit(mine).parents == (ids[1],)
    assert repo.read_commit(mine).stats["parent"] == ids[1]
    fresh = Repo(path)
    commits = {oid for oid in fresh.objects.ids() if fresh.objects.kind_and_size(oid)[0]
               == "commit"}
    assert commits == {*ids, mine}
    after = repo.commit(_state(10), env=False)  # read again, then trusted again
    assert repo.read_commit(after).parents == (mine,)
