"""Reading a snapshot's tensors back from the store: the path every restore, diff and
export takes.

A tensor comes from wherever it is cheapest and still exact: bytes a commit in progress
just hashed or a caller lends (the commit engine's), a small payload kept from a recent
commit, a pack read with one pread, or the object's file memory-mapped (copy-on-write,
private, so a restored tensor may be written to). An object missing here is fetched from
a remote where the remote layer installed a fetcher (partial clones), else the error says
why it is missing. What is written out for a person (`tensor_chunk`, `read_verified`) is
hashed to its id first.
"""

from __future__ import annotations

import math
import mmap
import os
from typing import Any

from vrl.commit_engine import MMAP_MIN, CommitEngine
from vrl.errors import CorruptObjectError, ObjectNotFoundError, PrunedError, VrlError
from vrl.objects import HEADER_SIZE, TensorEntry, damaged, hash_object, itemsize
from vrl.pack_set import PACK_MAX
from vrl.safetensors_file import FileSlice, RawTensor
from vrl.tensors import tensor_from_buffer


def verify_tensor(entry: TensorEntry, buf: Any, offset: int = 0) -> None:
    """Raise CorruptObjectError unless the tensor's bytes in `buf` hash to its id."""
    if hash_object("tensor", memoryview(buf)[offset:offset + entry.nbytes],
                   threads=True) != entry.id:
        raise CorruptObjectError(damaged(entry.id))


class TensorReader:
    """The read path of one repository object. `repo` provides `objects`, `config` and
    `fetch_missing` (installed by the remote layer, possibly after this is made); `engine`
    the payloads held in memory."""

    def __init__(self, repo: Any, engine: CommitEngine) -> None:
        self.repo, self.engine = repo, engine

    def load_entry(self, entry: TensorEntry, verify: bool = False) -> Any:
        """A tensor from the store: memory-mapped (copy-on-write, private) when large.
        `verify`: its bytes are hashed first (CorruptObjectError if they do not match)."""
        if entry.nbytes >= MMAP_MIN and not self.repo.objects.verify_reads and \
                self.engine.held_payload(entry.id, read_only=False) is None:
            _check_entry(entry)
            mapped = self.repo.objects.map_loose_tensor(entry.id, entry.nbytes)
            if mapped is not None:
                if verify:
                    verify_tensor(entry, mapped, HEADER_SIZE)
                return tensor_from_buffer(mapped, entry.dtype, entry.shape, HEADER_SIZE,
                                          entry.nbytes)
        buf, offset = self._tensor_buffer(entry)
        if verify and not self.repo.objects.verify_reads:  # (with it, already hashed)
            verify_tensor(entry, buf, offset)
        return tensor_from_buffer(buf, entry.dtype, entry.shape, offset, entry.nbytes)

    def read_tensor(self, entry: TensorEntry) -> RawTensor:
        """A tensor's raw bytes from the store, without torch (memory-mapped when large).

        Read-only use (statistics, diffs): a packed object is read, not mapped, up to
        PACK_MAX - one pread of a small object costs less than mapping its whole pack
        (and unmapping it, which stalls every thread of the process)."""
        buf, offset = self._tensor_buffer(entry, PACK_MAX)
        data = memoryview(buf)[offset:offset + entry.nbytes]
        if data.nbytes != entry.nbytes:
            raise CorruptObjectError(f"tensor object {entry.id[:12]} is truncated or the "
                                     "wrong size; run `vrl fsck`")
        return RawTensor(entry.dtype, entry.shape, data)

    def tensor_chunk(self, entry: TensorEntry) -> memoryview | FileSlice:
        """A tensor's bytes to write into a file for a person, verified: hashed to its id
        first (blake3, several GB/s), so damaged bytes are never written
        (CorruptObjectError). A big one is hashed through a read-only map of its object
        file and handed over as a slice of that file, which the kernel copies from the
        same page-cache pages (copy_file_range: not through this process's memory);
        others are read, hashed and written from memory."""
        _check_entry(entry)
        if entry.nbytes >= MMAP_MIN:
            try:
                fd, offset, size = self.repo.objects.open_payload(entry.id, "tensor")
            except ObjectNotFoundError:  # not on disk (yet): read_tensor fetches it
                pass
            else:
                try:
                    if size != entry.nbytes:
                        raise CorruptObjectError(f"tensor object {entry.id[:12]} is "
                                                 "truncated or the wrong size; run `vrl fsck`")
                    start = offset - offset % mmap.ALLOCATIONGRANULARITY
                    with mmap.mmap(fd, offset + size - start, access=mmap.ACCESS_READ,
                                   offset=start) as mapped:
                        verify_tensor(entry, mapped, offset - start)
                except BaseException:
                    os.close(fd)
                    raise
                return FileSlice(fd, offset, size)
        return self.read_verified(entry)

    def read_verified(self, entry: TensorEntry) -> memoryview:
        """A tensor's bytes in memory (as `read_tensor`), hashed to its id first."""
        data = self.read_tensor(entry).data
        if not self.repo.objects.verify_reads:  # (with it, read_tensor hashed them)
            verify_tensor(entry, data)
        return data

    def _tensor_buffer(self, entry: TensorEntry, mmap_min: int = MMAP_MIN
                       ) -> tuple[Any, int]:
        """(buffer, offset) where a tensor's `entry.nbytes` bytes start: a small payload
        read into memory, or the object's file memory-mapped (copy-on-write, private).
        Below `mmap_min` bytes a packed payload is read too."""
        _check_entry(entry)
        fresh = self.engine.held_payload(entry.id, read_only=mmap_min > MMAP_MIN)
        if fresh is not None and fresh.nbytes == entry.nbytes:
            return fresh, 0
        # a payload kept from a recent commit serves small tensors, and read-only use of
        # bigger ones (statistics); a restored big tensor is mapped as always (it must be
        # writable and private, and a copy of it costs more than the mapping)
        payload = self.engine.recent_payload(entry.id) \
            if entry.nbytes < MMAP_MIN or mmap_min > MMAP_MIN else None
        # the object must still exist (gc or pruning may have removed it meanwhile)
        if payload is not None and len(payload) == entry.nbytes and \
                not self.repo.objects.verify_reads and self.repo.objects.has(entry.id):
            return payload, 0
        if entry.nbytes < MMAP_MIN:
            try:
                kind, payload = self.repo.objects.read(entry.id)
            except ObjectNotFoundError:
                self.fetch_or_fail([entry])
                kind, payload = self.repo.objects.read(entry.id)
            if kind != "tensor" or len(payload) != entry.nbytes:
                raise CorruptObjectError(f"tensor object {entry.id[:12]} is a {kind} of "
                                         f"{len(payload)} bytes, not the {entry.nbytes}-byte "
                                         "tensor its manifest names; run `vrl fsck`")
            return payload, 0
        if entry.nbytes < mmap_min and self.repo.objects.is_packed(entry.id):
            try:
                kind, payload = self.repo.objects.read(entry.id)
            except VrlError:
                pass  # repacked or collected meanwhile: mapped (or fetched) below
            else:
                if kind == "tensor" and len(payload) == entry.nbytes:
                    return payload, 0
        try:
            # the file mapped as a whole (a restore makes ~9 system calls per tensor, the
            # fewest Python's mmap allows; no memoryview of it is made here)
            fd, offset, size = self.repo.objects.open_payload(entry.id, "tensor")
            try:
                if size == entry.nbytes:
                    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
            finally:
                os.close(fd)
        except ObjectNotFoundError:  # fetched from a remote, or staged in an open batch
            self.fetch_or_fail([entry])
            mapped, offset = self.repo.objects.map_payload(entry.id, "tensor"), 0
            size = mapped.nbytes
        if size != entry.nbytes:
            raise CorruptObjectError(f"tensor object {entry.id[:12]} is truncated or the "
                                     "wrong size; run `vrl fsck`")
        if self.repo.objects.verify_reads:
            verify_tensor(entry, mapped, offset)
        return mapped, offset

    def fetch_or_fail(self, entries: list[TensorEntry]) -> None:
        missing = [e.id for e in entries if not self.repo.objects.has(e.id)]
        if missing and self.repo.lazy:
            self.repo.fetch_missing(missing, {e.id: ("tensor", e.nbytes) for e in entries})
            missing = [m for m in missing if not self.repo.objects.has(m)]
        if missing and not self.repo.fetching and self.repo.config.get("core", "promisor"):
            raise PrunedError(f"tensor data {missing[0][:12]} is not here yet: this is a "
                              "partial clone opened with fetch=False, so nothing downloads "
                              "on demand (open it with fetch=True, the default)")
        if missing:
            raise PrunedError(f"tensor data {missing[0][:12]} is not in this repository "
                              "(pruned, cloned with --metadata-only, or lost: `vrl fsck` "
                              "checks); fetch it from a remote that has it")


def _check_entry(entry: TensorEntry) -> None:
    """Shape, dtype and size agree: nothing is allocated or copied on a claim alone (the
    quick test here; the full check, with its message, only when it fails)."""
    try:
        consistent = math.prod(entry.shape) * itemsize(entry.dtype) == entry.nbytes
    except (TypeError, VrlError):
        consistent = False
    if not consistent:
        entry.check()
