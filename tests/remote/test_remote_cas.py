"""Remote refs move by compare-and-swap: deterministic tests, the interleaving forced.

Pusher A reads the remote ref; before it writes, pusher B pushes in full; then A goes on.
A must be refused with the non-fast-forward error (naming both heads) and B's commit must
stay. Each test also runs with A's check removed (its swap given the version it finds at
that moment, i.e. last writer wins): then B's commit is lost, which shows the interleaving
really happened and that the test fails without the check. Against a local path, S3 and
Azure (conditional writes), GCS (generation preconditions), and the generic fsspec lock
file (memory://, SFTP).
"""

import pytest

from vrl.errors import RefConflictError
from vrl.objects import ObjectId
from vrl.remote import add_remote, clone, fetch, open_named, open_remote, push
from vrl.remote.base import RemoteStore
from vrl.remote.errors import NonFastForwardError
from vrl.repo import Repo
from vrl.testing.remote_conformance import (
    RemoteCase,
    azure_case,
    gcs_case,
    make_history,
    memory_case,
    s3_case,
    ssh_case,
)

BACKENDS = ["local", "memory", "s3", "ssh", "gs", "az"]


@pytest.fixture(params=BACKENDS)
def case(request, tmp_path) -> RemoteCase:
    if request.param == "local":
        return RemoteCase(str(tmp_path / "remote.vrl"))
    if request.param == "memory":
        return memory_case()
    if request.param == "s3":
        return s3_case(request.getfixturevalue("s3"))
    if request.param == "gs":
        return gcs_case(request.getfixturevalue("gcs"))
    if request.param == "az":
        return azure_case(request.getfixturevalue("azurite"))
    return ssh_case(request.getfixturevalue("ssh"))


def _without_check(store: RemoteStore) -> None:
    """Remove this store's compare-and-swap check: every swap is given the version found
    at that moment, so it always succeeds (last writer wins)."""
    real = store.swap
    store.swap = lambda key, data, expected: real(key, data, store.read_versioned(key)[1])


def _pause_after_first_read(store: RemoteStore, meanwhile) -> list[str]:
    """Run `meanwhile()` right after this store's first read of a ref: between the pusher's
    read of the remote ref and its compare-and-swap."""
    real = store.read_ref
    done: list[str] = []

    def read_ref(name: str):
        got = real(name)
        if not done:
            done.append(name)
            meanwhile()
        return got

    store.read_ref = read_ref
    return done


def _pushers(tmp_path, case: RemoteCase, base_commits: int = 1) -> tuple[Repo, Repo]:
    """Two clones of one remote history."""
    base = Repo.init(tmp_path / "base")
    add_remote(base, "origin", case.url, case.options, create=True)
    make_history(base, base_commits)
    push(base, open_named(base, "origin"), "origin")
    return tuple(clone(case.url, tmp_path / name, options=case.options) for name in "ab")


def _remote_tip(case: RemoteCase, branch: str = "main") -> ObjectId | None:
    """The remote's branch, read through a connection of its own."""
    store = open_remote(case.url, case.options)
    try:
        return store.read_ref(f"refs/heads/{branch}")[0]
    finally:
        store.close()


@pytest.mark.parametrize("broken", [False, True], ids=["", "without-the-check"])
def test_a_push_that_loses_the_race_is_refused_and_keeps_the_winner(tmp_path, case, broken):
    a, b = _pushers(tmp_path, case)
    ours = make_history(a, 1, seed=1)[-1]
    theirs = make_history(b, 1, seed=2)[-1]
    store = open_named(a, "origin")
    if broken:
        _without_check(store)
    paused = _pause_after_first_read(store, lambda: push(b, open_named(b, "origin"),
                                                         "origin"))
    if broken:
        push(a, store, "origin")
        assert paused and _remote_tip(case) == ours  # theirs is lost
        return
    with pytest.raises(NonFastForwardError) as err:
        push(a, store, "origin")
    assert paused == ["refs/heads/main"]
    message = str(err.value)
    assert "rejected (not a fast-forward)" in message and ours[:12] in message and \
        theirs[:12] in message and "\n" not in message
    assert _remote_tip(case) == theirs
    check = clone(case.url, tmp_path / "check", options=case.options)
    assert check.head() == theirs and check.fsck()["ok"]
    assert a.head() == ours  # the loser's commit is kept where it was made


@pytest.mark.parametrize("broken", [False, True], ids=["", "without-the-check"])
def test_two_pushes_creating_one_branch_exactly_one_wins(tmp_path, case, broken):
    a, b = _pushers(tmp_path, case)
    a.branch("topic")
    b.branch("topic")
    a.checkout("topic")
    b.checkout("topic")
    ours = make_history(a, 1, seed=3)[-1]
    theirs = make_history(b, 1, seed=4)[-1]
    store = open_named(a, "origin")
    if broken:
        _without_check(store)
    _pause_after_first_read(store, lambda: push(b, open_named(b, "origin"), "origin"))
    if broken:
        push(a, store, "origin")
        assert _remote_tip(case, "topic") == ours  # theirs is lost
        return
    with pytest.raises(NonFastForwardError):
        push(a, store, "origin")
    assert _remote_tip(case, "topic") == theirs


def test_a_push_that_builds_on_the_winner_retries_and_keeps_both(tmp_path, case):
    """B pushes, between A's read and A's swap, a commit A's tip descends from: A's swap
    fails on the stale version, A reads again, sees a fast-forward and wins the retry."""
    a, b = _pushers(tmp_path, case)
    theirs = make_history(b, 1, seed=5)[-1]
    add_remote(a, "b", str(b.workdir))  # A has B's commit, the remote does not yet
    fetch(a, open_named(a, "b"), "b")
    a.reset(theirs)
    ours = make_history(a, 1, seed=6)[-1]
    store = open_named(a, "origin")
    swaps: list[object] = []
    real = store.swap

    def counting(key, data, expected):
        swaps.append(expected)
        return real(key, data, expected)

    store.swap = counting
    _pause_after_first_read(store, lambda: push(b, open_named(b, "origin"), "origin"))
    result = push(a, store, "origin")
    assert result.updates[0].status == "fast-forward"
    assert len(swaps) == 2  # the first refused, the retry on the version B left
    assert _remote_tip(case) == ours
    assert theirs in a.first_parent_chain(ours)


@pytest.mark.parametrize("broken", [False, True], ids=["", "without-the-check"])
def test_a_stale_version_is_refused_by_the_store(tmp_path, case, broken):
    """The store primitive: read, another writer swaps, the stale swap fails."""
    a, b = _pushers(tmp_path, case)
    store, other = open_named(a, "origin"), open_named(b, "origin")
    if broken:
        _without_check(store)
    tip, version = store.read_ref("refs/heads/main")
    new_b = ObjectId("b" * 64)
    other.cas_ref("refs/heads/main", new_b, other.read_ref("refs/heads/main")[1])
    if broken:
        store.cas_ref("refs/heads/main", ObjectId("a" * 64), version)
        assert store.read_ref("refs/heads/main")[0] == "a" * 64  # b's write is lost
        return
    with pytest.raises(RefConflictError, match="changed meanwhile"):
        store.cas_ref("refs/heads/main", ObjectId("a" * 64), version)
    assert store.read_ref("refs/heads/main")[0] == new_b
    # creating a ref: both see it absent, the second create fails
    assert store.read_ref("refs/heads/new") == (None, None)
    other.cas_ref("refs/heads/new", new_b, None)
    with pytest.raises(RefConflictError):
        store.cas_ref("refs/heads/new", ObjectId("a" * 64), None)
    assert store.read_ref("refs/heads/new")[0] == new_b
    assert tip is not None
