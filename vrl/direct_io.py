"""Writing an object's bytes to a file descriptor: every byte (`write_all`), or a big
payload's block-aligned bulk with O_DIRECT (`write_direct`, for `FileObjectStore.direct`).

Callers look `write_all` up on this module at each call (`direct_io.write_all(...)`), so
that tests can replace it in one place to inject ENOSPC and crashes into every write.
"""

from __future__ import annotations

import errno
import os

from vrl.objects import HEADER_SIZE


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write every byte (tests replace this to inject ENOSPC and crashes)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view[: 1 << 30])
        view = view[written:]


# O_DIRECT writes start and end on this boundary, in the file and in memory: a multiple of
# every logical block and DMA alignment a Linux block device has (512 or 4096 bytes).
DIRECT_ALIGN = 4096
DIRECT_MIN = 1 << 20  # bytes an object has at least before its bulk is written directly


def direct_offset(offset: int) -> int:
    """The first offset from `offset` at which a payload can be written with O_DIRECT
    (`FileObjectStore.direct`): the payload's bytes after the object's first block then
    start on a `DIRECT_ALIGN` boundary of memory (a mapping starts on one)."""
    return -(-(offset - HEADER_SIZE) // DIRECT_ALIGN) * DIRECT_ALIGN + HEADER_SIZE


def _address(view: memoryview) -> int:
    import numpy as np  # (numpy reads the address of a read-only buffer; ctypes cannot)

    return int(np.frombuffer(view, np.uint8).ctypes.data)


def write_direct(fd: int, chunks: list[bytes | memoryview]) -> bool:
    """Write an object (its header, then its payload) into the empty file `fd`, the
    payload's block-aligned bulk through O_DIRECT: the device reads those bytes from the
    caller's memory, so the kernel neither copies them into the page cache (on a VM most
    of a big snapshot's CPU: each new page-cache page is fresh memory) nor evicts the
    trainer's pages for them. The first block and the tail are written as usual. False,
    with nothing written, where the payload is small or not at a `direct_offset` in memory,
    or the file system refuses O_DIRECT (the caller then writes it all as usual)."""
    direct = getattr(os, "O_DIRECT", 0)
    if len(chunks) != 2 or not direct:
        return False
    head, payload = bytes(chunks[0]), memoryview(chunks[1]).cast("B")
    first = DIRECT_ALIGN - len(head)  # the payload's bytes in the first block
    body = (payload.nbytes - first) // DIRECT_ALIGN * DIRECT_ALIGN
    if first <= 0 or payload.nbytes < DIRECT_MIN or \
            _address(payload) % DIRECT_ALIGN != len(head):
        return False
    import fcntl

    # (the same descriptor, switched: the temp file is read-only, it cannot be reopened)
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct)
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # (a file system without O_DIRECT)
            return False
        raise
    done = 0
    try:
        while done < body:
            try:
                written = os.pwrite(fd, payload[first + done:first + body],
                                    DIRECT_ALIGN + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                break  # the device wants another alignment: the rest as usual
            done += written
            if not written or written % DIRECT_ALIGN:
                break
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    if not done:
        return False
    pwrite_all(fd, b"".join((head, payload[:first])), 0)
    pwrite_all(fd, payload[first + done:], DIRECT_ALIGN + done)
    return True


def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write every byte at `offset`."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view[: 1 << 30], offset)
        view, offset = view[written:], offset + written
