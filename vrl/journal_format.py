"""The commit journal's file format (vrl/journal.py writes and replays it).

The file:

    0    header, 64 bytes: b"vrljrnl2", the boot id of the records' machine (40 bytes,
         ASCII, space-padded), u64 offset up to which every record is materialised, u64
         epoch (random, new at every checkpoint)
    64   records, back to back: b"VJR2", u32 JSON length, u64 body length, u64 epoch,
         16-byte xxh3-128 of the 24 bytes before it, the JSON and the body; then the JSON
         ({ref, old, new, logs: [[log, line]], pack, external}) and the body (the pack
         file's bytes; empty for an `external` pack: one of EXTERNAL_MIN (vrl/journal.py)
         or more is written once to its own file and fsynced in the same round as the
         record instead - a replay drops such a record, the last, if that file is not
         whole: its round never ended)

The records end at the first place that holds no intact record of the header's epoch.
"""

from __future__ import annotations

import errno
import json
import os
import re
import struct
from dataclasses import dataclass

from vrl.errors import VrlError
from vrl.objects import ObjectId, is_object_id
from vrl.refs import check_ref_name

HEADER = struct.Struct("<8s40sQQ")
MAGIC = b"vrljrnl2"
RECORD = struct.Struct("<4sIQQ16s")
RECORD_MAGIC = b"VJR2"
# the format before epochs (records appended, the file truncated at a checkpoint): still
# read, so that a repository's pending records survive an upgrade; converted at first use
LEGACY_MAGIC, LEGACY_RECORD, LEGACY_RECORD_MAGIC = b"vrljrnl1", struct.Struct("<4sIQ16s"), \
    b"VJR1"
IOV_MAX = 512  # parts per pwritev (Linux allows 1024)


@dataclass
class Record:
    offset: int  # where the record starts in the journal
    end: int  # where the next one starts
    ref: str
    old: ObjectId | None
    new: ObjectId
    logs: list[tuple[str, bytes]]
    pack: str | None
    body: bytes | list  # the pack file's bytes (or its chunks), b"" for an external pack
    external: bool = False  # the pack was fsynced in its own file, in the commit's round


def encode(ref: str, old: ObjectId | None, new: ObjectId, logs: list[tuple[str, bytes]],
           pack: str | None, body: list, external: bool = False, epoch: int = 0,
           size: int | None = None) -> list:
    """A record's bytes, in parts (written with pwritev: the body is not copied); `size`:
    the body's, where the caller knows it."""
    meta = _meta_json(ref, old, new, pack, external, logs).encode()
    if size is None:
        size = sum(memoryview(part).nbytes for part in body)
    head = RECORD.pack(RECORD_MAGIC, len(meta), size, epoch, b"")[:-16]
    return [head + _digest(head, meta, *body), meta, *body]


_ASCII = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def _meta_json(ref: str, old: ObjectId | None, new: ObjectId, pack: str | None,
               external: bool, logs: list[tuple[str, bytes]]) -> str:
    """A record's metadata as `json.dumps(meta, separators=(",", ":"))` writes it, written
    directly (every commit writes one; its values are strings, None and a bool)."""
    lines = ",".join([f"[{_ASCII(log)},{_ASCII(line.decode())}]" for log, line in logs])
    return (f'{{"ref":{_ASCII(ref)},"old":{"null" if old is None else _ASCII(old)},'
            f'"new":{_ASCII(new)},"pack":{"null" if pack is None else _ASCII(pack)},'
            f'"external":{"true" if external else "false"},"logs":[{lines}]}}')


def _digest(*parts: bytes | memoryview) -> bytes:
    """xxh3-128 of a record's parts (imported here: metadata commands, which open a
    repository but never write one, need not load xxhash)."""
    import xxhash

    h = xxhash.xxh3_128()
    for part in parts:
        h.update(part)
    return h.digest()


@dataclass
class Header:
    magic: bytes
    boot: str
    applied: int  # every record before this offset is materialised
    epoch: int

    @property
    def legacy(self) -> bool:
        return self.magic == LEGACY_MAGIC


def read_header(raw: bytes) -> Header | None:
    """The header at the start of `raw`, or None where there is no valid one."""
    if len(raw) < HEADER.size:
        return None
    magic, boot, applied, epoch = HEADER.unpack_from(raw)
    if magic not in (MAGIC, LEGACY_MAGIC):
        return None
    return Header(magic, boot.decode("ascii", "replace").strip(), applied, epoch)


def at_record(raw: bytes, header: Header) -> bool:
    """Whether `raw` (bytes at a record's place) starts like a record of `header`'s journal:
    its magic and epoch. The whole record's digest decides whether it is intact."""
    if header.legacy:
        return raw[:4] == LEGACY_RECORD_MAGIC
    return len(raw) >= RECORD.size and raw[:4] == RECORD_MAGIC and \
        RECORD.unpack_from(raw)[3] == header.epoch


def parse(data: bytes, start: int = HEADER.size) -> tuple[list[Record], int]:
    """The intact records of the journal `data` (the file from its start) from `start` on,
    and where the first torn, damaged or stale one starts (there the records end)."""
    out: list[Record] = []
    header = read_header(data)
    if header is None:
        return out, start
    head = LEGACY_RECORD if header.legacy else RECORD
    at = start
    view = memoryview(data)
    while at + head.size <= len(data) and at_record(data[at:at + RECORD.size], header):
        meta_len, body_len = head.unpack_from(data, at)[1:3]
        end = at + head.size + meta_len + body_len
        if end > len(data):
            break
        meta = bytes(view[at + head.size: at + head.size + meta_len])
        body = view[at + head.size + meta_len: end]
        signed = () if header.legacy else (view[at:at + head.size - 16],)
        if _digest(*signed, meta, body) != data[at + head.size - 16:at + head.size]:
            break
        try:
            m = json.loads(meta)
            record = Record(at, end, m["ref"], m["old"], m["new"],
                            [(log, line.encode()) for log, line in m["logs"]], m["pack"],
                            bytes(body), m.get("external") is True)
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        if not _well_formed(record):  # names a replay would write outside its place
            break
        out.append(record)
        at = end
    return out, at


_PACK_FILE = re.compile(r"pack-[0-9a-f]{64}\.pack")


def _well_formed(record: Record) -> bool:
    """Whether a parsed record only names what a commit's record can: a ref (and reflogs)
    by a valid name, commit ids, a pack file by its name, one reflog line each. A journal
    copied with a repository is read like any of its files: nothing in it may make a
    replay write outside the repository's own refs, logs and packs."""
    def ref_name(name: object) -> bool:
        if name == "HEAD":
            return True
        try:
            return isinstance(name, str) and name.startswith("refs/") and \
                check_ref_name(name) == name
        except VrlError:
            return False

    return (ref_name(record.ref) and is_object_id(record.new)
            and (record.old is None or is_object_id(record.old))
            and (record.pack is None or (isinstance(record.pack, str)
                                         and _PACK_FILE.fullmatch(record.pack) is not None))
            and not (record.external and record.body)
            and isinstance(record.logs, list)
            and all(ref_name(log) and line.endswith(b"\n") and line.count(b"\n") == 1
                    for log, line in record.logs))


def new_epoch() -> int:
    return int.from_bytes(os.urandom(8), "little")


def pwrite_all(fd: int, parts: list, offset: int, nbytes: int) -> None:
    """Write `parts` (`nbytes` in all) at `offset`, IOV_MAX parts per call (a record of
    many small objects has more parts than one pwritev takes); a short write is a full
    disk."""
    for i in range(0, len(parts), IOV_MAX):
        batch = parts[i:i + IOV_MAX]
        want = nbytes if len(parts) <= IOV_MAX else \
            sum(memoryview(part).nbytes for part in batch)
        if os.pwritev(fd, batch, offset) != want:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        offset += want


def read_all(fd: int, size: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)
