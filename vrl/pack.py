"""Pack files: many small objects in one file, written and fsynced once.

A commit of a small policy writes dozens of objects of a few KiB each; one file and one
fsync per object was most of its cost. `FileObjectStore.batch()` puts the small objects it
writes into one pack instead. On disk (`objects/pack/pack-<name>.pack`), all integers
little-endian:

    0        64-byte pack header  b"vrlpack 1" padded with spaces, ending in b"\\n"
    64       objects, each exactly as a loose object file holds it (64-byte object header +
             payload, so ids and verification are unchanged), each starting at a multiple of
             64 bytes (zero padding between them: payloads stay aligned for memory-mapping)
    I        index: one 48-byte entry per object, sorted by id:
             32-byte binary id, u64 offset of the object, u64 length (header + payload)
    end-64   trailer: b"VRLPIDX1", u64 I, u64 object count, 8 zero bytes,
             32-byte blake3 of the index and the trailer's first 32 bytes

`<name>` is that checksum in hex, so a pack's name commits to every id, offset and length
in it. The trailer is written last and the file is renamed into place after its fsync:
a pack is either complete or absent; one that fails these checks is reported by fsck and
ignored by reads (its objects count as missing).
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Iterable

import blake3

from vrl.errors import CorruptObjectError
from vrl.objects import HEADER_SIZE, ObjectId, parse_header

PACK_HEADER = b"vrlpack 1".ljust(HEADER_SIZE - 1) + b"\n"
TRAILER_MAGIC = b"VRLPIDX1"
ENTRY = struct.Struct("<32sQQ")
TRAILER = struct.Struct("<8sQQ8s32s")
ALIGN = 64

Entries = dict[ObjectId, tuple[int, int]]  # id -> (offset, length) inside the pack
_first = operator.itemgetter(0)


def pack_name(path: str) -> str:
    """`pack-<name>.pack` -> `<name>` (or "" when the file name is not a pack's)."""
    base = os.path.basename(path)
    if base.startswith("pack-") and base.endswith(".pack"):
        return base[5:-5]
    return ""


def build(objects: Iterable[tuple[ObjectId, bytes | memoryview]]
          ) -> tuple[str, list[bytes | memoryview], Entries]:
    """Lay out a pack for (id, raw object bytes) pairs: (name, chunks to write, entries)."""
    chunks: list[bytes | memoryview] = [PACK_HEADER]
    entries: Entries = {}
    offset = len(PACK_HEADER)
    for oid, raw in sorted(objects, key=_first):
        if oid in entries:
            continue
        length = memoryview(raw).nbytes
        entries[oid] = (offset, length)
        chunks.append(raw)
        pad = -length % ALIGN
        if pad:
            chunks.append(b"\0" * pad)
        offset += length + pad
    pack_entry = ENTRY.pack
    index = b"".join([pack_entry(bytes.fromhex(oid), off, length)
                      for oid, (off, length) in entries.items()])  # (in id order already)
    head = TRAILER.pack(TRAILER_MAGIC, offset, len(entries), b"\0" * 8, b"\0" * 32)[:32]
    digest = blake3.blake3(index + head).digest()
    chunks += [index, head + digest]
    return digest.hex(), chunks, entries


def file_size(entries: Entries) -> int:
    """The size of the pack file `build` lays out with these entries."""
    end = max((offset + length + (-length % ALIGN) for offset, length in entries.values()),
              default=len(PACK_HEADER))
    return end + len(entries) * ENTRY.size + TRAILER.size


def read_index(path: str) -> Entries:
    """The entries of a pack, after checking its trailer and index (not its objects).

    Raises CorruptObjectError naming what is wrong (truncated, bad checksum, overlapping
    entries), OSError if it cannot be read.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(PACK_HEADER) + TRAILER.size:
            raise CorruptObjectError(f"pack {os.path.basename(path)} is truncated "
                                     f"({size} bytes)")
        if f.read(len(PACK_HEADER)) != PACK_HEADER:
            raise CorruptObjectError(f"pack {os.path.basename(path)} has no pack header")
        f.seek(size - TRAILER.size)
        magic, index_at, count, _, digest = TRAILER.unpack(f.read(TRAILER.size))
        if magic != TRAILER_MAGIC or index_at + count * ENTRY.size + TRAILER.size != size:
            raise CorruptObjectError(f"pack {os.path.basename(path)} is truncated or has a "
                                     "damaged trailer")
        f.seek(index_at)
        index = f.read(count * ENTRY.size)
    head = TRAILER.pack(magic, index_at, count, b"\0" * 8, b"\0" * 32)[:32]
    if blake3.blake3(index + head).digest() != digest:
        raise CorruptObjectError(f"pack {os.path.basename(path)} has a damaged index "
                                 "(checksum mismatch)")
    name = pack_name(path)
    if name and name != digest.hex():
        raise CorruptObjectError(f"pack {os.path.basename(path)} does not match its name")
    return _entries(index, index_at, count, os.path.basename(path))


def check(path: str) -> list[str]:
    """Problems of one pack: its index, and every object re-hashed against its id."""
    try:
        entries = read_index(path)
    except CorruptObjectError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"pack {os.path.basename(path)} cannot be read: {exc.strerror or exc}"]
    problems = []
    with open(path, "rb") as f:
        for oid, (offset, length) in sorted(entries.items(), key=lambda e: e[1]):
            raw = os.pread(f.fileno(), length, offset)
            problem = check_raw(oid, raw)
            if problem:
                problems.append(f"object {oid} in pack {os.path.basename(path)}: {problem}")
    return problems


def check_raw(oid: ObjectId, raw: bytes) -> str | None:
    """Why `raw` is not the object `oid` (None when it is)."""
    try:
        _, size = parse_header(raw)
    except CorruptObjectError as exc:
        return str(exc)
    if len(raw) != HEADER_SIZE + size:
        return f"truncated ({len(raw) - HEADER_SIZE} of {size} bytes)"
    if blake3.blake3(raw).hexdigest() != oid:
        return "its bytes do not match its id"
    return None


# ---------------------------------------------------------------------- remote (read side)
# A remote holds packs byte-identical to local ones. Its client knows only each pack's size
# (from a listing) and reads ranges: first the tail (trailer + index), then objects. Every
# length below is checked against that size before anything is read or allocated, so a
# pack that lies (offsets, lengths, counts) costs nothing but the refusal.

MAX_INDEX_BYTES = 64 << 20  # ~1.4 million objects: more is damage, not a pack


def index_span(trailer: bytes, size: int, label: str) -> int:
    """How many bytes at the end of a `size`-byte pack hold its index and trailer, from
    its last TRAILER.size bytes; raises CorruptObjectError if they cannot be a trailer."""
    if size < len(PACK_HEADER) + TRAILER.size or len(trailer) != TRAILER.size:
        raise CorruptObjectError(f"pack {label} is truncated ({size} bytes)")
    magic, index_at, count, _, _ = TRAILER.unpack(trailer)
    span = count * ENTRY.size + TRAILER.size
    if magic != TRAILER_MAGIC or index_at < len(PACK_HEADER) or index_at + span != size:
        raise CorruptObjectError(f"pack {label} is truncated or has a damaged trailer")
    if span > MAX_INDEX_BYTES:
        raise CorruptObjectError(f"pack {label} claims an index of {span} bytes, over "
                                 f"{MAX_INDEX_BYTES}; refusing it")
    return span


def parse_tail(tail: bytes, size: int, label: str, name: str = "") -> Entries:
    """The entries of a `size`-byte pack from its last `index_span` bytes (index +
    trailer): the checksum, the name (when given) and every entry are checked as
    `read_index` checks a local pack."""
    span = index_span(tail[-TRAILER.size:], size, label)
    if len(tail) != span:
        raise CorruptObjectError(f"pack {label}: index of {len(tail)} bytes, expected {span}")
    index, trailer = tail[:-TRAILER.size], tail[-TRAILER.size:]
    if blake3.blake3(index + trailer[:32]).digest() != trailer[32:]:
        raise CorruptObjectError(f"pack {label} has a damaged index (checksum mismatch)")
    if name and name != trailer[32:].hex():
        raise CorruptObjectError(f"pack {label} does not match its name")
    index_at = size - span
    return _entries(index, index_at, len(index) // ENTRY.size, label)


def _entries(index: bytes, index_at: int, count: int, label: str) -> Entries:
    """The index's entries, checked: inside the pack before its index, not overlapping,
    each id once (``count`` entries)."""
    entries: Entries = {}
    end = len(PACK_HEADER)
    for oid_raw, offset, length in sorted(ENTRY.iter_unpack(index), key=lambda e: e[1]):
        if offset < end or length < HEADER_SIZE or offset + length > index_at:
            raise CorruptObjectError(f"pack {label}: index entries overlap or point outside "
                                     "the pack")
        end = offset + length
        entries[ObjectId(oid_raw.hex())] = (offset, length)
    if len(entries) != count:
        raise CorruptObjectError(f"pack {label} lists an object twice")
    return entries


def build_bytes(objects: Iterable[tuple[ObjectId, bytes | memoryview]]
                ) -> tuple[str, bytes, Entries]:
    """A whole pack in memory (for upload): (name, bytes, entries)."""
    name, chunks, entries = build(objects)
    return name, b"".join(chunks), entries
