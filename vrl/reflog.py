"""The reflog: one file per ref under `.vrl/logs/`, one line per move of the ref.

A line is `<old> <new> <time> <who>\t<reason>\n` (ids of 64 hex digits, ZERO for none). It
is appended before the ref moves (vrl.refs: both fsynced before the ref's rename), so a
power cut can keep a line for a move that never happened: `interrupted` recognises exactly
those lines. `RefStore` (vrl.refs) appends, takes back and reads the lines through the
functions here.
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from pathlib import Path

from vrl.durable import fsync, fsync_dir, make_dirs
from vrl.errors import storage_error
from vrl.objects import ObjectId, is_object_id

ZERO = "0" * 64


@dataclass(frozen=True)
class ReflogEntry:
    old: ObjectId | None
    new: ObjectId | None
    time: str
    who: str
    reason: str


@dataclass(frozen=True)
class ReflogRead:
    entries: list[ReflogEntry]  # newest first
    damaged: list[str]  # one description per line that could not be parsed
    torn: str | None  # an incomplete last line (a crash mid-append), harmless


def _parse_log_line(raw: bytes) -> ReflogEntry | None:
    try:
        line = raw.decode("utf-8")
        head, reason = line.split("\t", 1)
        old, new, when, *who = head.split(" ")
    except ValueError:  # UnicodeDecodeError is a ValueError too
        return None
    if not (is_object_id(old) and is_object_id(new)):
        return None
    return ReflogEntry(None if old == ZERO else ObjectId(old),
                       None if new == ZERO else ObjectId(new), when, " ".join(who), reason)


def interrupted(entries: list[ReflogEntry], value: object) -> list[ReflogEntry]:
    """The entries (newest first, as `read_log` gives them) of moves that never happened.

    A move is logged before the ref is renamed, so a power cut can keep the line and lose
    the move. The ref then still holds the line's old value, and the next move (logged
    under the same lock) starts from it again: an entry is interrupted when the entry
    after it, or for the newest one the ref's current `value`, moves from its old value
    instead of from its new one. A damaged id in an applied entry does not qualify (the
    next entry starts from the true new id, not from the old one).
    """
    out = []
    after = value  # the old value of the move after this one (ANY: unknown)
    for entry in entries:  # newest first
        if entry.new is not None and entry.new != entry.old and after == entry.old:
            out.append(entry)
        after = entry.old
    return out


def append_line(root: Path, name: str, path: Path, line: bytes, sync: bool,
                pending: list[int] | None) -> tuple[Path, int, int]:
    """Append `line` to the reflog of `name` at `path` (`root`: the repository's `.vrl`,
    for errors); return (path, size after, bytes written) for `undo_line`. With `sync`
    false nothing is fsynced; `pending`: where the ref's write collects the fds it fsyncs
    with its own file (see `RefStore._write_file`), None to fsync here."""
    try:
        if sync:
            make_dirs(path.parent, sync)
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        else:  # (the journal's materialisation: two stats fewer per line)
            created = False
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            except FileNotFoundError:
                make_dirs(path.parent, sync)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = os.write(fd, line)
            end = os.fstat(fd).st_size
        except BaseException:
            os.close(fd)
            raise
        # durable before the ref moves: with the ref's temp file when one follows
        if pending is not None and sync:
            pending.append(fd)
            if created:
                pending.append(os.open(path.parent, os.O_RDONLY))
        else:
            try:
                if sync:
                    fsync(fd)
            finally:
                os.close(fd)
            if created and sync:
                fsync_dir(path.parent)
        if written != len(line):  # a full disk can write part of the line
            undo_line(path, end, written)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        raise storage_error(exc, root, f"writing the reflog of {name}") from exc
    return path, end, written


def undo_line(path: Path, end: int, written: int) -> None:
    """Take back an appended line, unless another process has appended since."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == end:
            if end == written:
                path.unlink()  # the log did not exist before
            else:
                os.truncate(path, end - written)


def read_log_file(root: Path, name: str, path: Path) -> ReflogRead:
    """Every entry of the reflog of `name` at `path` (newest first), with every damaged
    line reported."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return ReflogRead([], [], None)
    except OSError as exc:
        raise storage_error(exc, root, f"reading the reflog of {name}") from exc
    lines = data.split(b"\n")
    last = lines.pop()  # b"" when the file ends with a newline, as every append does
    torn = None
    if last:  # a crash mid-append: the entry never completed, the ref did not move
        torn = f"logs/{name}: line {len(lines) + 1} is incomplete (an interrupted write)"
    out: list[ReflogEntry] = []
    damaged: list[str] = []
    for number, raw in enumerate(lines, 1):
        entry = _parse_log_line(raw)
        if entry is None:
            shown = raw[:60].decode("utf-8", "replace")
            damaged.append(f"logs/{name}: line {number} is damaged ({shown!r})")
        else:
            out.append(entry)
    out.reverse()
    return ReflogRead(out, damaged, torn)
