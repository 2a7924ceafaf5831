"""Snapshots from any PyTorch training loop, committed off the training path.

    snap = vrl.Snapshotter(repo, model, optimizer, every=10, branch="run-1")
    for it in range(n):
        train_one_iteration()
        snap.step(it, metrics={"return": ret})   # copies changed tensors, returns at once
    snap.close()                                  # (or use it as a context manager)

The training thread pays only for handing over the tensors that changed since the last
snapshot: it copies them into one shared-memory region and sends a small JSON job to a
committer process (`vrl.committer`), which hashes, computes layer statistics, writes and
fsyncs objects, moves the branch and the best tag and applies retention, without competing
with training for the GIL. Change detection reads every byte: a tensor whose autograd
version counter moved is copied; one whose counter did not move (a write through `.data`
does not move it) is hashed with xxh3-128 and compared with the digest the committer
computed of the copy it received (half the memory traffic of a byte compare; the held copy
is released once that digest is back), or byte-compared with the held copy while the digest
is still on its way; it is copied if anything differs. `committer="thread"` commits on a
thread of the training process instead (the default where the process mode is
unavailable: no memfd / descriptor passing).

At most `queue_size + 1` snapshots are in flight: when the committer falls behind, `step`
blocks (backpressure). A background failure is raised in the training thread at the next
call. Pending snapshots are flushed on close, at interpreter exit, on Ctrl-C (the
KeyboardInterrupt reaches the `with` block) and on SIGTERM; if the training process is
killed outright, the committer process still commits every snapshot it received.
"""

from __future__ import annotations

import atexit
import collections
import json
import mmap
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vrl.errors import VrlError
from vrl.object_store import DIRECT_MIN, direct_offset
from vrl.repo import Repo

ALIGN = 64  # tensor offsets in a region: any dtype may view its bytes
DIGEST_THREADS = 4  # threads that hash a snapshot's unchanged tensors (memory-bound beyond)
PARALLEL_DIGEST_MIN = 16 << 20  # bytes: below, one thread (a hand-off costs more)
THREAD_POOL_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CLOSE_TIMEOUT = 600.0  # seconds the committer process gets to finish after close()


def rng_state() -> dict[str, Any]:
    """Every global RNG state: Python, numpy, torch CPU and (if present) CUDA / NPU."""
    import numpy as np
    import torch

    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        state["npu"] = npu.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured (the store returns lists where tuples were)."""
    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state(tuple(np_state))
    torch.set_rng_state(state["torch"].clone())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.clone() for s in state["cuda"]])
    if "npu" in state and getattr(torch, "npu", None) is not None:
        torch.npu.set_rng_state(state["npu"].clone())



def process_mode_available() -> bool:
    """Shared-memory hand-over needs anonymous files and descriptor passing (Linux)."""
    return hasattr(os, "memfd_create") and hasattr(socket, "SCM_RIGHTS") and \
        hasattr(socket, "socketpair") and sys.platform.startswith("linux")


class _Region:
    """The bytes of one snapshot's copied tensors: a memfd shared with the committer
    process, or anonymous memory in thread mode. Reused once nothing views it."""

    def __init__(self, size: int, shared: bool) -> None:
        import torch

        self.size = size
        self.fd = os.memfd_create("vrl-snapshot", os.MFD_CLOEXEC) if shared else None
        if self.fd is not None:
            os.ftruncate(self.fd, size)
            # populate now: faulting in fresh pages one by one would cost the loop more
            self.mm = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED |
                                getattr(mmap, "MAP_POPULATE", 0))
        else:
            self.mm = mmap.mmap(-1, size)
        self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        # the destination views of the last layout placed in it: a training loop changes
        # the same tensors at every snapshot, and making ~60 views costs the loop ~0.6 ms
        self.layout: tuple = ()
        self.views: list[tuple[Any, Any]] = []  # (flat uint8, typed and shaped) per tensor
        self.used = 0  # bytes the current snapshot placed in it
        self.held = 0  # bytes of held copies (the last snapshot's) still viewing it
        self.in_flight = False

    def close(self) -> None:
        """Free the memory (idempotent): its descriptor at once, the mapping with the last
        view of it."""
        self.bytes = None
        self.views = []
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere; unmapped with it
            pass

    def views_for(self, layout: tuple) -> list[tuple[Any, Any]]:
        """(flat uint8, typed) views of each (offset, nbytes, dtype, shape) in `layout`; a
        dtype of None (a numpy array's bytes) gets the flat view twice."""
        if layout != self.layout:
            self.views = []
            for offset, nbytes, dtype, shape in layout:
                flat = self.bytes[offset:offset + nbytes]
                typed = flat if dtype is None or not nbytes else flat.view(dtype).view(shape)
                self.views.append((flat, typed))
            self.layout = layout
        return self.views


@dataclass
class _Held:
    """What the Snapshotter keeps of a tensor's last snapshot: what identified it then and
    the copy taken (until the committer hands back the copy's digest, then the digest)."""
    key: tuple
    version: int | None
    copy: Any  # a flat uint8 tensor, or None once the digest is known
    region: _Region | None  # the region the copy views (None: private memory or no copy)
    job: int  # the job that sent the copy (its acknowledgement carries the digest)
    digest: bytes | None = None  # xxh3-128 of the copy


def _copy_all(pairs: list[tuple[Any, Any]]) -> None:
    """Copy each live tensor into its `dst`, a view of its dtype and shape, and each
    array's flat bytes into its `dst`, a flat uint8 view. CPU tensors in one call (a
    training state is ~60 small ones: the loop pays a dispatch per call)."""
    import torch

    cpu, other = [], []
    for dst, value in pairs:
        if isinstance(value, torch.Tensor):
            (cpu if value.is_cpu else other).append((dst, value))
        else:
            dst.numpy()[:] = value
    with torch.no_grad():  # (copies of tensors that require grad record no graph)
        if cpu:
            torch._foreach_copy_([d for d, _ in cpu], [v for _, v in cpu])
        for dst, value in other:
            dst.copy_(value)


def _flat_bytes(value: Any) -> Any:
    """A CPU, contiguous, flat uint8 view (or copy, for other devices) of a tensor."""
    import torch

    t = value.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().reshape(-1).view(torch.uint8)


_LIVE: weakref.WeakSet[Snapshotter] = weakref.WeakSet()


def _wait_exit(proc: subprocess.Popen, timeout: float) -> int:
    """`proc.wait(timeout)`, returning as soon as the process ends: Popen polls with
    sleeps that double up to 50 ms (a close would wait up to twice as long as the
    committer takes to exit); a pidfd (Linux) becomes readable at the exit itself."""
    try:
        fd = os.pidfd_open(proc.pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):  # another OS, an old kernel, or already reaped
        return proc.wait(timeout=timeout)
    try:
        import select

        waiter = select.poll()  # (not select(): a training process may hold 1,024 fds)
        waiter.register(fd, select.POLLIN)
        waiter.poll(timeout * 1000)
    finally:
        os.close(fd)
    # (readable once the process has exited; reapable a moment later: Popen's first poll)
    return proc.wait(timeout=timeout)


def _flush_all() -> None:
    for snap in list(_LIVE):
        try:
            snap.close()
        except Exception:  # noqa: BLE001 - exiting anyway; the error was already raised once
            pass


atexit.register(_flush_all)


class Snapshotter:
    """Commit training snapshots from any loop, off the training path.

    Args:
        repo: the repository (or a path to one).
        model, optimizer: what to snapshot; or pass `state_fn` returning the whole tree.
        every: commit every `every` calls of `step` (1 = each call).
        branch: the branch to commit on (created if missing); None = HEAD's branch.
        queue_size: snapshots that may wait for the committer (beyond the one it is
            committing) before `step` blocks.
        best_metric: a metric name; the best snapshot so far carries tag `best_tag`.
        mode: "max" or "min" for `best_metric`.
        best_tag: the tag that follows the best snapshot; default `best/<branch>`. A tag
            the Snapshotter did not set is never moved (an error at construction).
        keep_last: after each commit, prune snapshots older than the last N (tagged and best
            ones are kept); `vrl gc` then frees their tensor data. None disables.
        include_rng: add every global RNG state under "rng" (with model/optimizer).
        committer: "process" (default where available: a committer process fed through
            shared memory, so commits never compete with training for the GIL) or "thread".
    """

    def __init__(self, repo: Repo | str, model: Any = None, optimizer: Any = None, *,
                 state_fn: Callable[[], Any] | None = None, every: int = 1,
                 branch: str | None = None, queue_size: int = 2,
                 best_metric: str | None = None, mode: str = "max",
                 best_tag: str | None = None, keep_last: int | None = None,
                 include_rng: bool = True, hparams: dict[str, Any] | None = None,
                 env: bool = True, handle_sigterm: bool = True,
                 committer: str | None = None) -> None:
        if model is None and state_fn is None:
            raise VrlError("Snapshotter needs a model or a state_fn")
        if mode not in ("max", "min"):
            raise VrlError("mode must be 'max' or 'min'")
        committer = committer or ("process" if process_mode_available() else "thread")
        if committer not in ("process", "thread"):
            raise VrlError(f"committer must be 'process' or 'thread', not {committer!r}")
        if committer == "process" and not process_mode_available():
            raise VrlError("committer='process' needs Linux (memfd and descriptor "
                           "passing); use committer='thread'")
        self.repo = repo if isinstance(repo, Repo) else Repo(repo)
        self.model, self.optimizer, self.state_fn = model, optimizer, state_fn
        self.every = max(1, every)
        self.ref = f"refs/heads/{branch}" if branch else "HEAD"
        self.best_metric, self.mode = best_metric, mode
        self.best_tag = best_tag or f"best/{branch or self.repo.current_branch() or 'HEAD'}"
        self.keep_last, self.include_rng, self.hparams = keep_last, include_rng, hparams or {}
        self.committer = committer
        best, best_at = self._owned_best() if best_metric else (None, None)
        # the committer process captures the environment itself (git and package scans,
        # a subprocess or two: off the training path), given what only we know
        self._env = {} if not env or committer == "process" else self.repo_env()
        self._calls = 0
        self._held: dict[str, _Held] = {}
        self._free: list[_Region] = []
        # every region not closed yet: held copies keep some out of `_free`, and a memfd
        # left open at close would keep its memory until the process ends
        self._regions: set[_Region] = set()
        self._limit = max(1, queue_size) + 1
        self._in_flight: dict[int, _Region | None] = {}
        self._finished: collections.deque[_Region] = collections.deque()
        self._early: set[int] = set()  # acknowledged before they were registered
        self._digests: list[tuple[int, dict[str, str]]] = []  # (job, digests) acknowledged
        self._cv = threading.Condition()
        self._next_id = 0
        self._reset = False
        self._error: BaseException | None = None
        self._dead: str | None = None
        self._closed = False
        self.commits: list[str] = []
        config = {"ref": self.ref, "env": self._env, "best_metric": best_metric,
                  "mode": mode, "best_tag": self.best_tag, "best": best, "best_at": best_at,
                  "keep_last": keep_last}
        if committer == "process":
            if env:
                from vrl import envinfo

                config["env_process"] = envinfo.process_info()
            self._start_process(config)
        else:
            from vrl.committer import CommitWorker

            self._worker = CommitWorker(self.repo, **config)
            self._queue: queue.Queue[tuple[bytes, _Region | None] | None] = queue.Queue()
            self._thread = threading.Thread(target=self._run_thread, name="vrl-snapshotter",
                                            daemon=True)
            self._thread.start()
        _LIVE.add(self)
        if handle_sigterm:
            self._install_sigterm()

    def _owned_best(self) -> tuple[float | None, str | None]:
        """The metric and commit of the snapshot already tagged best (a resumed run keeps
        it). Refuses a tag that a Snapshotter did not set: it is the user's, not ours."""
        from vrl.committer import BEST_REASON

        name = self.best_tag
        tags = self.repo.tags()
        clash = [t for t in tags if name.startswith(t + "/") or t.startswith(name + "/")]
        if clash:
            raise VrlError(f"best tag {name!r} clashes with tag {clash[0]!r}; pass another "
                           "best_tag (--best-tag)")
        tagged = tags.get(name)
        if tagged is None:
            return None, None
        log = self.repo.refs.reflog(f"refs/tags/{name}")
        if not log or log[0].new != tagged or not log[0].reason.startswith(BEST_REASON):
            raise VrlError(f"tag {name!r} exists and was not set by a Snapshotter, which "
                           "never moves a tag it did not create; pass another best_tag or "
                           f"delete the tag (vrl tag -d {name})")
        value = self.repo.read_commit(tagged).metrics.get(self.best_metric)
        return (float(value) if isinstance(value, (int, float)) else None), tagged

    def repo_env(self) -> dict[str, Any]:
        from vrl import envinfo

        return envinfo.capture(self.repo.workdir)

    # ------------------------------------------------------------------ training thread
    def step(self, step: int | None = None, metrics: dict[str, Any] | None = None,
             message: str | None = None, force: bool = False,
             meta: dict[str, Any] | None = None) -> bool:
        """Maybe snapshot (every `every` calls, or when forced). Returns True if queued."""
        self._raise_pending()
        self._calls += 1
        if not force and (self._calls - 1) % self.every:
            return False
        self.snapshot(step, metrics, message, meta)
        return True

    def snapshot(self, step: int | None = None, metrics: dict[str, Any] | None = None,
                 message: str | None = None, meta: dict[str, Any] | None = None) -> None:
        """Copy the state now and hand its commit over (blocks while too many are in
        flight). What is committed is the state at this call, whatever training does next."""
        from vrl.tensors import flatten

        self._raise_pending()
        if self._closed:
            raise VrlError("this Snapshotter is closed")
        metrics = dict(metrics or {})
        if message is None:
            shown = ", ".join(f"{k} {_fmt(v)}" for k, v in list(metrics.items())[:2])
            message = f"iter {step}" + (f": {shown}" if shown else "")
        self._wait(lambda: len(self._in_flight) < self._limit)
        self._reap()
        tensors, tree, ties = flatten(self._state())
        job = {"id": self._next_id, "reset": self._reset, "tree": tree, "ties": ties,
               "message": message, "step": step, "metrics": metrics,
               "hparams": dict(self.hparams), "meta": dict(meta or {})}
        try:  # the JSON is the copy of everything but the tensors
            text = json.dumps(job, separators=(",", ":"), default=_plain)
        except (TypeError, ValueError) as exc:
            raise VrlError(f"snapshot metadata is not JSON: {exc}") from exc
        job_id = job["id"]
        specs, region = self._copy_changed(tensors, ties, job_id)
        payload = (text[:-1] + ',"tensors":' + json.dumps(specs, separators=(",", ":"))
                   + "}").encode()
        self._next_id += 1
        self._reset = False
        if region is not None:
            region.in_flight = True
        try:
            self._submit(payload, region)
        except OSError as exc:
            self._dead = self._dead or f"the committer process is gone ({exc})"
            self._raise_pending()
        # registered only once handed over: a signal handler that closes us meanwhile
        # must not wait for a job the committer never got
        with self._cv:
            if job_id in self._early:  # acknowledged already
                self._early.discard(job_id)
                if region is not None:
                    self._finished.append(region)
            else:
                self._in_flight[job_id] = region

    def _copy_changed(self, tensors: dict[str, Any], ties: dict[str, str], job_id: int
                      ) -> tuple[dict[str, Any], _Region | None]:
        """Decide per tensor: the same bytes as the last snapshot's, or copy it now."""
        import numpy as np
        import torch

        touched: set[_Region] = set()
        self._take_digests(touched)
        for old in touched:  # a region whose copies all gave way to digests is free now
            self._recycle(old)
        touched = set()  # recycled at the end, when their fate is known
        specs: dict[str, Any] = {}
        todo: list[tuple[str, Any, tuple, int | None, str, int]] = []
        check: list[tuple[tuple[str, Any, tuple, int | None, str, int], bytes]] = []
        for name, value in tensors.items():
            if name in ties:
                specs[name] = None
                continue
            if isinstance(value, torch.Tensor):  # (no detach: these reads need none)
                numel = value.numel()
                key = ("cpu" if value.is_cpu else str(value.device),
                       value.untyped_storage().data_ptr() if numel else 0,
                       value.storage_offset(), tuple(value.shape), value.stride(),
                       value.dtype)
                version = None if value.is_inference() else value._version
                nbytes = numel * value.element_size()
                dtype = str(value.dtype).removeprefix("torch.")
            else:
                value = np.ascontiguousarray(value)
                if value.dtype.byteorder == ">":
                    value = value.astype(value.dtype.newbyteorder("<"))
                key = (value.__array_interface__["data"][0], value.shape, value.dtype.str)
                version, nbytes, dtype = None, value.nbytes, f"numpy:{value.dtype.str}"
            held = self._held.get(name)
            # an unchanged version counter is confirmed by reading every byte (writes
            # through `.data` or in-place ops on a detached alias do not move it)
            if held is not None and held.key == key and held.version == version:
                if held.digest is not None:  # (all hashed at once, below)
                    check.append(((name, value, key, version, dtype, nbytes), held.digest))
                    continue
                if _same_bytes(value, held.copy):
                    specs[name] = {"same": True}
                    continue
            todo.append((name, value, key, version, dtype, nbytes))
        for (item, digest), now in zip(check, _digests([c[0][1] for c in check]),
                                       strict=True):
            if now == digest:
                specs[item[0]] = {"same": True}
            else:
                todo.append(item)
        seen = set(tensors) - set(ties)
        for name in list(self._held):
            if name not in seen:
                self._drop_held(name, touched)
        offsets, size = [], 0
        for *_rest, nbytes in todo:
            if nbytes >= DIRECT_MIN:  # (where the committer can write its bulk directly)
                size = direct_offset(size)
            offsets.append(size)
            size += -(-nbytes // ALIGN) * ALIGN
        region = self._alloc(size) if size else None
        if region is not None:
            region.used = size
            # (a tensor's key holds its shape and dtype; an array's copy is its flat bytes)
            views = region.views_for(tuple(
                (offset, nbytes, key[5], key[3]) if isinstance(value, torch.Tensor) else
                (offset, nbytes, None, (nbytes,))
                for (_name, value, key, *_rest, nbytes), offset in zip(todo, offsets,
                                                                       strict=True)))
        else:  # nothing but empty tensors changed: nothing to copy
            empty = torch.empty(0, dtype=torch.uint8)
            views = [(empty, empty)] * len(todo)
        # every copy before any bookkeeping: a copy that fails leaves what is held as it
        # was, and its region free for the next snapshot
        try:
            _copy_all([(typed, value if isinstance(value, torch.Tensor)
                        else value.reshape(-1).view(np.uint8))
                       for (_name, value, *_rest, nbytes), (_flat, typed) in zip(
                           todo, views, strict=True) if nbytes])
        except BaseException:
            if region is not None:
                self._recycle(region)
            raise
        for (name, value, key, version, dtype, nbytes), offset, (flat, _typed) in zip(
                todo, offsets, views, strict=True):
            self._drop_held(name, touched)
            self._held[name] = _Held(key, version, flat, region, job_id)
            if region is not None:
                region.held += nbytes
            specs[name] = {"dtype": dtype, "shape": list(value.shape), "offset": offset,
                           "nbytes": nbytes}
        for old in touched - {region}:
            self._recycle(old)
        return {n: specs[n] for n in tensors}, region

    def _drop_held(self, name: str, touched: set[_Region]) -> None:
        old = self._held.pop(name, None)
        if old is not None:
            self._release_copy(old, touched)

    @staticmethod
    def _release_copy(held: _Held, touched: set[_Region]) -> None:
        if held.region is not None:
            held.region.held -= held.copy.numel()
            touched.add(held.region)
        held.copy, held.region = None, None

    def _take_digests(self, touched: set[_Region]) -> None:
        """Digests the committer sent back replace the held copies they describe (a copy
        taken by a later job than the digest's stays: it holds newer bytes)."""
        with self._cv:
            acked, self._digests = self._digests, []
        for job_id, digests in acked:
            for name, digest in digests.items():
                held = self._held.get(name)
                if held is not None and held.job == job_id and held.digest is None:
                    held.digest = bytes.fromhex(digest)
                    self._release_copy(held, touched)

    # ------------------------------------------------------------------ regions
    def _alloc(self, size: int) -> _Region:
        fits = [r for r in self._free if size <= r.size <= 2 * size + (1 << 20)]
        if fits:
            region = min(fits, key=lambda r: r.size)
            self._free.remove(region)
            return region
        region = _Region(-(-size // (1 << 16)) * (1 << 16), self.committer == "process")
        self._regions.add(region)
        return region

    def _recycle(self, region: _Region) -> None:
        """Reuse a region nothing views any more; move the last held copies out of a
        mostly stale one, so old regions do not pile up behind a few frozen tensors."""
        if region.in_flight or region in self._free:
            return
        if region.held and region.held * 2 < region.used:
            for held in self._held.values():
                if held.region is region:  # (a digest-only entry has no region)
                    held.copy, held.region = held.copy.clone(), None
            region.held = 0
        if region.held == 0:
            self._free.append(region)
            while len(self._free) > self._limit + 1:
                old = self._free.pop(0)
                self._regions.discard(old)
                old.close()

    def _reap(self) -> None:
        """Regions of snapshots the committer has finished with become reusable."""
        with self._cv:
            done = list(self._finished)
            self._finished.clear()
        for region in done:
            region.in_flight = False
            self._recycle(region)

    # ------------------------------------------------------------------ hand-over
    def _submit(self, payload: bytes, region: _Region | None) -> None:
        """Hand over one job (its JSON, serialised once, is the copy of all but tensors)."""
        if self.committer == "thread":
            self._queue.put((payload, region))
            return
        from vrl.committer import send_message

        send_message(self._sock, payload, region.fd if region is not None else None)

    def _on_ack(self, ack: dict[str, Any]) -> None:
        """Called on the committer's side of the parent (reader or worker thread)."""
        with self._cv:
            if ack.get("commit"):
                self.commits.append(ack["commit"])
                if ack.get("digests"):
                    self._digests.append((ack["id"], ack["digests"]))
            if ack.get("error") and self._error is None:
                self._error = VrlError(ack["error"])
            if ack["id"] in self._in_flight:
                region = self._in_flight.pop(ack["id"])
                if region is not None:
                    self._finished.append(region)
            else:
                self._early.add(ack["id"])
            self._cv.notify_all()

    def _wait(self, ready: Callable[[], bool]) -> None:
        """Wait for `ready`, but notice a dead committer instead of hanging."""
        with self._cv:
            while not ready():
                if self._dead or self._error is not None:
                    break
                self._cv.wait(0.5)
        self._raise_pending()

    def _start_process(self, config: dict[str, Any]) -> None:
        from vrl.committer import send_message

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # no BLAS/OpenMP thread pools: numpy's import alone starts one thread per core,
        # which spin on the trainer's cores (the committer hashes on one core at most)
        env.update({name: "1" for name in THREAD_POOL_VARS})
        try:
            # its own session: a Ctrl-C in the terminal reaches only the trainer, which
            # flushes; the committer then ends at the end of its input
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "vrl.committer", str(theirs.fileno())],
                pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        except OSError as exc:
            ours.close()
            raise VrlError(f"cannot start the committer process: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        send_message(ours, {**config, "repo": str(self.repo.workdir),
                            "fsync": self.repo.objects.fsync,
                            "verify": self.repo.objects.verify_reads})
        self._reader = threading.Thread(target=self._read_acks, name="vrl-committer-acks",
                                        daemon=True)
        self._reader.start()

    def _read_acks(self) -> None:
        from vrl.committer import recv_message

        try:
            while (message := recv_message(self._sock)) is not None:
                self._on_ack(message[0])
        except (OSError, VrlError, ValueError):
            pass
        code = self._proc.wait()
        with self._cv:
            if self._in_flight or not self._closed:
                lost = len(self._in_flight)
                self._dead = f"the committer process exited (code {code})" + \
                    (f"; {lost} snapshot(s) may not be committed" if lost else "")
            self._cv.notify_all()

    def _run_thread(self) -> None:
        while (item := self._queue.get()) is not None:
            payload, region = item
            job = json.loads(payload)
            ack: dict[str, Any] = {"id": job["id"]}
            view = memoryview(region.mm) if region is not None else None
            try:
                cid = self._worker.run(job, view)
                ack.update({"commit": cid, "digests": self._worker.digests} if cid
                           else {"skipped": True})
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                ack["error"] = str(exc) or type(exc).__name__
            finally:
                if view is not None:
                    view.release()
            self._on_ack(ack)

    # ------------------------------------------------------------------ flush and close
    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Wait until every snapshot handed over is committed; raise a background error."""
        self._wait(lambda: not self._in_flight)
        self._reap()

    def close(self) -> None:
        """Flush and stop the committer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            with self._cv:
                while self._in_flight and not self._dead:
                    self._cv.wait(0.5)
        finally:
            self._stop()
            _LIVE.discard(self)
            self._restore_sigterm()
            self._reap()
            self._held.clear()
            for region in self._regions:
                region.close()
            self._regions.clear()
            self._free.clear()
        self._raise_pending()

    def _stop(self) -> None:
        if self.committer == "thread":
            self._queue.put(None)
            self._thread.join()
            return
        try:
            self._sock.shutdown(socket.SHUT_WR)  # end of file: the committer exits
        except OSError:
            pass
        try:
            _wait_exit(self._proc, CLOSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._dead = "the committer process did not finish in time and was killed"
        self._reader.join()
        self._sock.close()

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _state(self) -> Any:
        if self.state_fn is not None:
            return self.state_fn()
        from vrl.tensors import to_state

        state: dict[str, Any] = {"model": to_state(self.model)}
        if self.optimizer is not None:
            state["optimizer"] = to_state(self.optimizer)
        if self.include_rng:
            state["rng"] = rng_state()
        return state

    def _raise_pending(self) -> None:
        with self._cv:
            error, self._error = self._error, None
            dead = self._dead
        if error is not None:
            # the snapshots after the failed one were dropped; the next one goes in full
            touched: set[_Region] = set()
            for name in list(self._held):
                self._drop_held(name, touched)
            for region in touched:
                self._recycle(region)
            self._reset = True
            raise VrlError(f"background snapshot failed: {error}") from error
        if dead is not None:
            raise VrlError(f"background snapshot failed: {dead}")

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._sigterm = (previous, None)
        entered = threading.Event()

        def on_sigterm(signum: int, frame: Any) -> None:
            if entered.is_set():  # a re-delivery (see _watch_sigterm) while flushing
                return
            entered.set()
            try:
                self.close()
            finally:
                signal.signal(signal.SIGTERM, previous)
                if callable(previous):
                    previous(signum, frame)
                else:
                    raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_sigterm)
        self._sigterm = (previous, on_sigterm)
        self._watch_sigterm(entered)

    def _watch_sigterm(self, entered: threading.Event) -> None:
        """Make sure a SIGTERM reaches our handler promptly.

        CPython runs a Python signal handler only when the main thread next executes
        bytecode. A signal that lands just before the main thread blocks in a C call (a
        `time.sleep`, a wait; easily hit when a committer thread competes for the GIL) or
        that the kernel hands to another thread leaves the handler pending until that call
        returns: a trainer sleeping or waiting would not flush, nor exit, until then. The
        interpreter's wakeup fd says a signal arrived; a watcher thread then interrupts
        the main thread (EINTR, after which the interpreter runs the pending handler).
        Skipped when someone else (asyncio, a framework) already owns the wakeup fd.
        """
        try:
            ours, theirs = socket.socketpair()
            theirs.setblocking(False)
        except OSError:
            return
        try:
            old = signal.set_wakeup_fd(theirs.fileno(), warn_on_full_buffer=False)
        except (ValueError, OSError):
            old = None
        if old != -1:
            if old is not None:
                signal.set_wakeup_fd(old)
            ours.close()
            theirs.close()
            return
        self._wakeup = (ours, theirs)
        main = threading.main_thread().ident
        assert main is not None

        def watch() -> None:
            try:
                while data := ours.recv(256):
                    if int(signal.SIGTERM) not in data:
                        continue
                    # normally the handler starts at once; give it a moment first
                    if entered.wait(0.2) or self._closed:
                        continue
                    signal.pthread_kill(main, signal.SIGTERM)
            except (OSError, ValueError):
                pass

        threading.Thread(target=watch, name="vrl-sigterm-watch", daemon=True).start()

    def _restore_sigterm(self) -> None:
        previous, ours = getattr(self, "_sigterm", (None, None))
        if ours is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is ours:
            signal.signal(signal.SIGTERM, previous)
        wakeup = getattr(self, "_wakeup", None)
        if wakeup is not None:
            self._wakeup = None
            reader, writer = wakeup
            try:
                old = signal.set_wakeup_fd(-1)
                if old != writer.fileno():
                    signal.set_wakeup_fd(old)  # not ours any more: leave it as it was
            except (ValueError, OSError):
                pass
            writer.close()
            reader.shutdown(socket.SHUT_RDWR)  # the watcher ends
            reader.close()


def _same_bytes(value: Any, held: Any) -> bool:
    """Byte equality of a live tensor / array and a held flat uint8 copy (so -0.0 vs 0.0
    and NaN payloads count as changes). By the C library's memcmp where there is one:
    torch.equal on bytes is ~20x slower, and this runs on every unchanged tensor at every
    snapshot, in the training loop."""
    import torch

    if isinstance(value, torch.Tensor):
        live = _flat_bytes(value)
    else:
        live = torch.from_numpy(value.reshape(-1).view("uint8"))
    size = live.numel()
    if size != held.numel():
        return False
    memcmp = _memcmp()
    if memcmp is not None and size and live.is_contiguous() and held.is_contiguous() and \
            live.device.type == held.device.type == "cpu":
        return memcmp(live.data_ptr(), held.data_ptr(), size) == 0
    return torch.equal(live, held)


def _bytes_of(value: Any) -> tuple[Any, int, Any]:
    """(address, size, what keeps the bytes alive) of a live tensor's / array's bytes as a
    flat CPU buffer (a view where it is one already, else a copy)."""
    import torch

    if isinstance(value, torch.Tensor):
        live = _flat_bytes(value)
        return live.data_ptr(), live.numel(), live
    import numpy as np

    flat = np.ascontiguousarray(value).reshape(-1).view("uint8")
    return flat.ctypes.data, flat.nbytes, flat


def _xxh3(address: int, size: int, keep: Any = None) -> bytes:
    """xxh3-128 of `size` bytes at `address` (big-endian, as xxhash's digest gives it):
    through the xxhash module's own C function called by ctypes where it has one (ctypes
    releases the GIL, so several run at once), else through the module."""
    c_xxh3 = _c_xxh3()
    if c_xxh3 is None or not size:
        import ctypes

        import xxhash

        return xxhash.xxh3_128_digest((ctypes.c_char * size).from_address(address)
                                      if size else b"")
    value = c_xxh3(address, size)
    return value.high.to_bytes(8, "big") + value.low.to_bytes(8, "big")


def _digests(values: list[Any]) -> list[bytes]:
    """xxh3-128 of each live tensor's / array's bytes, as the committer hashes its copy;
    big ones on several cores at once (the loop waits for them: every byte of every
    unchanged tensor is read at each snapshot)."""
    spans = [_bytes_of(value) for value in values]
    total = sum(span[1] for span in spans)
    workers = min(_cores(), DIGEST_THREADS)
    if workers < 2 or total < PARALLEL_DIGEST_MIN or _c_xxh3() is None:
        return [_xxh3(*span) for span in spans]
    # one job per thread, with byte counts alike (a thread per tensor would pay a hand-off
    # per tensor): the biggest first, each to the least loaded
    shares: list[list[int]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for i in sorted(range(len(spans)), key=lambda i: -spans[i][1]):
        least = loads.index(min(loads))
        shares[least].append(i)
        loads[least] += spans[i][1]
    out: list[bytes] = [b""] * len(spans)

    def run(share: list[int]) -> None:
        for i in share:
            out[i] = _xxh3(*spans[i])

    pool = _digest_pool(workers - 1)
    futures = [pool.submit(run, share) for share in shares[1:]]
    run(shares[0])
    for future in futures:
        future.result()
    return out


_C_XXH3: list[Any] = []
_POOL: list[Any] = []


def _cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share,
    where os.cpu_count() gives the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _c_xxh3() -> Any:
    """XXH3_128bits from the xxhash module's extension (it exports the C library's
    functions), checked against the module's own digest once; None where that fails."""
    if not _C_XXH3:
        func = None
        try:
            import ctypes

            import xxhash
            from xxhash import _xxhash

            class Hash128(ctypes.Structure):
                _fields_ = [("low", ctypes.c_uint64), ("high", ctypes.c_uint64)]

            func = ctypes.CDLL(_xxhash.__file__).XXH3_128bits
            func.restype = Hash128
            func.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            probe = bytes(range(256)) * 5
            got = func(probe, len(probe))
            if got.high.to_bytes(8, "big") + got.low.to_bytes(8, "big") != \
                    xxhash.xxh3_128_digest(probe):
                func = None
        except (ImportError, OSError, AttributeError, TypeError):
            func = None
        _C_XXH3.append(func)
    return _C_XXH3[0]


def _digest_pool(threads: int) -> Any:
    if not _POOL or _POOL[0][0] != os.getpid():  # (a forked child has no threads)
        from concurrent.futures import ThreadPoolExecutor

        _POOL[:] = [(os.getpid(), ThreadPoolExecutor(threads, "vrl-digest"))]
    return _POOL[0][1]


_MEMCMP: list[Any] = []


def _memcmp() -> Any:
    """libc's memcmp through ctypes (which releases the GIL for it), or None."""
    if not _MEMCMP:
        try:
            import ctypes

            memcmp = ctypes.CDLL(None).memcmp
            memcmp.restype = ctypes.c_int
            memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        except (OSError, AttributeError, TypeError):  # no C library to load (Windows)
            memcmp = None
        _MEMCMP.append(memcmp)
    return _MEMCMP[0]


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def lightning_callback(repo: Repo | str, every: int = 1, **kwargs: Any) -> Any:
    """A PyTorch Lightning callback that snapshots model + optimizer every `every` epochs."""
    try:
        from lightning.pytorch.callbacks import Callback  # type: ignore[import-not-found]
    except ImportError:
        try:
            from pytorch_lightning.callbacks import Callback  # type: ignore[import-not-found]
        except ImportError as exc:
            raise VrlError("the Lightning callback needs PyTorch Lightning: "
                           "pip install lightning") from exc

    class VrlCallback(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.snap: Snapshotter | None = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self.snap = Snapshotter(repo, pl_module, optimizer, every=every, **kwargs)

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            assert self.snap is not None
            metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                       if getattr(v, "numel", lambda: 1)() == 1}
            self.snap.step(trainer.global_step, metrics=metrics)

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self.snap is not None:
                self.snap.close()

    return VrlCallback()
