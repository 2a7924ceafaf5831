"""Whether a live tensor still holds the bytes of its last snapshot.

The Snapshotter reads every byte of every tensor whose autograd version counter did not
move (writes through `.data` do not move it), at every snapshot, in the training loop:
against the held copy with the C library's memcmp while the committer's digest of that
copy is on its way, then against the digest with xxh3-128, computed as the committer
computes it (half the memory traffic of a compare, and the held copy can be released).
Both are called through ctypes, which releases the GIL: big states are hashed on several
threads at once.
"""

from __future__ import annotations

import os
from typing import Any

DIGEST_THREADS = 4  # threads that hash a snapshot's unchanged tensors (memory-bound beyond)
PARALLEL_DIGEST_MIN = 16 << 20  # bytes: below, one thread (a hand-off costs more)


def _flat_bytes(value: Any) -> Any:
    """A CPU, contiguous, flat uint8 view (or copy, for other devices) of a tensor."""
    import torch

    t = value.detach()
    if t.device.type != "cpu":
        t = t.to("cpu")
    return t.contiguous().reshape(-1).view(torch.uint8)


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
