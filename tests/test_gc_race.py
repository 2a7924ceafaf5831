"""`gc` with any grace period, `--now` included, never breaks a commit made at the same time
(issue 25 item 4): commits in flight hold the gc lock shared (vrl/gclock.py), gc holds it
exclusively and waits for them, and commits that arrive wait for gc. Checked with real
processes racing, with the worst interleaving forced (gc started between a commit's look at
the store and its ref's move), and across a gc that ran between two commits of a process
that remembers what it stored."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import before_ref_moves, process_results, start_process

from vrl import Repo
from vrl.pack_set import PACK_MAX

TIMEOUT = 120.0


def pool(k: int) -> np.ndarray:
    """Content that old, unreachable objects hold (what a deleted branch left behind)."""
    return np.random.default_rng(700 + k).standard_normal(96).astype(np.float32)


def state(writer: int, i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(writer * 1000 + i)
    return {
        "pool": pool((writer + i) % 3),  # found stored: the dedup check says "present"
        "own": rng.standard_normal(64).astype(np.float32),  # new, packed
        "big": rng.standard_normal(PACK_MAX // 4 + 16).astype(np.float32),  # new, loose
        "id": np.array([writer, i], dtype=np.int32),
    }


def assert_loads(repo: Repo, cid: str, want: dict[str, np.ndarray]) -> None:
    got = repo.load(cid)  # (a repository opened with verify=True hashes what it reads)
    assert sorted(got) == sorted(want), cid
    for name, value in want.items():
        assert np.asarray(got[name]).tobytes() == value.tobytes(), (cid[:12], name)


def old_unreachable_pool(path: Path) -> set[str]:
    """The pool's tensors (with their manifests and commits) stored, unreachable and older
    than any grace period."""
    repo = Repo(path)
    for k in range(3):
        repo.commit({"pool": pool(k)}, env=False, ref="refs/heads/old", message=f"pool {k}")
    repo.delete_branch("old")
    repo.gc(grace=1e9, expire_reflog=True)  # forget the reflog, delete nothing
    old = time.time() - 7200
    for f in (path / ".vrl/objects").rglob("*"):
        if f.is_file():
            os.utime(f, (old, old))
    unreachable = set(Repo(path).objects.ids()) - Repo(path).reachable()
    assert len(unreachable) == 9
    return unreachable


def setup_repo(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    base_state = {"base": np.arange(8, dtype=np.float32)}
    base = Repo.init(path).commit(base_state, env=False, message="base")
    old_unreachable_pool(path)
    return base, base_state


def check_repository(path: Path, acknowledged: dict[str, dict[str, np.ndarray]]) -> None:
    """Every acknowledged commit is on main's history or a reflog and loads bit-exactly,
    fsck is clean, and one more commit succeeds."""
    repo = Repo(path, verify=True)
    history = {e.id for e in repo.log("main")}
    logged = {x for name in repo.refs.all_logs() for e in repo.refs.reflog(name)
              for x in (e.old, e.new) if x}
    for cid, want in acknowledged.items():
        assert cid in history or cid in logged, f"commit {cid[:12]} is on no ref or reflog"
        assert_loads(repo, cid, want)
    report = repo.fsck()
    assert report["ok"], report["problems"]
    after = state(99, 0)
    assert_loads(repo, repo.commit(after, env=False, message="after"), after)


# ------------------------------------------------------------------ real processes racing


def committer(path: str, writer: int, commits: int, journal: bool, barrier, conn) -> None:
    repo = Repo(path, journal=journal)
    barrier.wait(TIMEOUT)
    for i in range(commits):
        try:
            cid = repo.commit(state(writer, i), env=False, message=f"w{writer} c{i}")
            conn.send(("ok", writer, i, cid))
        except Exception as exc:  # noqa: BLE001 - reported, and failed, in the parent
            conn.send(("error", writer, i, f"{type(exc).__name__}: {exc}"))
    conn.close()


def collector(path: str, barrier, stop, conn) -> None:
    """`gc --now` over and over while the commits run."""
    repo = Repo(path)
    barrier.wait(TIMEOUT)
    passes, problems = 0, []
    while not stop.is_set() and len(problems) < 3:
        try:
            repo.gc(grace=0)
            passes += 1
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{type(exc).__name__}: {exc}")
    conn.send((passes, problems))
    conn.close()


def _start(ctx, target, *args):
    return start_process(ctx, target, *args)


def _results(proc, conn) -> list:
    return process_results(proc, conn, TIMEOUT)


def race(ctx, path: Path, writers: int, commits: int) -> None:
    setup_repo(path)
    barrier = ctx.Barrier(writers + 1)
    stop = ctx.Event()
    # half the writers commit through the journal, half by the three rounds of fsync
    procs = [_start(ctx, committer, str(path), w, commits, w % 2 == 0, barrier)
             for w in range(writers)]
    gc_proc = _start(ctx, collector, str(path), barrier, stop)
    try:
        results = [r for proc, conn in procs for r in _results(proc, conn)]
    finally:
        stop.set()
    [(passes, problems)] = _results(*gc_proc)
    assert not problems
    assert passes > 0
    failed = [r for r in results if r[0] != "ok"]
    assert not failed, failed  # commits wait for gc: none fails
    acknowledged = {cid: state(w, i) for status, w, i, cid in results}
    assert len(acknowledged) == writers * commits
    check_repository(path, acknowledged)


def test_gc_now_racing_committer_processes_loses_nothing(tmp_path, ctx):
    race(ctx, tmp_path / "repo", writers=4, commits=4)


@pytest.mark.slow
def test_gc_now_racing_committer_processes_loses_nothing_many_rounds(tmp_path, ctx):
    for round_ in range(10):
        race(ctx, tmp_path / f"repo{round_}", writers=4, commits=10)


@pytest.mark.slow
def test_cli_gc_now_racing_cli_commits_loses_nothing(tmp_path):
    """The issue's report, with `vrl` processes only: 4 committers x 5 `vrl commit` while
    `vrl gc --now` runs over and over."""
    from safetensors.numpy import save_file

    path = tmp_path / "repo"
    setup_repo(path)

    def run(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "vrl", "-C", str(path), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    files = {}
    for w in range(4):
        for i in range(5):
            files[w, i] = tmp_path / f"w{w}c{i}.safetensors"
            save_file(state(w, i), files[w, i])

    def writer(w: int, out: list) -> None:
        for i in range(5):
            proc = run("commit", str(files[w, i]), "-m", f"w{w} c{i}", "--no-env", "--json")
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
            out.append((w, i, proc.returncode, stdout, stderr))

    outs: list = []
    threads = [threading.Thread(target=writer, args=(w, outs)) for w in range(4)]
    for t in threads:
        t.start()
    gcs = []
    while any(t.is_alive() for t in threads):
        gc = run("gc", "--now")
        gc.communicate(timeout=TIMEOUT)
        gcs.append(gc.returncode)
    for t in threads:
        t.join()
    assert gcs and set(gcs) == {0}
    import json

    assert all(code == 0 for _, _, code, _, _ in outs), [o[4] for o in outs if o[2]]
    check_repository(path, {json.loads(stdout)["id"]: state(w, i)
                            for w, i, _, stdout, _ in outs})


# ------------------------------------------------------------------ the interleaving forced


def gc_on_a_thread(repo: Repo, **kwargs) -> tuple[threading.Thread, threading.Event, list]:
    """Start `repo.gc(**kwargs)` on a thread; the event is set once it has finished or waits
    for the gc lock (9ac282a's gc has no lock and never waits)."""
    ready = threading.Event()
    result: list = []
    if "on_wait" in inspect.signature(repo.gc).parameters:
        kwargs["on_wait"] = ready.set

    def run() -> None:
        try:
            result.append(repo.gc(**kwargs))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            result.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, ready, result


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "three-rounds"])
def test_gc_now_between_a_commits_look_at_the_store_and_its_ref_move(tmp_path, journal):
    """The commit found the pool's old unreachable objects stored and wrote its new ones;
    `gc --now` starts before its ref moves. gc waits for the commit (without the lock, it
    deleted both kinds, and the acknowledged commit was unreadable)."""
    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    committer_repo = Repo(path, journal=journal)
    collector_repo = Repo(path)
    started = []

    def start_gc() -> None:
        thread, ready, result = gc_on_a_thread(collector_repo, grace=0)
        assert ready.wait(TIMEOUT)
        started.append((thread, result))

    before_ref_moves(committer_repo, start_gc)
    want = state(0, 0)
    cid = committer_repo.commit(want, env=False, message="during gc")
    [(thread, result)] = started
    thread.join(TIMEOUT)
    check_repository(path, {cid: want, base: base_state})
    assert not isinstance(result[0], BaseException), result[0]
    assert result[0][0] == 8  # the pool's objects but the tensor the commit reuses


def test_cli_gc_now_waits_for_a_commit_in_flight(tmp_path):
    """`vrl gc --now` (another process) started while a commit is between its look at the
    store and its ref's move: it says it waits, and frees nothing the commit needs."""
    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    committer_repo = Repo(path)
    runs = []

    def start_gc() -> None:
        proc = subprocess.Popen([sys.executable, "-m", "vrl", "-C", str(path), "gc", "--now"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # a line once it waits, or "" once it has ended
        runs.append((proc, first))

    before_ref_moves(committer_repo, start_gc)
    want = state(1, 0)
    cid = committer_repo.commit(want, env=False, message="during vrl gc --now")
    [(proc, first)] = runs
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, first + err
    check_repository(path, {cid: want, base: base_state})
    assert first == "vrl gc: waiting for commits in progress to finish...\n"
    assert out.startswith("Removed 8 unreachable objects")
    log = subprocess.run([sys.executable, "-m", "vrl", "-C", str(path), "log", "--oneline"],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert log.returncode == 0 and cid[:7] in log.stdout


def test_a_commit_waits_for_a_gc_in_progress(tmp_path, monkeypatch):
    """A commit that arrives while gc marks and sweeps waits for it, then lands whole."""
    import vrl.maintenance

    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    sweeping, go = threading.Event(), threading.Event()
    real = vrl.maintenance.Maintenance.reachable

    def slow_mark(self, *args, **kwargs):  # gc's mark, held up
        sweeping.set()
        assert go.wait(TIMEOUT)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(vrl.maintenance.Maintenance, "reachable", slow_mark)
    thread, _, result = gc_on_a_thread(Repo(path), grace=0)
    assert sweeping.wait(TIMEOUT)
    committed: list = []
    want = state(2, 0)
    writer = threading.Thread(target=lambda: committed.append(
        Repo(path).commit(want, env=False, message="after the gc")))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive() and not committed  # waits for the gc
    go.set()
    thread.join(TIMEOUT)
    writer.join(TIMEOUT)
    assert result[0][0] == 9 and committed
    check_repository(path, {committed[0]: want, base: base_state})


def test_gc_inside_a_commit_of_the_same_thread_is_refused(tmp_path):
    """It would wait for itself forever; it deletes nothing and the commit lands."""
    from vrl.errors import VrlError

    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    committer_repo, collector_repo = Repo(path), Repo(path)
    errors = []

    def gc_here() -> None:
        try:
            collector_repo.gc(grace=0)
        except VrlError as exc:
            errors.append(str(exc))

    before_ref_moves(committer_repo, gc_here)
    want = state(3, 0)
    cid = committer_repo.commit(want, env=False, message="with a gc in its hook")
    assert errors and "inside a commit" in errors[0]
    # none deleted: the pool's objects but the tensor the commit reused are unreachable
    assert len(set(Repo(path).objects.ids()) - Repo(path).reachable()) == 8
    check_repository(path, {cid: want, base: base_state})


# ------------------------------------------------------------------ caches across a gc


def test_a_process_forgets_what_it_stored_once_a_gc_ran(tmp_path):
    """A training loop's process remembers its last snapshot's objects (and the pack it
    freshened a moment ago, taken as present without a look). Another process moves the
    branch back and collects them with `gc --now --expire-reflog`; the next commit must
    store them again, not name them (the gc lock's generation tells it a gc ran)."""
    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    trainer = Repo(path)
    first, second = state(4, 0), state(4, 0)
    second["own"] = second["own"] + 1
    trainer.commit(first, env=False, message="1")
    trainer.sync()  # (its pack in place: the next commit freshens it)
    trainer.commit(second, env=False, message="2")  # reuses 'pool', 'big', 'id'
    other = Repo(path)
    other.reset(base)
    other.gc(grace=0, expire_reflog=True)
    assert set(other.objects.ids()) == other.reachable()  # both commits' objects are gone
    cid = trainer.commit(second, env=False, message="3")
    check_repository(path, {cid: second, base: base_state})


# ------------------------------------------------------------------ a fetch is a writer too


def test_gc_now_during_a_fetch_keeps_what_the_fetch_found_stored(tmp_path):
    """A fetch skips the objects it finds stored (here the pool's old unreachable ones),
    writes the rest, then moves its tracking ref: `gc --now` started before that move waits
    for it (without the lock it deleted both, and origin/main named a broken snapshot)."""
    from vrl.remote import add_remote, fetch, open_named, push

    path = tmp_path / "repo"
    base, base_state = setup_repo(path)
    upstream = Repo.init(tmp_path / "upstream")
    want = state(5, 1)  # (its 'pool' tensor is pool(0): stored here, unreachable)
    theirs = upstream.commit(want, env=False, message="upstream")
    add_remote(upstream, "origin", str(tmp_path / "remote"), create=True)
    push(upstream, open_named(upstream, "origin"), "origin", ["main"])

    repo = Repo(path)
    add_remote(repo, "origin", str(tmp_path / "remote"))
    started = []
    real_update = repo.refs.update

    def update(name, *args, **kwargs):
        if name.startswith("refs/remotes/") and not started:
            thread, ready, result = gc_on_a_thread(Repo(path), grace=0)
            assert ready.wait(TIMEOUT)
            started.append((thread, result))
        return real_update(name, *args, **kwargs)

    repo.refs.update = update
    fetch(repo, open_named(repo, "origin"), "origin")
    [(thread, result)] = started
    thread.join(TIMEOUT)
    assert Repo(path).resolve("origin/main") == theirs
    check_repository(path, {theirs: want, base: base_state})
    assert not isinstance(result[0], BaseException), result[0]
