"""Crash safety: a process committing snapshots is killed (SIGKILL, or an injected exit in
the middle of a write) at many points; afterwards the repository must open, fsck must find
no problem (orphan objects allowed), every ref must resolve to a complete commit, and every
snapshot the process reported as committed must restore bit-exactly.

The committing processes are forked from a multiprocessing fork server that has already
imported torch and vrl, so a kill-and-restart costs milliseconds instead of seconds.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
import torch

import vrl.direct_io
import vrl.object_store
import vrl.refs
from vrl import Repo
from vrl.errors import RefConflictError

READY = "ready"
TIMEOUT = 30.0  # bound on any single wait


def make_state(seed: int) -> dict[str, torch.Tensor]:
    """The snapshot committed for `seed`: some tensors change every commit, some every
    few commits (reused objects), one never; mixed dtypes and a 0-d tensor."""
    g = torch.Generator().manual_seed(seed)
    slow = torch.Generator().manual_seed(10_000 + seed // 3)
    return {
        "actor.0.weight": torch.randn(24, 16, generator=g),
        "actor.0.bias": torch.randn(24, generator=slow).to(torch.bfloat16),
        "critic.weight": torch.randint(-128, 127, (40,), generator=slow, dtype=torch.int8),
        "mask": torch.arange(12) % 3 == 0,
        "step": torch.tensor(seed),
    }


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_restores(repo: Repo, cid: str, seed: int) -> None:
    got = repo.load(cid)
    want = make_state(seed)
    assert list(got) == list(want), cid
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, (cid, name)
        assert raw(got[name]) == raw(t), (cid, name)


# ------------------------------------------------------------------------ child side


def _install_fault(fault: tuple[str, int] | None) -> None:
    """Make the k-th call of a write-path function die half-way, like a power cut."""
    if fault is None:
        return
    where, k = fault
    calls = [0]

    def due() -> bool:
        calls[0] += 1
        return calls[0] >= k

    if where == "object":  # mid-object: half of a chunk reaches the temp file
        real = vrl.direct_io.write_all

        def write_all(fd, data):
            if due():
                view = memoryview(data).cast("B")
                real(fd, view[: len(view) // 2])
                os._exit(99)
            real(fd, data)

        vrl.direct_io.write_all = write_all
    elif where == "ref":  # lock held, ref's temp file written, not renamed yet
        real_ref = vrl.refs.RefStore._write_file

        def write_file(self, path, text, *rest, **kw):
            if due():
                tmp = path.with_name(f".tmp-{os.getpid()}-crash")
                tmp.write_text(text[: len(text) // 2])
                os._exit(99)
            real_ref(self, path, text, *rest, **kw)

        vrl.refs.RefStore._write_file = write_file
    elif where == "reflog":  # lock held, reflog being appended
        real_log = vrl.refs.RefStore._append_log

        def append_log(self, *args, **kw):
            if due():
                os._exit(99)
            return real_log(self, *args, **kw)

        vrl.refs.RefStore._append_log = append_log
    elif where in ("pack", "maint"):  # a pack durable in place, nothing after it done
        # "pack": a commit's pack (before its ref moves); "maint": repack's or gc's new
        # pack (before the files it replaces are removed)
        method = "_register_pack" if where == "pack" else "write_pack"
        real_method = getattr(vrl.object_store.FileObjectStore, method)

        def wrapper(self, *args):
            result = real_method(self, *args)
            if due():
                self.sync()
                os._exit(99)
            return result

        setattr(vrl.object_store.FileObjectStore, method, wrapper)
    else:
        raise ValueError(where)


def committer(path: str, first_seed: int, conn, fault=None, gc_every: int = 0) -> None:
    """Commit make_state(seed) for seed = first_seed, first_seed+1, ... until killed;
    report each id only after commit() returned."""
    torch.set_num_threads(1)
    repo = Repo(path)
    _install_fault(fault)
    conn.send(READY)
    seed = first_seed
    while True:
        cid = repo.commit(make_state(seed), message=f"seed {seed}", step=seed, env=False)
        conn.send((seed, cid))
        if gc_every and seed % gc_every == 0:
            repo.gc(grace=0)  # removes the orphans of earlier crashes
        seed += 1


def maintainer(path: str, first_seed: int, conn, fault=None, gc_every: int = 0) -> None:
    """Repack and collect garbage (packs rewritten) over and over until killed."""
    repo = Repo(path)
    _install_fault(fault)
    conn.send(READY)
    while True:
        repo.repack()
        repo.gc(grace=0)


# ------------------------------------------------------------------------ parent side


def _recv_ready(conn, proc) -> None:
    assert conn.poll(TIMEOUT), "child never became ready"
    assert conn.recv() == READY


def _drain(conn) -> list[tuple[int, str]]:
    out = []
    while True:
        try:
            if not conn.poll(TIMEOUT):
                raise AssertionError("child's pipe stayed open after it died")
            out.append(conn.recv())
        except EOFError:
            return out


def run_child(ctx, path: Path, first_seed: int, *, kill_after: float | None = None,
              fault=None, gc_every: int = 0, target=committer
              ) -> tuple[list[tuple[int, str]], int]:
    """Start a committer (or `target`); SIGKILL it `kill_after` seconds after it is ready
    (or let an injected fault end it). Return what it reported and its exit code."""
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(str(path), first_seed, child_conn, fault,
                                            gc_every), daemon=True)
    proc.start()
    child_conn.close()
    try:
        _recv_ready(parent_conn, proc)
        if kill_after is not None:
            time.sleep(kill_after)  # the random kill point, not synchronisation
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(TIMEOUT)
        assert proc.exitcode is not None, "child did not end"
        return _drain(parent_conn), proc.exitcode
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(TIMEOUT)
        parent_conn.close()


def check_repository(path: Path, committed: dict[int, str]) -> list[str]:
    """Everything the crash test promises, from a freshly opened repository."""
    repo = Repo(path, verify=True)
    report = repo.fsck()
    assert report["ok"], report["problems"]
    refs = dict(repo.refs.list())
    head = repo.head()
    if head is not None:
        refs["HEAD"] = head
    for name, oid in refs.items():  # each ref: a complete commit (all objects present)
        commit = repo.read_commit(oid)
        manifest = repo.read_manifest(commit.manifest)
        for entry in manifest.tensors.values():
            assert repo.objects.has(entry.id), (name, entry)
    if repo.refs.read("refs/heads/main") is None:
        assert not committed
        return []
    history = [e.id for e in repo.log("main")]
    for seed, cid in committed.items():
        assert cid in history, f"reported commit {cid[:12]} (seed {seed}) lost"
        assert_restores(repo, cid, seed)
    # linear and in commit order: each snapshot's seed is its parent's plus one
    steps = [repo.read_commit(c).step for c in history]
    assert steps == list(range(steps[0], steps[0] - len(steps), -1))
    return history


def _next_seed(path: Path) -> int:
    head = Repo(path).head()
    return 0 if head is None else Repo(path).read_commit(head).step + 1


def test_sigkill_at_random_points(tmp_path, ctx):
    path = tmp_path / "repo"
    Repo.init(path)
    rng = random.Random(1234)
    committed: dict[int, str] = {}
    exits = set()
    for round_ in range(24):
        reported, code = run_child(ctx, path, _next_seed(path),
                                   kill_after=rng.uniform(0.0, 0.35),
                                   gc_every=5 if round_ % 4 == 3 else 0)
        exits.add(code)
        committed.update(reported)
        check_repository(path, committed)
    # every child was still committing when killed (an error, e.g. a lock it could not
    # take, would have ended it with another exit code), and commits kept landing
    assert exits == {-signal.SIGKILL}
    assert len(committed) >= 10


@pytest.mark.parametrize("journal", [True, False], ids=["journal", "three-rounds"])
@pytest.mark.parametrize("where,calls", [("object", range(1, 40, 3)), ("ref", range(1, 5)),
                                         ("reflog", range(1, 5)), ("pack", range(1, 4))])
def test_injected_crash_inside_write_path(tmp_path, ctx, where, calls, journal):
    """Deterministic crash points: the k-th object chunk written half-way, a ref's temp
    file written but not renamed (lock held), a reflog append (lock held)."""
    path = tmp_path / "repo"
    config = Repo.init(path).config
    config.set("core", "journal", str(journal).lower())
    config.save()
    assert Repo(path)._journaled is journal
    committed: dict[int, str] = {}
    history: list[str] = []
    if journal and where == "object":
        # a journaled commit of these states writes one object chunk (its staged pack):
        # every k kills at the same point of a later commit, a few of them suffice
        calls = range(1, 13, 3)
    for k in calls:
        seed = _next_seed(path)
        reported, code = run_child(ctx, path, seed, fault=(where, k))
        assert code == 99, f"fault {where}#{k} never fired"
        committed.update(reported)
        before, history = len(history), check_repository(path, committed)
        if journal:
            # the fault fires after the commit point (the journal's record: the pack, the
            # reflogs and the ref are written after it, in the background, which may be
            # after commit() returned): opening the repository finished the commit being
            # materialised, whole and bit-exact, reported or not
            assert len(history) - before - len(reported) in (0, 1)
            assert_restores(Repo(path), history[0], seed + len(history) - before - 1)
        else:
            # the commit being written never landed: its objects are written before the
            # commit point (the journal's record, or the ref's rename without it)
            assert len(history) == before + len(reported)
    # every crash left the lock behind (a journaled commit takes none: the kernel
    # releases the journal's flock): the next commit must still go through
    locks = list((path / ".vrl").rglob("*.lock"))
    if not journal and where not in ("object", "pack"):
        assert locks, "the crash should have left a lock file behind"
    repo = Repo(path)
    start = time.monotonic()
    cid = repo.commit(make_state(_next_seed(path)), env=False, step=_next_seed(path))
    assert time.monotonic() - start < 5
    assert repo.head() == cid
    assert not list((path / ".vrl").rglob("*.lock"))


def test_lock_of_dead_process_is_broken(tmp_path, ctx):
    path = tmp_path / "repo"
    repo = Repo.init(path)
    repo.commit(make_state(0), env=False, step=0)
    proc = ctx.Process(target=os.getpid)  # a pid that is certainly dead afterwards
    proc.start()
    proc.join(TIMEOUT)
    lock = path / ".vrl/refs/heads/main.lock"
    lock.write_text(f"{proc.pid} {socket.gethostname()}\n")
    start = time.monotonic()
    # (a change outside the commit journal: a journaled commit takes no ref lock file)
    repo.refs.update("refs/heads/main", repo.commit(make_state(1), env=False, step=1))
    assert time.monotonic() - start < 5
    assert not lock.exists()


def test_lock_of_live_process_is_respected(tmp_path):
    path = tmp_path / "repo"
    repo = Repo.init(path)
    repo.commit(make_state(0), env=False, step=0)
    lock = path / ".vrl/refs/heads/main.lock"
    lock.write_text(f"{os.getpid()} {socket.gethostname()}\n")
    with pytest.raises(RefConflictError, match="locked by another vrl process"):
        with repo.refs.lock("refs/heads/main", timeout=0.3):
            pass
    assert lock.exists()


def test_a_late_breaker_never_breaks_a_fresh_lock(tmp_path, ctx, monkeypatch):
    """Two processes judge the same dead lock stale; the first breaks it and takes a fresh
    lock; the second, arriving late, must re-check and leave the fresh lock alone."""
    path = tmp_path / "repo"
    repo = Repo.init(path)
    proc = ctx.Process(target=os.getpid)
    proc.start()
    proc.join(TIMEOUT)
    lock = path / ".vrl/refs/heads/main.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(f"{proc.pid} {socket.gethostname()}\n")
    refs = repo.refs
    assert refs._is_stale(lock)  # the late breaker's first look
    with refs.lock("refs/heads/main"):  # the first breaker wins and holds a fresh lock
        fresh = lock.read_text()
        real = type(refs)._is_stale
        looks = iter([True])  # the late breaker still believes its first look ...
        monkeypatch.setattr(type(refs), "_is_stale",
                            staticmethod(lambda p: next(looks, None) or real(p)))
        refs._break_stale(lock)  # ... but re-checks under the break mutex
        assert lock.read_text() == fresh


def _history_with_garbage(path: Path, committed: dict[int, str], rounds: int) -> None:
    """Two more snapshots on main, and one on a branch that is deleted (gc's garbage)."""
    repo = Repo(path)
    for _ in range(rounds):
        seed = _next_seed(path)
        committed[seed] = repo.commit(make_state(seed), message=f"seed {seed}", step=seed,
                                      env=False)
    repo.commit(make_state(5000 + len(committed)), env=False, ref="refs/heads/tmp")
    repo.refs.update("refs/heads/tmp", None, reason="test: garbage")


def test_sigkill_during_repack_and_gc(tmp_path, ctx):
    """gc rewrites packs without their unreachable objects and repack merges packs, each
    killed at random points: nothing reachable may be lost."""
    path = tmp_path / "repo"
    Repo.init(path)
    rng = random.Random(99)
    committed: dict[int, str] = {}
    for _ in range(10):
        _history_with_garbage(path, committed, 2)
        _, code = run_child(ctx, path, 0, kill_after=rng.uniform(0.0, 0.25),
                            target=maintainer)
        assert code == -signal.SIGKILL
        check_repository(path, committed)
    assert len(list((path / ".vrl/objects/pack").glob("pack-*.pack"))) >= 1


@pytest.mark.parametrize("k", [1, 2], ids=["repack", "gc"])
def test_injected_crash_between_new_pack_and_removal_of_the_old(tmp_path, ctx, k):
    """The pack repack (k=1) or then gc (k=2, rewriting the merged pack without the
    garbage) writes is durable, the files it replaces are not yet removed: duplicates,
    never a loss; the next repack and gc clean up."""
    path = tmp_path / "repo"
    Repo.init(path)
    committed: dict[int, str] = {}
    for _ in range(3):
        _history_with_garbage(path, committed, 2)
    _, code = run_child(ctx, path, 0, fault=("maint", k), target=maintainer)
    assert code == 99
    check_repository(path, committed)
    repo = Repo(path)
    repo.repack()
    repo.gc(grace=0)
    assert len(list((path / ".vrl/objects/pack").glob("pack-*.pack"))) == 1
    check_repository(path, committed)
