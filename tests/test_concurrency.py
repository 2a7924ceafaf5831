"""Several processes committing to one branch at once, with readers and `gc` running
alongside: no returned commit is lost, history stays linear, refs are never torn, fsck is
clean, and gc (default grace period) never harms a commit in flight."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
from helpers import before_ref_moves, process_results, start_process

from vrl import Repo
from vrl.errors import RefConflictError
from vrl.objects import is_object_id

TIMEOUT = 60.0
WRITERS = 8  # issue 9 item 9: eight concurrent committers to one branch all land
COMMITS = 4


def pool_tensor(k: int) -> torch.Tensor:
    return torch.randn(32, 32, generator=torch.Generator().manual_seed(500 + k))


def make_state(writer: int, i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(writer * 1000 + i)
    return {
        "shared.weight": pool_tensor((writer + i) % 3),  # objects that may already exist
        "own.weight": torch.randn(16, 8, generator=g),
        "own.id": torch.tensor([writer, i], dtype=torch.int32),
    }


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_restores(repo: Repo, cid: str, state: dict[str, torch.Tensor]) -> None:
    got = repo.load(cid)
    assert list(got) == list(state)
    for name, t in state.items():
        assert got[name].dtype == t.dtype and raw(got[name]) == raw(t), (cid, name)


def backdate_objects(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    for f in (path / ".vrl/objects").rglob("*"):
        if f.is_file():
            os.utime(f, (old, old))


def make_old_unreachable_pool(path: Path) -> set[str]:
    """Objects for pool tensors 0-2 that exist, are unreachable and are older than gc's
    grace period: what a branch deleted long ago leaves behind. Returns their ids."""
    repo = Repo(path)
    for k in range(3):
        repo.commit({"shared.weight": pool_tensor(k)}, env=False, ref="refs/heads/old",
                    message=f"pool {k}")
    repo.delete_branch("old")
    repo.gc(grace=1e9, expire_reflog=True)  # forget the reflog, delete nothing
    backdate_objects(path, 2 * 3600)
    repo = Repo(path)
    unreachable = set(repo.objects.ids()) - repo.reachable()
    assert len(unreachable) == 3 * 3  # three tensors, manifests and commits
    return unreachable


# ------------------------------------------------------------------------ processes


def writer(path: str, w: int, barrier, conn) -> None:
    torch.set_num_threads(1)
    repo = Repo(path)
    barrier.wait(TIMEOUT)
    for i in range(COMMITS):
        try:
            cid = repo.commit(make_state(w, i), message=f"w{w} c{i}", env=False, step=i)
            conn.send(("ok", w, i, cid))
        except Exception as exc:  # noqa: BLE001 - reported, and failed, in the parent
            conn.send(("error", w, i, f"{type(exc).__name__}: {exc}"))
    conn.close()


def reader(path: str, barrier, stop, conn) -> None:
    """Read the branch as fast as possible: every value is a whole id of a commit whose
    objects are all present (refs move only after their objects are durable)."""
    repo = Repo(path)
    ref_file = Path(path) / ".vrl/refs/heads/main"
    barrier.wait(TIMEOUT)
    reads, problems = 0, []
    while not stop.is_set() and len(problems) < 5:
        text = ref_file.read_text()
        if not is_object_id(text.strip()) or not text.endswith("\n"):
            problems.append(f"torn ref {text!r}")
            continue
        try:
            commit = repo.read_commit(text.strip())
            manifest = repo.read_manifest(commit.manifest)
            missing = [e.id for e in manifest.tensors.values() if not repo.objects.has(e.id)]
            if missing:
                problems.append(f"{text.strip()[:12]} points at missing objects {missing}")
        except Exception as exc:  # noqa: BLE001 - report anything, fail in the parent
            problems.append(f"{type(exc).__name__}: {exc}")
        reads += 1
    conn.send((reads, problems))
    conn.close()


def collector(path: str, barrier, stop, conn) -> None:
    """`gc` with the default grace period, over and over, while commits are running."""
    repo = Repo(path)
    barrier.wait(TIMEOUT)
    passes = removed = 0
    while not stop.is_set():
        removed += repo.gc()[0]
        passes += 1
    conn.send((passes, removed))
    conn.close()


def _start(ctx, target, *args):
    return start_process(ctx, target, *args)


def _result(proc, conn) -> list:
    return process_results(proc, conn, TIMEOUT)


@pytest.mark.parametrize("with_gc", [False, True], ids=["commits", "commits+gc"])
def test_concurrent_commits_to_one_branch(tmp_path, ctx, with_gc):
    path = tmp_path / "repo"
    repo = Repo.init(path)
    base = repo.commit({"shared.weight": pool_tensor(9)}, env=False, message="base")
    if with_gc:
        make_old_unreachable_pool(path)
    extra = 2 if with_gc else 1
    barrier = ctx.Barrier(WRITERS + extra)
    stop = ctx.Event()
    procs = [_start(ctx, writer, str(path), w, barrier) for w in range(WRITERS)]
    watchers = [_start(ctx, reader, str(path), barrier, stop)]
    if with_gc:
        watchers.append(_start(ctx, collector, str(path), barrier, stop))
    try:
        results = [r for proc, conn in procs for r in _result(proc, conn)]
    finally:
        stop.set()
    reads, problems = _result(*watchers[0])[0]
    assert not problems
    assert reads > 0
    if with_gc:
        passes, _ = _result(*watchers[1])[0]
        assert passes > 0

    ok = {cid: (w, i) for status, w, i, cid in results if status == "ok"}
    failed = [r for r in results if r[0] != "ok"]
    assert len(results) == WRITERS * COMMITS
    assert not failed, failed  # every commit lands: losers re-parent while others progress
    assert len(ok) == WRITERS * COMMITS

    repo = Repo(path, verify=True)
    history = repo.log("main")
    ids = [e.id for e in history]
    # linear: one parent each, ending at the base commit, nothing else in it
    assert ids[-1] == base
    for newer, older in zip(history, history[1:], strict=False):
        assert newer.commit.parents == (older.id,)
        # a re-parented commit's layer statistics were recomputed against its real parent
        assert newer.commit.stats["parent"] == older.id
    assert set(ids) == set(ok) | {base}, "a commit that returned is not in the history"
    # each writer's commits keep their order
    for w in range(WRITERS):
        mine = [ok[c][1] for c in reversed(ids) if c in ok and ok[c][0] == w]
        assert mine == sorted(mine)
    # the reflog saw every move, each from the value the previous one left
    moves = list(reversed(repo.refs.reflog("refs/heads/main")))
    expected = list(reversed(ids))[1:] if with_gc else list(reversed(ids))  # gc expired base's
    assert [m.new for m in moves] == expected
    for prev, nxt in zip(moves, moves[1:], strict=False):
        assert nxt.old == prev.new
    report = repo.fsck()
    assert report["ok"], report["problems"]
    for cid, (w, i) in ok.items():
        assert_restores(repo, cid, make_state(w, i))


@pytest.mark.parametrize("journal", [True, False])
def test_gc_between_object_writes_and_ref_update_keeps_reused_objects(tmp_path, journal):
    """The worst interleaving, made deterministic: a commit reuses tensor objects that are
    unreachable and older than the grace period, and a `gc` (default grace) runs after
    the commit found them present but before its ref moves."""
    path = tmp_path / "repo"
    Repo.init(path).commit({"shared.weight": pool_tensor(9)}, env=False, message="base")
    make_old_unreachable_pool(path)

    committer = Repo(path, journal=journal)
    collector_repo = Repo(path)
    collected = []
    # gc's mark and sweep without the gc lock (which would make it wait for the commit),
    # as a vrl without that lock runs it: the freshened objects alone keep the commit whole
    before_ref_moves(committer, lambda: collected.append(
        collector_repo._collect(None, dry_run=False, expire_reflog=False)))
    state = make_state(0, 0)
    cid = committer.commit(state, env=False, message="reuses old objects")
    assert collected
    repo = Repo(path, verify=True)
    report = repo.fsck()
    assert report["ok"], report["problems"]
    assert_restores(repo, cid, state)


# ------------------------------------------------------------------------ stale locks


def _hold(repo: Repo, text: str, age: float = 0.0) -> Path:
    lock = repo.vrl_dir / "refs/heads/main.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(text)
    if age:
        then = time.time() - age
        os.utime(lock, (then, then))
    return lock


@pytest.fixture
def live_pid():
    """A process that is alive for the whole test (a lock 'owner' that never finishes)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_lock_older_than_a_minute_is_broken_even_if_its_owner_lives(tmp_path, live_pid):
    import socket

    from vrl.refs import STALE_LOCK_AGE

    repo = Repo.init(tmp_path)
    for owner in (f"{live_pid} {socket.gethostname()}", f"{live_pid} another-host 1"):
        lock = _hold(repo, owner + "\n")  # young: respected
        with pytest.raises(RefConflictError, match="locked by another vrl process"):
            with repo.refs.lock("refs/heads/main", timeout=0.3):
                pass
        assert lock.read_text() == owner + "\n"
        _hold(repo, owner + "\n", age=STALE_LOCK_AGE + 5)  # old: a hung or remote owner
        start = time.monotonic()
        with repo.refs.lock("refs/heads/main", timeout=0.3):
            assert lock.read_text().split()[0] == str(os.getpid())
        assert time.monotonic() - start < 0.3 and not lock.exists()


def test_a_lock_whose_pid_was_reused_is_broken(tmp_path, live_pid):
    """The pid in the lock is alive, but it is another process than the one that took the
    lock (it started at another time): the owner is dead, the lock is broken at once."""
    import socket

    from vrl.refs import _proc_start

    started = _proc_start(live_pid)
    if started is None:
        pytest.skip("no /proc: process start times are unknown here")
    repo = Repo.init(tmp_path)
    host = socket.gethostname()
    lock = _hold(repo, f"{live_pid} {host} {started}\n")  # the same process: respected
    with pytest.raises(RefConflictError, match="locked by another vrl process"):
        with repo.refs.lock("refs/heads/main", timeout=0.3):
            pass
    assert lock.exists()
    _hold(repo, f"{live_pid} {host} {int(started) + 1}\n")  # an earlier owner with that pid
    start = time.monotonic()
    with repo.refs.lock("refs/heads/main", timeout=0.3):
        # and the lock vrl writes records its own start time, for the next one to check
        assert lock.read_text().split() == [str(os.getpid()), host, _proc_start(os.getpid())]
    assert time.monotonic() - start < 0.3
