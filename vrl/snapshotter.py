"""Snapshots from any PyTorch training loop, committed off the training path.

    snap = Snapshotter(repo, model, optimizer, every=10, branch="run-1")
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

Its parts: the shared-memory regions the copies go into (`vrl.handover`), the byte checks
that decide what changed (`vrl.bytecheck`), the SIGTERM flush (`vrl.sigterm`), the global
RNG states it adds (`vrl.rng`) and the committer (`vrl.committer`).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from vrl.bytecheck import _digests, _same_bytes
from vrl.direct_io import DIRECT_MIN, direct_offset
from vrl.errors import VrlError
from vrl.handover import ALIGN, _copy_all, _Held, _Region, process_mode_available
from vrl.repo import Repo
from vrl.rng import rng_state
from vrl.sigterm import SigtermFlush

THREAD_POOL_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CLOSE_TIMEOUT = 600.0  # seconds the committer process gets to finish after close()


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


def _owned_best(repo: Repo, name: str, metric: str) -> tuple[float | None, str | None]:
    """The metric and commit of the snapshot already tagged `name`, the best tag (a
    resumed run keeps it). Refuses a tag that a Snapshotter did not set: it is the user's,
    not ours."""
    from vrl.committer import BEST_REASON

    tags = repo.tags()
    clash = [t for t in tags if name.startswith(t + "/") or t.startswith(name + "/")]
    if clash:
        raise VrlError(f"best tag {name!r} clashes with tag {clash[0]!r}; pass another "
                       "best_tag (--best-tag)")
    tagged = tags.get(name)
    if tagged is None:
        return None, None
    log = repo.refs.reflog(f"refs/tags/{name}")
    if not log or log[0].new != tagged or not log[0].reason.startswith(BEST_REASON):
        raise VrlError(f"tag {name!r} exists and was not set by a Snapshotter, which "
                       "never moves a tag it did not create; pass another best_tag or "
                       f"delete the tag (vrl tag -d {name})")
    value = repo.read_commit(tagged).metrics.get(metric)
    return (float(value) if isinstance(value, (int, float)) else None), tagged


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
        best, best_at = _owned_best(self.repo, self.best_tag, best_metric) \
            if best_metric else (None, None)
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
        self._sigterm: SigtermFlush | None = None
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
            self._sigterm = SigtermFlush(self.close, lambda: self._closed)
            self._sigterm.install()

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
            if self._sigterm is not None:
                self._sigterm.restore()
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


def _plain(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
