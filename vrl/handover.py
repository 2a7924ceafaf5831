"""Where a snapshot's changed tensors are copied for the committer: shared-memory regions.

A region is one memfd per snapshot, mapped in the training process and passed to the
committer process over a Unix socket (`SCM_RIGHTS`), so the committer reads the copies
without another copy or any pickling; in thread mode it is anonymous memory. The copies
in a region double as the Snapshotter's held copies, against which the next snapshot's
tensors are compared (`vrl.bytecheck`), so a region is reused only once the committer is
done with it and no held copy views it.
"""

from __future__ import annotations

import mmap
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

ALIGN = 64  # tensor offsets in a region: any dtype may view its bytes


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
