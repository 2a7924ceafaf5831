"""One error tree. The library raises these; the CLI turns them into one-line messages."""

from __future__ import annotations

import errno
import os
from pathlib import Path


class VrlError(Exception):
    """Base class of every error vrl raises on purpose (exit code 1 in the CLI)."""


class NotARepositoryError(VrlError, FileNotFoundError):
    """No `.vrl` directory was found."""


class RevisionError(VrlError, KeyError):
    """A revision, ref or object does not exist or is ambiguous."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ObjectNotFoundError(RevisionError):
    """An object id is not in the store."""


class InvalidRefNameError(VrlError, ValueError):
    """A branch, tag or remote name is not allowed."""


class ConfigError(VrlError, ValueError):
    """A setting of `.vrl/config` is unknown, or its value is not one it may have."""


class RefConflictError(VrlError):
    """A ref moved while we were updating it (compare-and-swap failed)."""


class CorruptObjectError(VrlError):
    """An object's bytes do not hash to its id, or cannot be parsed."""


class MetadataError(VrlError, TypeError):
    """Commit metadata of the wrong type or shape (e.g. nested too deeply)."""


class CheckpointError(VrlError, ValueError):
    """A file or object is not a checkpoint vrl can store (or would need unpickling)."""


class WorkspaceError(VrlError):
    """The workspace checkpoint has uncommitted changes, or there is nothing to commit."""


class PrunedError(VrlError):
    """A snapshot's tensors were pruned by retention."""


class StorageError(VrlError, OSError):
    """The disk is full, the repository is read-only, or another I/O problem."""


def storage_error(exc: OSError, root: Path, doing: str) -> StorageError:
    """Turn a low-level OSError into a one-line StorageError that says what to do."""
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return StorageError(f"disk full while {doing} in {root}: nothing was changed; "
                            "free some space (or run `vrl gc`) and retry")
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StorageError(f"repository {root} is read-only ({os.strerror(exc.errno)}) "
                            f"while {doing}; use a writable copy or fix its permissions")
    return StorageError(f"I/O error while {doing} in {root}: {exc.strerror or exc}")
