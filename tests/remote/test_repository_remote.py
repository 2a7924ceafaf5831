"""A repository used as a remote (`vrl remote add b ../other-run`) is read as the repository
itself reads it: a commit it reported may still be in its commit journal - its ref and
pack written out in the background, or left by a killed process - and a fetch, clone or
push must see that commit, never the ref as it was before it.

The write-out is held back (the journal's `_apply` waits), so these tests are
deterministic; each fails on 3f000c1, where the local-path remote read ref files only.
"""

import subprocess
import sys
import threading

import numpy as np
import pytest

from vrl import journal
from vrl.remote import add_remote, clone, fetch, open_named, push
from vrl.remote.errors import NonFastForwardError
from vrl.repo import Repo


def _state(i: int) -> dict:
    return {"w": np.full((16, 16), i, np.float32), "b": np.arange(16, dtype=np.float32) + i}


@pytest.fixture
def hold(monkeypatch):
    """`hold(repo)`: hold back the write-out of `repo`'s journaled commits made from then
    on, until a reader in this process waits for that journal or the returned event is set
    (no timing: without the wait the write-out has not happened when the reader reads)."""
    go = threading.Event()

    def install(repo: Repo) -> threading.Event:
        apply, wait = journal.Journal._apply, journal.Journal.wait
        path = repo.journal.path

        def slow(self, record, recovering, sealed=None):
            if not recovering and self.path == path:
                assert go.wait(60)
            return apply(self, record, recovering, sealed)

        def waited(self):
            if self.path == path:
                go.set()
            return wait(self)

        monkeypatch.setattr(journal.Journal, "_apply", slow)
        monkeypatch.setattr(journal.Journal, "wait", waited)
        return go

    yield install
    go.set()


def _source(tmp_path) -> tuple[Repo, str]:
    src = Repo.init(tmp_path / "src")
    first = src.commit(_state(0), env=False)
    src.sync()
    return src, first


def test_a_fetch_sees_a_commit_still_in_the_journal(tmp_path, hold):
    src, first = _source(tmp_path)
    dst = clone(str(src.workdir), tmp_path / "dst")
    assert dst.head() == first
    hold(src)
    new = src.commit(_state(1), env=False, message="second")
    assert (src.vrl_dir / "refs" / "heads" / "main").read_text().strip() == first
    add_remote(dst, "src", str(src.workdir))
    fetch(dst, open_named(dst, "src"), "src")
    assert dst.refs.read("refs/remotes/src/main") == new
    dst.reset(new)  # its objects came too
    assert np.array_equal(dst.load(new)["w"], _state(1)["w"])


def test_a_clone_in_another_process_sees_a_commit_still_in_the_journal(tmp_path, hold):
    src, _ = _source(tmp_path)
    go = hold(src)
    new = src.commit(_state(1), env=False)
    threading.Timer(2.0, go.set).start()  # the other process waits for it
    out = subprocess.run([sys.executable, "-m", "vrl", "clone", str(src.workdir),
                          str(tmp_path / "dst")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert Repo(tmp_path / "dst").head() == new


def test_a_push_into_a_repository_does_not_overwrite_a_commit_still_in_its_journal(
        tmp_path, hold):
    """The pusher builds on the old tip; the repository's new commit is not on its ref
    file yet. The push must be refused as not a fast-forward, and both commits kept."""
    src, first = _source(tmp_path)
    other = clone(str(src.workdir), tmp_path / "other")
    ours = other.commit(_state(7), env=False)
    go = hold(src)
    theirs = src.commit(_state(1), env=False)
    with pytest.raises(NonFastForwardError):
        push(other, open_named(other, "origin"), "origin")
    go.set()
    assert Repo(src.workdir).head() == theirs and other.head() == ours
    assert Repo(src.workdir).read_commit(theirs).parents == (first,)


def test_a_fetch_replays_what_a_killed_committer_left_in_the_journal(tmp_path):
    """A process that committed and was killed before writing its commit out leaves it
    only in the journal; a fetch from that repository finishes it and gets it."""
    src, first = _source(tmp_path)
    # the write-out is never started: the process dies right after the commit point
    script = ("import os, sys, numpy as np\nfrom vrl import Repo, journal\n"
              "journal.hand_off = lambda handle, job: None\n"
              "r = Repo(sys.argv[1])\n"
              "print(r.commit({'w': np.full((16, 16), 5, np.float32)}, env=False), "
              "flush=True)\n"
              "os._exit(9)\n")
    out = subprocess.run([sys.executable, "-c", script, str(src.workdir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 9, out.stderr
    new = out.stdout.strip()
    assert (src.vrl_dir / "refs" / "heads" / "main").read_text().strip() == first
    dst = Repo.init(tmp_path / "dst")
    add_remote(dst, "src", str(src.workdir))
    fetch(dst, open_named(dst, "src"), "src")
    assert dst.refs.read("refs/remotes/src/main") == new
    assert dst.load(new)["w"][0, 0] == 5 and dst.fsck()["ok"]
