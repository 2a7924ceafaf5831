"""Snapshots from any PyTorch training loop, committed in the background.

    snap = vrl.Snapshotter(repo, model, optimizer, every=10, branch="run-1")
    for it in range(n):
        train_one_iteration()
        snap.step(it, metrics={"return": ret})   # copies changed tensors, returns at once
    snap.close()                                  # (or use it as a context manager)

The training thread pays only for copying tensors that changed since the last snapshot
(unchanged ones are recognised by the autograd version counter plus a sampled probe, and
their previous copy is reused, so the store does not re-hash them either). Commits run on a
background thread behind a bounded queue: when the store falls behind, `step` blocks
(backpressure) instead of piling up copies. A background failure is raised in the training
thread at the next call. Pending snapshots are flushed on close, at interpreter exit, on
Ctrl-C (the KeyboardInterrupt reaches the `with` block) and on SIGTERM.
"""

from __future__ import annotations

import atexit
import copy
import math
import queue
import random
import signal
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vrl.errors import VrlError
from vrl.repo import Repo


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


@dataclass
class _Job:
    state: Any
    message: str
    step: int | None
    metrics: dict[str, Any]
    hparams: dict[str, Any]
    meta: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)
    commit: str | None = None


_LIVE: weakref.WeakSet[Snapshotter] = weakref.WeakSet()


def _flush_all() -> None:
    for snap in list(_LIVE):
        try:
            snap.close()
        except Exception:  # noqa: BLE001 - exiting anyway; the error was already raised once
            pass


atexit.register(_flush_all)


class Snapshotter:
    """Commit training snapshots from any loop, in the background.

    Args:
        repo: the repository (or a path to one).
        model, optimizer: what to snapshot; or pass `state_fn` returning the whole tree.
        every: commit every `every` calls of `step` (1 = each call).
        branch: the branch to commit on (created if missing); None = HEAD's branch.
        queue_size: snapshots that may wait for the committer before `step` blocks.
        best_metric: a metric name; the best snapshot so far carries tag `best_tag`.
        mode: "max" or "min" for `best_metric`.
        keep_last: after each commit, prune snapshots older than the last N (tagged and best
            ones are kept); `vrl gc` then frees their tensor data. None disables.
        include_rng: add every global RNG state under "rng" (with model/optimizer).
    """

    def __init__(self, repo: Repo | str, model: Any = None, optimizer: Any = None, *,
                 state_fn: Callable[[], Any] | None = None, every: int = 1,
                 branch: str | None = None, queue_size: int = 2,
                 best_metric: str | None = None, mode: str = "max", best_tag: str = "best",
                 keep_last: int | None = None, include_rng: bool = True,
                 hparams: dict[str, Any] | None = None, env: bool = True,
                 handle_sigterm: bool = True) -> None:
        if model is None and state_fn is None:
            raise VrlError("Snapshotter needs a model or a state_fn")
        if mode not in ("max", "min"):
            raise VrlError("mode must be 'max' or 'min'")
        self.repo = repo if isinstance(repo, Repo) else Repo(repo)
        self.model, self.optimizer, self.state_fn = model, optimizer, state_fn
        self.every = max(1, every)
        self.ref = f"refs/heads/{branch}" if branch else "HEAD"
        self.best_metric, self.mode, self.best_tag = best_metric, mode, best_tag
        self.keep_last, self.include_rng, self.hparams = keep_last, include_rng, hparams or {}
        self._env = self.repo_env() if env else {}
        self._best: float | None = self._tagged_best()
        self._calls = 0
        self._shadow: dict[str, tuple[tuple, int, bytes, Any]] = {}
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, queue_size))
        self._error: BaseException | None = None
        self._closed = False
        self.commits: list[str] = []
        self._thread = threading.Thread(target=self._run, name="vrl-snapshotter", daemon=True)
        self._thread.start()
        _LIVE.add(self)
        if handle_sigterm:
            self._install_sigterm()

    def _tagged_best(self) -> float | None:
        """The metric of the snapshot already tagged best (a resumed run keeps it)."""
        if not self.best_metric:
            return None
        tagged = self.repo.tags().get(self.best_tag)
        value = self.repo.read_commit(tagged).metrics.get(self.best_metric) if tagged else None
        return float(value) if isinstance(value, (int, float)) else None

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
        """Copy the state now and queue its commit (blocks while the queue is full)."""
        self._raise_pending()
        if self._closed:
            raise VrlError("this Snapshotter is closed")
        metrics = dict(metrics or {})
        if message is None:
            shown = ", ".join(f"{k} {_fmt(v)}" for k, v in list(metrics.items())[:2])
            message = f"iter {step}" + (f": {shown}" if shown else "")
        job = _Job(self._copy(self._state()), message, step, metrics, dict(self.hparams),
                   dict(meta or {}))
        while True:  # wait for room, but notice a dead committer instead of hanging
            try:
                self._queue.put(job, timeout=0.5)
                break
            except queue.Full:
                self._raise_pending()

    @property
    def closed(self) -> bool:
        return self._closed

    def flush(self) -> None:
        """Wait until every queued snapshot is committed; raise a background error."""
        self._queue.join()
        self._raise_pending()

    def close(self) -> None:
        """Flush and stop the committer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.join()
        finally:
            self._queue.put(None)
            self._thread.join()
            _LIVE.discard(self)
            self._restore_sigterm()
        self._raise_pending()

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

    def _copy(self, tree: Any, path: str = "") -> Any:
        """Detach the snapshot from live training state: CPU copies of changed tensors,
        the previous copy of unchanged ones, deep copies of everything else."""
        import torch

        from vrl.tensors import probe

        if isinstance(tree, torch.Tensor):
            key = (str(tree.device), tree.untyped_storage().data_ptr() if tree.numel() else 0,
                   tree.storage_offset(), tuple(tree.shape), tree.stride(), tree.dtype)
            version = -1 if tree.is_inference() else tree._version
            sample = probe(tree) if tree.numel() else b""
            old = self._shadow.get(path)
            if old is not None and old[0] == key and old[1] == version and old[2] == sample:
                return old[3]
            cpu = tree.detach().to("cpu", copy=True)
            self._shadow[path] = (key, version, sample, cpu)
            return cpu
        if isinstance(tree, dict):
            return {k: self._copy(v, f"{path}/{k}") for k, v in tree.items()}
        if isinstance(tree, list):
            return [self._copy(v, f"{path}/{i}") for i, v in enumerate(tree)]
        if isinstance(tree, tuple):
            return tuple(self._copy(v, f"{path}/{i}") for i, v in enumerate(tree))
        return copy.deepcopy(tree)

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise VrlError(f"background snapshot failed: {error}") from error

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGTERM)
        self._sigterm = (previous, None)

        def on_sigterm(signum: int, frame: Any) -> None:
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

    def _restore_sigterm(self) -> None:
        previous, ours = getattr(self, "_sigterm", (None, None))
        if ours is not None and threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGTERM) is ours:
            signal.signal(signal.SIGTERM, previous)

    # ------------------------------------------------------------------ committer thread
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure, drop work until it is raised
                    self._commit(job)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._error = exc
            finally:
                if job is not None:
                    job.done.set()
                self._queue.task_done()

    def _commit(self, job: _Job) -> None:
        repo = self.repo
        cid = repo.commit(job.state, message=job.message, hparams=job.hparams,
                          metrics=job.metrics, step=job.step, env=self._env, meta=job.meta,
                          allow_empty=True, ref=self.ref)
        job.commit = cid
        self.commits.append(cid)
        value = job.metrics.get(self.best_metric) if self.best_metric else None
        if isinstance(value, (int, float)) and math.isfinite(value) and (
                self._best is None or (value > self._best if self.mode == "max"
                                       else value < self._best)):
            self._best = float(value)
            repo.tag(self.best_tag, cid, force=True)
        if self.keep_last:
            repo.prune(keep_last=self.keep_last, refs=[self.ref])


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
