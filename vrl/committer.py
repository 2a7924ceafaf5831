"""The Snapshotter's committer: hashing, statistics, object writes, fsync, ref moves, the
best tag and retention, off the training path.

The training process copies the tensors that changed into a shared-memory region (a memfd)
and sends a small JSON job plus the region's file descriptor over a Unix socket to a
committer process started with `python -m vrl.committer` (never `multiprocessing`, which
would re-run a user's unguarded training script; nothing is pickled). The committer
acknowledges each job with its commit id and the xxh3-128 digests of the tensors it
received (the training process checks the next snapshot's tensors against them), or an
error. It receives jobs on a thread of its own, so the training process never waits on a
busy committer to accept a job, and when the training process dies (even by SIGKILL) it
still commits every job it fully received, then exits at end of file.

Wire format, both ways: an 8-byte big-endian length, then that many bytes of UTF-8 JSON; a
job's region descriptor rides on the length header as SCM_RIGHTS ancillary data.

`CommitWorker` is the committing part itself; the Snapshotter's thread mode runs it on a
thread of the training process.
"""

from __future__ import annotations

import array
import json
import math
import mmap
import os
import queue
import signal
import socket
import struct
import sys
import threading
from typing import Any

from vrl.errors import VrlError

_HEADER = struct.Struct("!Q")
NICENESS = 5  # the committer process's CPU priority below the trainer's
# bytes of the last snapshot's big tensors the committer keeps a copy of, for the next
# snapshot's statistics (which compare each changed tensor with its parent): read back
# from the disk instead, each snapshot would fill fresh page-cache pages
KEEP_BYTES = 2 << 30
MAX_MESSAGE = 1 << 30  # a job description is small; anything bigger is a broken stream
BEST_REASON = "snapshotter: best"  # reflog reason marking a best tag a Snapshotter set


# ---------------------------------------------------------------------- wire format
def send_message(sock: socket.socket, message: dict[str, Any] | bytes,
                 fd: int | None = None) -> None:
    """Send a message (a dict, or its JSON already encoded), with `fd` if given."""
    payload = message if isinstance(message, bytes) else \
        json.dumps(message, separators=(",", ":"), default=_plain).encode()
    header = _HEADER.pack(len(payload))
    if fd is None:
        sock.sendall(header + payload)
        return
    fds = array.array("i", [fd])
    sent = sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
    sock.sendall(header[sent:] + payload)


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], int | None] | None:
    """The next message and the descriptor that came with it; None at a clean end of file.
    A message cut short (the sender died while sending it) also reads as end of file."""
    header, fds = bytearray(), []
    while len(header) < _HEADER.size:
        data, ancdata, _flags, _addr = sock.recvmsg(_HEADER.size - len(header),
                                                    socket.CMSG_SPACE(4 * 4))
        for level, kind, cdata in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(cdata[:len(cdata) - len(cdata) % got.itemsize])
                fds.extend(got)
        if not data:
            _close_all(fds)
            return None
        header += data
    (size,) = _HEADER.unpack(header)
    if size > MAX_MESSAGE:
        _close_all(fds)
        raise VrlError(f"committer stream is corrupt (a {size}-byte message)")
    payload = bytearray()
    while len(payload) < size:
        chunk = sock.recv(min(size - len(payload), 1 << 20))
        if not chunk:
            _close_all(fds)
            return None
        payload += chunk
    _close_all(fds[1:])
    return json.loads(payload), (fds[0] if fds else None)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _plain(value: Any) -> Any:
    """JSON for numpy / torch scalars that metrics often are."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# ---------------------------------------------------------------------- committing
class CommitWorker:
    """Commits jobs in order: a job names each tensor's bytes in a buffer, or says it is
    the same as in the previous job ("same"), whose stored entry is then reused.

    After a failure every job is skipped until one marked "reset" (sent in full) arrives:
    the "same" entries of the jobs in between refer to a snapshot that never landed.
    """

    def __init__(self, repo: Any, *, ref: str, env: dict[str, Any],
                 best_metric: str | None = None, mode: str = "max",
                 best_tag: str | None = None, best: float | None = None,
                 best_at: str | None = None, keep_last: int | None = None) -> None:
        self.repo, self.ref, self.env = repo, ref, env
        self.best_metric, self.mode, self.best_tag = best_metric, mode, best_tag
        self.best, self.best_at = best, best_at
        self.keep_last = keep_last
        self._prev: dict[str, Any] = {}
        self._kept: dict[str, tuple[str, bytearray]] = {}  # name -> (object id, payload)
        self._failed = False
        # name -> xxh3-128 (hex) of each tensor the last job sent in full: the Snapshotter
        # checks the next state against these instead of byte-comparing held copies
        self.digests: dict[str, str] = {}

    def run(self, job: dict[str, Any], buf: memoryview | None) -> str | None:
        """Commit one job; its id, or None when skipped after an earlier failure."""
        from vrl.commit_engine import FlatState
        from vrl.safetensors_file import RawTensor

        self.digests = {}
        if job.get("reset"):
            self._failed, self._prev = False, {}
        if self._failed:
            return None
        self._failed = True  # until this job has landed
        tensors: dict[str, Any] = {}
        for name, spec in job["tensors"].items():
            if spec is None:  # tied to another tensor (job["ties"])
                tensors[name] = None
            elif spec.get("same"):
                if name not in self._prev:
                    raise VrlError(f"committer lost track of tensor {name!r}")
                tensors[name] = self._prev[name]
            else:
                start, size = spec["offset"], spec["nbytes"]
                data = buf[start:start + size] if size else memoryview(b"")
                tensors[name] = RawTensor(spec["dtype"], tuple(spec["shape"]), data)
        repo = self.repo
        with repo.engine.lending({oid: memoryview(payload)
                                  for oid, payload in self._kept.values()}):
            cid = repo.commit(FlatState(tensors, job["tree"], job["ties"]),
                              message=job["message"], hparams=job["hparams"],
                              metrics=job["metrics"], step=job["step"], env=self.env,
                              meta=job["meta"], allow_empty=True, ref=self.ref)
        self.digests = {n: d.hex() for n, d in repo.engine.last_digests.items()
                        if isinstance(tensors.get(n), RawTensor)}
        manifest = repo.read_manifest(repo.read_commit(cid).manifest)
        self._prev = {n: e for n, e in manifest.tensors.items() if not e.tie}
        self._keep(tensors, self._prev)
        del tensors
        self._failed = False
        self._tag_best(cid, job["metrics"])
        if self.keep_last:
            repo.prune(keep_last=self.keep_last, refs=[self.ref])
        return cid

    def _keep(self, tensors: dict[str, Any], entries: dict[str, Any]) -> None:
        """Copy the big tensors this job sent in full (their bytes leave with the shared
        memory) into buffers kept from job to job, up to KEEP_BYTES; a copy of a tensor
        sent as "same" still holds its bytes. Each copy is exactly its object's payload."""
        import numpy as np

        from vrl.pack_set import PACK_MAX
        from vrl.safetensors_file import RawTensor

        kept, total = {}, 0
        for name, value in tensors.items():
            entry, old = entries.get(name), self._kept.get(name)
            if entry is None:
                continue
            if isinstance(value, RawTensor):
                size = value.data.nbytes
                if size < PACK_MAX or total + size > KEEP_BYTES:
                    continue
                # (the same buffer again when the size holds: its pages are in place)
                payload = old[1] if old is not None and len(old[1]) == size \
                    else bytearray(size)
                np.copyto(np.frombuffer(payload, np.uint8),  # (2.5x a bytearray's copy)
                          np.frombuffer(value.data, np.uint8))
                kept[name] = (entry.id, payload)
                total += size
            elif old is not None and old[0] == entry.id and total + len(old[1]) <= KEEP_BYTES:
                kept[name] = old
                total += len(old[1])
        self._kept = kept

    def _tag_best(self, cid: str, metrics: dict[str, Any]) -> None:
        from vrl.errors import RefConflictError

        value = metrics.get(self.best_metric) if self.best_metric and self.best_tag else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or \
                not math.isfinite(value):
            return
        if self.best is not None and not (value > self.best if self.mode == "max"
                                          else value < self.best):
            return
        assert self.best_tag is not None
        try:  # compare-and-swap: a tag someone else moved is no longer ours to move
            self.repo.refs.update(f"refs/tags/{self.best_tag}", cid, expected=self.best_at,
                                  reason=f"{BEST_REASON} {self.best_metric}={value:.6g}")
        except RefConflictError:
            self.best_tag = None
            return
        self.best, self.best_at = float(value), cid


# ---------------------------------------------------------------------- the process
class _Regions:
    """The committer's mappings of the training process's shared-memory regions, kept
    from job to job: the trainer reuses its region, and a mapping made anew for each job
    would fault every page of it in again (~15 ms per 26 MB here)."""

    KEEP = 2  # regions kept mapped (each pins its memory until it is unmapped)

    def __init__(self) -> None:
        self._maps: dict[tuple[int, int, int], mmap.mmap] = {}

    def map(self, fd: int) -> mmap.mmap:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_size)  # (a memfd's inode is its own)
        region = self._maps.pop(key, None)
        if region is None:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            region = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
        self._maps[key] = region
        while len(self._maps) > self.KEEP:
            old = self._maps.pop(next(iter(self._maps)))
            try:
                old.close()
            except BufferError:  # a view is still referenced; unmapped with it
                pass
        return region


def _serve(sock: socket.socket) -> int:
    """Commit jobs from `sock` until end of file; acknowledge each one."""
    hello = recv_message(sock)
    if hello is None:
        return 0
    config = hello[0]
    from vrl.repo import Repo

    # direct: big objects' bulk straight from the shared memory to the disk (the trainer
    # lays out the region for it): no copy into the page cache, none of the trainer's
    # pages evicted. One core at most for hashing: blake3's thread pool would take the
    # trainer's core.
    repo = Repo(config["repo"], fsync=config["fsync"], verify=config["verify"],
                direct=True, parallel_hashing=False)
    env = config["env"]
    if config.get("env_process") is not None:  # the trainer left the capture to us
        from vrl import envinfo

        env = envinfo.capture(repo.workdir, process=config["env_process"])
    worker = CommitWorker(repo, ref=config["ref"], env=env,
                          best_metric=config["best_metric"], mode=config["mode"],
                          best_tag=config["best_tag"], best=config["best"],
                          best_at=config["best_at"], keep_last=config["keep_last"])
    jobs: queue.Queue[tuple[dict[str, Any], int | None] | None] = queue.Queue()

    def receive() -> None:  # accept jobs at once, so the trainer never waits to hand over
        try:
            while (message := recv_message(sock)) is not None:
                jobs.put(message)
        except (OSError, VrlError, ValueError):
            pass
        finally:
            jobs.put(None)

    threading.Thread(target=receive, name="vrl-committer-receive", daemon=True).start()
    ack_lock = threading.Lock()
    regions = _Regions()
    while (item := jobs.get()) is not None:
        job, fd = item
        ack: dict[str, Any] = {"id": job["id"]}
        region = None
        try:
            if fd is not None:
                region = regions.map(fd)
                os.close(fd)
                fd = None
            view = memoryview(region) if region is not None else None
            try:
                cid = worker.run(job, view)
            finally:
                if view is not None:
                    view.release()
            ack.update({"commit": cid, "digests": worker.digests} if cid
                       else {"skipped": True})
        except Exception as exc:  # noqa: BLE001 - reported to the training process
            ack["error"] = str(exc) or type(exc).__name__
            ack["type"] = type(exc).__name__
        finally:
            if fd is not None:
                os.close(fd)
        try:
            with ack_lock:
                send_message(sock, ack)
        except OSError:
            pass  # the training process is gone; keep committing what was received
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m vrl.committer FD (started by vrl.Snapshotter)",
              file=sys.stderr)
        return 2
    # Ctrl-C and SIGTERM go to the training process, which flushes and then closes our
    # socket; we stop at that end of file, never with half the received jobs committed.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # Training comes first: on a machine without idle cores the committer yields to it
    # (backpressure stops the trainer if the committer falls too far behind). Set before
    # any thread starts, so every thread inherits it. SCHED_BATCH: a committer thread that
    # wakes up (a job arrived, an fsync returned) never preempts the running trainer.
    # Not SCHED_IDLE: beside other busy processes it would starve, and the trainer with it.
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    sock = socket.socket(fileno=int(args[0]))
    try:
        return _serve(sock)
    finally:
        sock.close()


def _exit(code: int) -> None:
    """End the process once every commit's files are written: without the interpreter's
    teardown (tens of milliseconds of module clean-up), which the training process would
    wait for in `Snapshotter.close`."""
    from vrl import lifecycle

    lifecycle.finish()  # the journal's write-outs (what atexit would have run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
