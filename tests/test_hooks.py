"""Background snapshots (Snapshotter) and retention (prune)."""

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_same, small_policy

from vrl import Repo
from vrl.errors import PrunedError, VrlError
from vrl.hooks import Snapshotter, rng_state, set_rng_state
from vrl.interrupt import InterruptLatch


@pytest.fixture(params=["process", "thread"])
def committer(request):
    return request.param


def train_steps(model, opt, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        loss = model(torch.randn(16, 8, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_snapshots_hold_model_optimizer_rng_and_metadata(repo, committer):
    model = small_policy()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    expected = []
    with Snapshotter(repo, model, opt, every=2, branch="run", hparams={"lr": 1e-2},
                     committer=committer) as snap:
        for it in range(6):
            train_steps(model, opt, 1, seed=it)
            if snap.step(it, metrics={"return": float(it)}):
                expected.append(({k: v.clone() for k, v in model.state_dict().items()},
                                 torch.get_rng_state().clone()))
    log = repo.log("run")
    assert [e.commit.step for e in log] == [4, 2, 0]
    assert log[0].commit.message == "iter 4: return 4"
    assert log[0].commit.hparams == {"lr": 0.01}
    for entry, (weights, rng) in zip(reversed(log), expected, strict=True):
        state = repo.load(entry.id)
        assert_same(weights, state["model"])
        assert_same(rng, state["rng"]["torch"])
        assert set(state["optimizer"]) == {"state", "param_groups"}


def test_restoring_rng_state_reproduces_random_draws():
    import random

    import numpy as np

    state = rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1))
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1)) == a


def test_vrl_hooks_still_names_what_moved_out_of_it():
    import vrl.handover
    import vrl.hooks
    import vrl.rng
    import vrl.snapshotter

    assert vrl.hooks.Snapshotter is vrl.snapshotter.Snapshotter
    assert vrl.hooks.process_mode_available is vrl.handover.process_mode_available
    assert (vrl.hooks.rng_state, vrl.hooks.set_rng_state) == (vrl.rng.rng_state,
                                                              vrl.rng.set_rng_state)


def test_unchanged_layers_are_not_copied_or_rehashed(repo, monkeypatch, committer):
    import vrl.snapshotter

    copied = []
    real_copy = vrl.snapshotter._copy_all
    monkeypatch.setattr(vrl.snapshotter, "_copy_all",
                        lambda pairs: (copied.extend(tuple(v.shape) for _, v in pairs),
                                       real_copy(pairs)))
    model = small_policy()
    model[0].requires_grad_(False)  # a frozen layer
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    snap = Snapshotter(repo, model, opt, include_rng=False, committer=committer)
    snap.step(0)
    snap.flush()
    assert len(copied) == 4  # every tensor once
    first = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    objects_before = set(repo.objects.ids())
    copied.clear()
    train_steps(model, opt, 1)
    snap.step(1)
    snap.close()
    assert sorted(copied) == [(4,), (4, 32)]  # layer 2 only: layer 0 was not copied again
    second = repo.read_manifest(repo.read_commit(repo.head()).manifest)
    assert second.tensors["model/0.weight"].id == first.tensors["model/0.weight"].id
    assert second.tensors["model/2.weight"].id != first.tensors["model/2.weight"].id
    new_tensors = [o for o in set(repo.objects.ids()) - objects_before
                   if repo.objects.kind_and_size(o)[0] == "tensor"]
    assert len(new_tensors) == 2  # layer 2's weight and bias only
    assert [lc.layer for lc in repo.diff("HEAD").material] == ["model/2"]


def test_snapshot_is_isolated_from_later_training(repo, committer):
    model = small_policy()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    snap = Snapshotter(repo, model, opt, queue_size=4, committer=committer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    snap.step(0)
    train_steps(model, opt, 3)  # may run while the commit is still queued
    snap.close()
    assert_same(before, repo.load("HEAD")["model"])


def test_background_error_surfaces_at_next_call(repo, committer):
    model = small_policy()
    snap = Snapshotter(repo, model, branch="run", committer=committer, include_rng=False)
    snap.step(0)
    snap.flush()
    objects = repo.vrl_dir / "objects"
    objects.rename(repo.vrl_dir / "objects.away")
    objects.write_text("not a directory")  # a real failure: no object can be written
    try:
        with torch.no_grad():
            model[0].bias.add_(1)
        snap.step(1)
        with pytest.raises(VrlError, match="background snapshot failed: "):
            snap.flush()
    finally:
        objects.unlink()
        (repo.vrl_dir / "objects.away").rename(objects)
    with torch.no_grad():
        model[2].bias.add_(1)
    snap.step(2)  # goes in full: the failed snapshot's tensors are not in the store
    snap.close()
    assert [e.commit.step for e in repo.log("run")] == [2, 0]
    assert_same(model.state_dict(), repo.load("run")["model"])
    assert repo.fsck()["ok"]


class held_journal:
    """Hold the commit journal as a live vrl process does while it commits (its flock):
    commits wait."""

    def __init__(self, repo):
        self.fd = os.open(repo.vrl_dir / "journal", os.O_RDWR)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # (releases the flock)
            self.fd = None

    def __exit__(self, *exc):
        self.release()


def test_step_returns_before_the_commit_lands(repo, committer):
    model = small_policy()
    snap = Snapshotter(repo, model, branch="run", committer=committer)
    with held_journal(repo):  # the committer cannot finish while we hold it
        start = time.perf_counter()
        snap.step(0)
        elapsed = time.perf_counter() - start
        time.sleep(0.5)
        assert repo.refs.read("refs/heads/run") is None  # not committed yet ...
    assert elapsed < 5  # ... yet step returned (a synchronous commit waits 10 s)
    snap.close()
    assert [e.commit.step for e in repo.log("run")] == [0]


def test_backpressure_blocks_instead_of_queueing_without_bound(repo, committer):
    model = small_policy()
    snap = Snapshotter(repo, model, branch="run", queue_size=1, include_rng=False,
                       committer=committer)
    took = []
    with held_journal(repo) as lock:
        threading.Timer(1.5, lock.release).start()
        for i in range(4):
            with torch.no_grad():
                model[0].bias.add_(1)
            start = time.perf_counter()
            snap.step(i)
            took.append(time.perf_counter() - start)
    snap.close()
    assert max(took[:2]) < 1.0  # two in flight (one committing, one waiting) ...
    assert took[2] > 0.5  # ... the third waits for the committer
    assert len(repo.log("run")) == 4


def test_best_snapshot_is_tagged_and_tag_moves(repo, committer):
    model = small_policy()
    with Snapshotter(repo, model, best_metric="return", committer=committer) as snap:
        for it, ret in enumerate([1.0, 5.0, 3.0, 7.0, 2.0]):
            with torch.no_grad():
                model[0].bias.add_(1)
            snap.step(it, metrics={"return": ret})
    by_step = {e.commit.step: e.id for e in repo.log()}
    assert repo.tags() == {"best/main": by_step[3]}
    # it moved exactly at each improvement
    assert [e.new for e in repo.refs.reflog("refs/tags/best/main")] == \
        [by_step[3], by_step[1], by_step[0]]
    # a resumed run keeps the best so far and moves it only past it
    with Snapshotter(repo, model, best_metric="return", committer=committer) as snap:
        for it, ret in [(5, 6.0), (6, 8.0)]:
            with torch.no_grad():
                model[0].bias.add_(1)
            snap.step(it, metrics={"return": ret})
    assert repo.read_commit(repo.resolve("best/main")).step == 6


def test_a_users_own_best_tag_is_never_moved(repo, committer):
    model = small_policy()
    first = repo.commit(model, env=False)
    repo.tag("best", first)
    repo.tag("best-run", first)
    with pytest.raises(VrlError, match="clashes with tag 'best'"):
        Snapshotter(repo, model, best_metric="return", committer=committer)
    with pytest.raises(VrlError, match="not set by a Snapshotter"):
        Snapshotter(repo, model, best_metric="return", best_tag="best-run",
                    committer=committer)
    with Snapshotter(repo, model, best_metric="return", best_tag="top",
                     committer=committer) as snap:
        with torch.no_grad():
            model[0].bias.add_(1)
        snap.step(1, metrics={"return": 1.0})
    assert repo.tags()["best"] == repo.tags()["best-run"] == first
    assert repo.tags()["top"] == repo.head() != first


MUTATIONS = ["data_element", "data_copy", "no_grad_inplace", "view_write", "resize",
             "negative_zero", "nan_payload"]


def mutate(kind, state, rng):
    """Writes RL code makes that the autograd version counter may not see."""
    w, t = state["w"], state["t"]
    if kind == "data_element":  # one element, at a random position
        i, j = rng.randrange(w.shape[0]), rng.randrange(w.shape[1])
        w.data[i, j] += 0.5
    elif kind == "data_copy":  # a soft target-network update
        w.data.copy_(0.99 * w.data + 0.01 * torch.ones_like(w))
    elif kind == "no_grad_inplace":
        with torch.no_grad():
            w.mul_(1.5)
    elif kind == "view_write":
        w.data.view(-1)[rng.randrange(w.numel())] = 42.0
    elif kind == "resize":
        t.data = torch.cat([t.data, torch.ones(3)])  # same tensor object, grown
    elif kind == "negative_zero":
        k = rng.randrange(t.numel())
        t.data[k] = 0.0
        return lambda: t.data.__setitem__(k, -0.0)
    elif kind == "nan_payload":
        k = rng.randrange(t.numel())
        t.data.view(torch.int32)[k] = 0x7FC00000
        return lambda: t.data.view(torch.int32).__setitem__(k, 0x7FC00001)
    return None


def exact_state():
    torch.manual_seed(1)
    # 256 kB: big enough that the old sampled probe could miss a write
    return {"w": torch.nn.Parameter(torch.randn(256, 256)), "t": torch.randn(1000)}


@pytest.mark.parametrize("settle", [False, True], ids=["queued", "settled"])
@pytest.mark.parametrize("kind", MUTATIONS)
def test_every_write_is_committed_by_the_snapshotter(repo, kind, committer, settle):
    """queued: snapshots follow each other before the committer answers, so a tensor is
    checked against the held copy; settled: each commit has landed, so against the
    digest the committer sent back."""
    import random

    state = exact_state()
    rng = random.Random(kind)
    expected = []

    def step(snap, i):
        snap.step(i)
        expected.append({k: v.detach().clone() for k, v in state.items()})
        if settle:
            snap.flush()

    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        step(snap, 0)
        for i in range(1, 4):
            second = mutate(kind, state, rng)
            if second is not None:  # a change the first write set up: snapshot between
                step(snap, i * 10)
                second()
            step(snap, i)
    log = list(reversed(repo.log()))
    assert len(log) == len(expected)
    for entry, want in zip(log, expected, strict=True):
        assert_same(want, repo.load(entry.id))


def test_landed_snapshots_are_checked_by_digest_and_their_copies_released(
        repo, monkeypatch, committer):
    import vrl.snapshotter

    state = exact_state()
    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        snap.step(0)
        snap.flush()

        def no_byte_compare(value, held):
            raise AssertionError("byte-compared although the digest was back")

        monkeypatch.setattr(vrl.snapshotter, "_same_bytes", no_byte_compare)
        state["w"].data[3, 4] += 1.0  # unseen by the version counter
        snap.step(1)
        snap.flush()
        snap.step(2)  # nothing changed
        assert all(held.copy is None and held.digest is not None
                   for held in snap._held.values())
        assert not any(region.held for region in snap._free)
    first, second, third = (repo.load(e.id) for e in reversed(repo.log()))
    assert not torch.equal(first["w"], second["w"])
    assert_same(second, third)
    assert_same({k: v.detach() for k, v in state.items()}, third)


def test_a_landed_snapshots_region_is_reused_by_the_next(repo, monkeypatch, committer):
    """When every tensor changes and each commit lands before the next snapshot, one
    shared-memory region serves them all (no fresh memory to populate in the loop)."""
    import vrl.snapshotter

    made = []

    class Counted(vrl.snapshotter._Region):
        def __init__(self, size, shared):
            made.append(size)
            super().__init__(size, shared)

    monkeypatch.setattr(vrl.snapshotter, "_Region", Counted)
    state = exact_state()
    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        for i in range(4):
            with torch.no_grad():
                for t in state.values():
                    t.add_(1.0)
            snap.step(i)
            snap.flush()
    assert len(made) == 1
    assert_same({k: v.detach() for k, v in state.items()}, repo.load("HEAD"))


@pytest.mark.parametrize("kind", MUTATIONS)
def test_every_write_is_committed_by_a_bare_commit(repo, kind):
    import random

    state = exact_state()
    rng = random.Random(kind)
    repo.commit(state, env=False)
    for _ in range(3):
        second = mutate(kind, state, rng)
        if second is not None:
            repo.commit(state, env=False)
            second()
        cid = repo.commit(state, env=False)  # raises "nothing changed" if a write is missed
        assert_same({k: v.detach() for k, v in state.items()}, repo.load(cid))


def test_rehash_is_a_no_op_kept_for_compatibility(repo):
    state = exact_state()
    repo.commit(state, env=False)
    state["w"].data[7, 11] += 0.5  # the write issue 8 found lost without rehash=True
    a = repo.commit(state, env=False)
    state["w"].data[7, 11] += 0.5
    b = repo.commit(state, env=False, rehash=True)
    assert repo.load(a)["w"][7, 11] + 0.5 == repo.load(b)["w"][7, 11]


SIGTERM_SCRIPT = textwrap.dedent("""
    import fcntl, os, signal, sys, threading, time, torch
    from vrl import Repo
    from vrl.hooks import Snapshotter
    repo = Repo(sys.argv[1])
    def mine(signum, frame):
        print("previous handler called", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, mine)
    model = torch.nn.Linear(64, 64)
    snap = Snapshotter(repo, model, branch="run", queue_size=4, committer=sys.argv[2])
    held = os.open(repo.vrl_dir / "journal", os.O_RDWR)  # hold the committer back, as
    fcntl.flock(held, fcntl.LOCK_EX)  # a live vrl process committing does
    for i in range(3):
        with torch.no_grad():
            model.weight.add_(1)
        snap.step(i)
    threading.Timer(1.5, os.close, (held,)).start()
    print("queued", flush=True)
    time.sleep(60)
""")


def test_sigterm_flushes_pending_snapshots(tmp_path, committer):
    Repo.init(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, str(tmp_path), committer],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "queued"
    assert Repo(tmp_path).refs.read("refs/heads/run") is None  # nothing committed yet
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 7  # our handler flushed, then called the previous one
    assert proc.stdout.read().strip() == "previous handler called"
    repo = Repo(tmp_path)
    assert [e.commit.step for e in repo.log("run")] == [2, 1, 0]
    assert repo.fsck()["ok"]


SIGTERM_ELSEWHERE_SCRIPT = textwrap.dedent("""
    import signal, sys, threading, time, torch
    from vrl import Repo
    from vrl.hooks import Snapshotter
    repo = Repo(sys.argv[1])
    def mine(signum, frame):
        print("previous handler called", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, mine)
    model = torch.nn.Linear(8, 8)
    snap = Snapshotter(repo, model, branch="run", committer="thread")
    snap.step(0)
    # the signal trips while the main thread is blocked in C (as when it lands just before
    # the main thread blocks, or on another thread): CPython alone runs no handler until
    # the sleep returns
    threading.Timer(0.3, signal.raise_signal, (signal.SIGTERM,)).start()
    time.sleep(60)
""")


def test_sigterm_that_trips_while_the_main_thread_blocks_is_handled_promptly(tmp_path):
    Repo.init(tmp_path)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", SIGTERM_ELSEWHERE_SCRIPT, str(tmp_path)],
                          stdout=subprocess.PIPE, text=True, timeout=50)
    assert proc.returncode == 7 and proc.stdout.strip() == "previous handler called"
    assert time.monotonic() - start < 40  # not after the 60 s sleep
    assert [e.commit.step for e in Repo(tmp_path).log("run")] == [0]


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler, whatever the suite was started with (a background job
    of a non-interactive shell inherits SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupt_latch_delivers_a_swallowed_ctrl_c_again(default_sigint):
    with InterruptLatch() as latch:
        assert signal.getsignal(signal.SIGINT) != signal.default_int_handler
        latch.check()  # nothing yet
        try:  # code that swallows what lands in it (a bare except, a __del__, C code)
            signal.raise_signal(signal.SIGINT)
            time.sleep(30)
        except BaseException:  # noqa: BLE001
            pass
        with pytest.raises(KeyboardInterrupt):
            latch.check()
        with InterruptLatch() as inner, pytest.raises(KeyboardInterrupt):  # joins it
            inner.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def write_module(tmp_path, monkeypatch, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_interrupt_latch_lets_an_import_finish_then_raises(default_sigint, tmp_path,
                                                            monkeypatch):
    """A Ctrl-C inside an import (torch's import of numpy swallowed it, and left numpy
    half-imported) is raised once the import is done."""
    write_module(tmp_path, monkeypatch, "ctrl_c_in_import", """
        import signal, time
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.5)
        DONE = True
    """)
    start = time.monotonic()
    with InterruptLatch() as latch:
        with pytest.raises(KeyboardInterrupt):
            import ctrl_c_in_import  # noqa: F401
            time.sleep(30)
        assert latch.count == 1
    assert sys.modules["ctrl_c_in_import"].DONE
    assert time.monotonic() - start < 20


def test_interrupt_latch_second_ctrl_c_does_not_wait_for_the_import(default_sigint, tmp_path,
                                                                  monkeypatch):
    write_module(tmp_path, monkeypatch, "ctrl_c_twice", """
        import signal, time
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.3)
        signal.raise_signal(signal.SIGINT)
        time.sleep(30)
        DONE = True
    """)
    start = time.monotonic()
    with InterruptLatch() as latch:
        with pytest.raises(KeyboardInterrupt):
            import ctrl_c_twice  # noqa: F401
        assert latch.count == 2
        time.sleep(0.3)  # the first one is not delivered again
    assert "ctrl_c_twice" not in sys.modules
    assert time.monotonic() - start < 20


def test_interrupt_latch_leaves_other_sigint_handlers_alone(default_sigint):
    def mine(signum, frame):
        pass

    for handler in (signal.SIG_IGN, mine):
        signal.signal(signal.SIGINT, handler)
        with InterruptLatch():
            assert signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGINT) is handler


SIGKILL_SCRIPT = textwrap.dedent("""
    import os, signal, socket, sys, torch
    from vrl import Repo
    from vrl.hooks import Snapshotter
    repo = Repo(sys.argv[1])
    model = torch.nn.Linear(64, 64)
    snap = Snapshotter(repo, model, branch="run", queue_size=4)
    lock = repo.vrl_dir / "refs" / "heads" / "run.lock"  # held until we die
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text(f"{os.getpid()} {socket.gethostname()}")
    for i in range(3):
        with torch.no_grad():
            model.weight.add_(1)
        snap.step(i)
    print(snap._proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_committer_process_commits_what_it_received_when_the_trainer_is_killed(tmp_path):
    Repo.init(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", SIGKILL_SCRIPT, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert proc.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
        with open(f"/proc/{child}/stat") as f:
            if f.read().split()[2] == "Z":
                break
        time.sleep(0.1)
    repo = Repo(tmp_path)
    assert [e.commit.step for e in repo.log("run")] == [2, 1, 0]
    assert repo.fsck()["ok"]


def test_prune_keeps_recent_tagged_best_and_gc_frees_the_rest(repo):
    ids = []
    for i in range(8):
        ids.append(repo.commit({"w": torch.full((1000,), float(i)), "fixed": torch.ones(500)},
                               message=f"c{i}", metrics={"r": i}, env=False))
    repo.tag("best", ids[2])
    pruned = repo.prune(keep_last=3)
    assert sorted(pruned) == sorted([ids[0], ids[1], ids[3], ids[4]])
    assert repo.prune(keep_last=3) == []  # idempotent
    assert repo.gc(grace=0)[0] == 4  # the unique tensor of each pruned commit
    # history, metrics and stats survive; kept snapshots restore; pruned ones say so
    log = repo.log()
    assert [e.commit.metrics["r"] for e in log] == list(range(7, -1, -1))
    assert repo.diff(ids[4]).layers
    for keep in (ids[2], ids[5], ids[6], ids[7]):
        assert repo.load(keep)["fixed"].sum() == 500  # shared tensor never dropped
    with pytest.raises(PrunedError, match="pruned by retention"):
        repo.load(ids[3])
    assert repo.fsck()["ok"]


def test_snapshotter_applies_retention(repo, committer):
    model = torch.nn.Linear(4, 4)
    with Snapshotter(repo, model, keep_last=2, include_rng=False,
                     committer=committer) as snap:
        for i in range(5):
            with torch.no_grad():
                model.bias.add_(1)
            snap.step(i)
    assert len(repo.pruned()) == 3


def test_prune_cli(tmp_path, monkeypatch, capsys):
    from vrl.cli import main

    repo = Repo.init(tmp_path)
    for i in range(4):
        repo.commit({"w": torch.full((3,), float(i))}, message=f"c{i}", env=False)
    monkeypatch.chdir(tmp_path)
    assert main(["prune", "--keep-last", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "2 snapshots would be pruned; run `vrl gc` to free " \
                                   "their space"
    assert repo.pruned() == set()
    assert main(["prune", "--keep-last", "2"]) == 0
    assert len(repo.pruned()) == 2
    assert os.path.exists(tmp_path / ".vrl" / "pruned")


def test_pruned_snapshot_is_fetched_back_from_a_remote(tmp_path):
    from vrl.remote.config import add_remote, open_named
    from vrl.remote.transfer import push

    repo = Repo.init(tmp_path / "work")
    ids = [repo.commit({"w": torch.full((100,), float(i))}, env=False) for i in range(4)]
    add_remote(repo, "backup", str(tmp_path / "remote"), create=True)
    store = open_named(repo, "backup")
    push(repo, store, "backup", ["main"])
    store.close()
    assert repo.prune(keep_last=1) == ids[2::-1]
    repo.gc(grace=0)
    assert not repo.objects.has(repo.read_manifest(repo.read_commit(ids[0]).manifest)
                                .tensors["w"].id)
    assert repo.load(ids[0])["w"][0] == 0.0  # fetched back from the remote
    from vrl.remote.config import remove_remote

    remove_remote(repo, "backup")
    repo.gc(grace=0)
    with pytest.raises(PrunedError, match="add a remote that still has it"):
        repo.load(ids[1])


def test_committer_option_is_checked(repo):
    with pytest.raises(VrlError, match="committer must be 'process' or 'thread'"):
        Snapshotter(repo, small_policy(), committer="fork")


def test_committer_process_does_not_import_torch_for_a_small_policy(repo, tmp_path,
                                                                    monkeypatch):
    # importing torch takes seconds of CPU, which a small machine takes from training
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('the committer imported torch')")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(poison.parent), os.environ.get("PYTHONPATH", "")]))
    model = small_policy()
    with Snapshotter(repo, model, committer="process", best_metric="r",
                     keep_last=2) as snap:
        for i in range(3):
            with torch.no_grad():
                model[0].bias.add_(1)
            snap.step(i, metrics={"r": float(i)})
    assert [e.commit.step for e in repo.log()] == [2, 1, 0]
    assert repo.diff("HEAD").material


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_every_committer_thread_yields_to_training(repo):
    """Every thread of the committer process (receiver, committer, writers) runs niced and
    in the batch scheduling class, which never preempts the trainer on wake-up."""
    from vrl.committer import NICENESS

    state = {"w": torch.zeros(1 << 19)}  # 2 MiB: written by the store's writer threads
    with Snapshotter(repo, state_fn=lambda: state, committer="process") as snap:
        for i in range(2):
            state["w"].add_(1)
            snap.step(i)
            snap.flush()
        pid = snap._proc.pid
        threads = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            threads.append((int(fields[16]), int(fields[38])))  # nice, policy
    assert len(threads) >= 3
    assert all(nice >= NICENESS and policy == os.SCHED_BATCH for nice, policy in threads)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_committer_process_starts_no_thread_pools(repo, monkeypatch):
    """numpy's import would start an OpenBLAS thread per core in the committer (they spin
    on the trainer's cores), whatever the trainer's own settings say."""
    from vrl.snapshotter import THREAD_POOL_VARS

    for name in THREAD_POOL_VARS:
        monkeypatch.setenv(name, "4")
    with Snapshotter(repo, small_policy(), committer="process") as snap:
        snap.step(0)
        snap.flush()
        with open(f"/proc/{snap._proc.pid}/environ", "rb") as f:
            environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if item)
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4"  # (the trainer's own, untouched)
    assert {name: environ[name.encode()] for name in THREAD_POOL_VARS} == \
        {name: b"1" for name in THREAD_POOL_VARS}


def test_interrupt_latch_watcher_survives_a_collection_that_frees_a_thread_local(tmp_path):
    """The latch's watcher thread reads the main thread's frame while the main thread keeps
    entering new frames and a threading.local waits in a cycle for the collector: with a
    bare sys._current_frames() this hangs CPython 3.11.7 for good, GIL held (gh-106883;
    it hung a CI run mid-import); the watcher pauses the collector around the call."""
    script = tmp_path / "watch.py"
    script.write_text(textwrap.dedent("""
        import gc, os, threading, time
        from vrl.interrupt import _frame_of

        class Local(threading.local):
            pass

        def watch():
            for _ in range(300):
                cycle = Local(); cycle.self = cycle; del cycle  # freed only by a collection
                gc.set_threshold(1, 1000, 1000)  # the next allocation collects
                _frame_of(threading.main_thread().ident)
                gc.set_threshold(100000, 1000, 1000)
                time.sleep(0.0005)

        def step(n):
            return n + 1

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        end = time.monotonic() + 60
        while watcher.is_alive() and time.monotonic() < end:
            for i in range(1000):
                step(i)  # new frames without frame objects: reading one allocates
        print("hung" if watcher.is_alive() else "done", flush=True)
        os._exit(0)
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=env, timeout=120)
    assert result.stdout.strip() == "done", result.stderr


def test_a_reused_region_takes_each_snapshots_own_layout(repo, committer):
    """A region keeps the views of the last layout placed in it; a snapshot that changes
    other tensors, or the same bytes as another dtype or shape, lays out its own."""
    state = {"a": torch.zeros(64), "b": torch.zeros(8, 8), "c": np.zeros(16)}
    expected = []
    changes = [["a", "b", "c"], ["b"], ["a", "b", "c"], ["retype"], ["reshape"], ["a"]]
    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        for i, change in enumerate(changes):
            for name in change:
                if name == "retype":  # the same 256 bytes as int32 under the same name
                    state["b"] = torch.arange(64, dtype=torch.int32).reshape(8, 8)
                elif name == "reshape":
                    state["b"] = torch.arange(64, dtype=torch.int32).reshape(4, 16)
                elif name == "c":
                    state["c"] = state["c"] + i
                else:
                    with torch.no_grad():
                        state[name].add_(i + 1)
            snap.step(i)
            snap.flush()  # each lands: the next snapshot reuses its region
            expected.append({k: v.clone() if isinstance(v, torch.Tensor) else v.copy()
                             for k, v in state.items()})
    for entry, want in zip(reversed(repo.log()), expected, strict=True):
        got = repo.load(entry.id)
        for name, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[name].dtype == value.dtype and torch.equal(got[name], value)
            else:
                assert np.array_equal(got[name], value)


def snapshot_memfds() -> int:
    """Shared-memory regions this process holds open."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:vrl-snapshot")
        except OSError:  # (the directory's own descriptor, closed by now)
            pass
    return count


@pytest.mark.parametrize("settle", [False, True], ids=["queued", "settled"])
def test_closing_frees_every_shared_region(repo, settle):
    """Regions still viewed by held copies (the unchanged tensors') are freed at close
    too: an open memfd keeps its memory until the process ends, once per Snapshotter."""
    state = exact_state()
    before = snapshot_memfds()
    with Snapshotter(repo, state_fn=lambda: state, committer="process") as snap:
        for i in range(3):
            snap.step(i)
            if settle:
                snap.flush()
            with torch.no_grad():
                state["t"].add_(1.0)  # `w` stays: its copy holds the first region
        assert snapshot_memfds() > before
    assert snapshot_memfds() == before
    assert len(repo.log()) == 3


def test_a_hand_over_whose_copy_fails_loses_no_later_change(repo, monkeypatch, committer):
    """The copy fails (a device error, say): that snapshot raises, nothing of it is
    committed, the next one still sees every write since the last that landed, and the
    failed one's region is not leaked."""
    import vrl.snapshotter

    state = exact_state()
    before = snapshot_memfds()
    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        snap.step(0)
        state["w"].data[1, 2] += 1.0  # unseen by the version counter
        state["t"].data[5] = 7.0

        def broken(pairs):
            raise RuntimeError("copy failed")

        real = vrl.snapshotter._copy_all
        monkeypatch.setattr(vrl.snapshotter, "_copy_all", broken)
        with pytest.raises(RuntimeError, match="copy failed"):
            snap.step(1)
        monkeypatch.setattr(vrl.snapshotter, "_copy_all", real)
        snap.step(2)
    assert snapshot_memfds() == before
    assert len(repo.log()) == 2
    assert_same({k: v.detach() for k, v in state.items()}, repo.load("HEAD"))


def test_a_snapshot_of_empty_tensors_only(repo, committer):
    """Nothing to copy (every changed tensor is empty) is still a snapshot."""
    state = {"x": torch.empty(0), "y": np.zeros(0, dtype=np.float32)}
    with Snapshotter(repo, state_fn=lambda: state, committer=committer) as snap:
        snap.step(0)
        state["x"] = torch.empty(0, 3)
        snap.step(1)
        state["x"] = torch.ones(2, 3)
        snap.step(2)
    shapes = [tuple(repo.load(e.id)["x"].shape) for e in reversed(repo.log())]
    assert shapes == [(0,), (0, 3), (2, 3)]
    assert torch.equal(repo.load("HEAD")["x"], torch.ones(2, 3))
    assert repo.load("HEAD")["y"].dtype == np.float32


def test_a_snapshotted_tensor_can_still_be_resized(repo, committer):
    """The Snapshotter's change check reads the live tensor in place, not through
    `Tensor.numpy()` (which would leave its storage unresizable for the rest of the run)."""
    state = {"w": torch.ones(3), "buffer": torch.zeros(4)}
    with Snapshotter(repo, state, include_rng=False, committer=committer) as snap:
        for i in range(2):  # (the second step checks the unchanged tensor's bytes)
            snap.step(metrics={"i": i})
            snap.flush()
        state["buffer"].resize_(6)
        state["buffer"].fill_(5.0)
        snap.step(metrics={"i": 2})
        snap.flush()
    got = repo.load("HEAD")
    assert torch.equal(got["model"]["buffer"] if "model" in got else got["buffer"],
                       torch.full((6,), 5.0))


def test_the_committer_process_writes_every_file_out_before_it_ends(repo):
    """The committer ends without the interpreter's teardown, with status 0, its files all
    in place once close() returns: the ref file names the last commit and no record waits
    to be materialised (the quick exit's own test: test_journal's exit-path test)."""
    from vrl import journal

    model = small_policy()
    with Snapshotter(repo, model, committer="process") as snap:
        for i in range(3):
            with torch.no_grad():
                model[0].bias.add_(1)
            snap.step(i)
    ids = snap.commits
    assert len(ids) == 3
    assert snap._proc.returncode == 0
    assert (repo.vrl_dir / "refs" / "heads" / "main").read_text() == ids[-1] + "\n"
    data = (repo.vrl_dir / "journal").read_bytes()
    assert journal.read_header(data).applied == journal.parse(data)[1]
    assert repo.fsck()["ok"]


@pytest.mark.parametrize("path", ["parallel", "one thread", "module"])
def test_digests_of_live_tensors_are_xxh3_of_their_bytes(monkeypatch, path):
    """The change check hashes live tensors in place (on several threads where they are
    big), giving exactly xxhash's digest of their bytes, whatever their layout."""
    import numpy as np
    import xxhash

    import vrl.bytecheck

    if path == "parallel":
        monkeypatch.setattr(vrl.bytecheck, "PARALLEL_DIGEST_MIN", 0)
        monkeypatch.setattr(vrl.bytecheck, "_cores", lambda: 4)
    elif path == "module":  # no C function to call: xxhash's own digest
        monkeypatch.setattr(vrl.bytecheck, "_C_XXH3", [None])
    g = torch.Generator().manual_seed(3)
    base = torch.randn(64, 48, generator=g)
    values = [base, base.t(), base[::3, 5:], torch.zeros(0), torch.arange(7, dtype=torch.int8),
              base.to(torch.bfloat16), np.arange(300, dtype=np.float64)[::2],
              torch.nn.Parameter(torch.randn(1000, generator=g))]
    def raw(value):
        if isinstance(value, torch.Tensor):
            return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return np.ascontiguousarray(value).tobytes()

    got = vrl.bytecheck._digests(values)
    assert got == [xxhash.xxh3_128_digest(raw(v)) for v in values]
    assert len(set(got)) == len(got)


@pytest.mark.parametrize("kind", MUTATIONS)
def test_every_write_is_committed_when_digests_run_on_several_threads(repo, kind,
                                                                      monkeypatch):
    import random

    import vrl.bytecheck

    monkeypatch.setattr(vrl.bytecheck, "PARALLEL_DIGEST_MIN", 0)
    monkeypatch.setattr(vrl.bytecheck, "_cores", lambda: 4)
    state = {**exact_state(), **{f"b{i}": torch.full((100,), float(i)) for i in range(6)}}
    rng = random.Random(kind)
    expected = []
    with Snapshotter(repo, state_fn=lambda: state, committer="thread") as snap:
        for i in range(4):
            if i:
                second = mutate(kind, state, rng)
                if second is not None:
                    second()
            snap.step(i)
            snap.flush()  # landed: every unchanged tensor is checked by its digest
            expected.append({k: v.detach().clone() for k, v in state.items()})
    log = list(reversed(repo.log()))
    assert len(log) == len(expected)
    for entry, want in zip(log, expected, strict=True):
        assert_same(want, repo.load(entry.id))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pidfds are Linux's")
def test_close_waits_for_the_committer_in_a_process_with_many_files_open(repo):
    """close() waits for the committer's exit on a pidfd, whose number may be above the
    1,024 that select() takes (a training process with data loaders holds many files)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip("cannot open 1,100 files here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        model = small_policy()
        snap = Snapshotter(repo, model, committer="process")
        snap.step(0)
        snap.close()
        assert snap._proc.returncode == 0
        assert len(repo.log()) == 1
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
