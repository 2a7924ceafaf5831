"""The small interface every remote implements, over keys relative to the remote's root.

A remote has the repository layout: `objects/ab/cdef...` (each file byte-identical to the
local object file), packs `objects/pack/pack-<name>.pack` (the local pack format, see
vrl/pack.py), `refs/heads/...`, `refs/tags/...` and `HEAD`. Implementations only
need atomic whole-key writes and a compare-and-swap on small keys (refs); the transfer
logic in `vrl.remote.transfer` builds push/fetch on top.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vrl.errors import InvalidRefNameError, RefConflictError, VrlError
from vrl.objects import ObjectId, is_object_id
from vrl.refs import check_ref_name
from vrl.remote.credentials import is_secret_option, redact, redact_options
from vrl.remote.errors import (
    RemoteAuthError,
    RemoteError,
    RemoteUnreachableError,
)


def object_key(oid: ObjectId | str) -> str:
    return f"objects/{oid[:2]}/{oid[2:]}"


PACK_PREFIX = "objects/pack/"


def pack_key(name: str) -> str:
    """The key of the pack whose name (index checksum) is `name`."""
    return f"{PACK_PREFIX}pack-{name}.pack"


LOCK_TIMEOUT = 20.0  # seconds a ref lock is waited for on a remote


def is_temp_key(name: str) -> bool:
    """True for a remote's temporary, lock or stale-lock file (never an object or ref)."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".tmp-") or base.endswith(".lock") or ".stale-" in base


MAX_REF_BYTES = 4096  # a ref is 65 bytes; HEAD a short "ref: refs/heads/..." line
MAX_REF_NAME = 1024


def too_large(key: str, url: str, limit: int, what: str) -> RemoteError:
    return RemoteError(f"{key[:200]} on {redact(url)} is over {limit} bytes, too large for a "
                       f"vrl {what}: the remote is damaged; refusing it")


class KeyMissing(Exception):
    """Internal: a key is absent on the remote."""


class RemoteStore(ABC):
    """Whole-key storage with atomic writes and compare-and-swap on small keys.

    `guarantee` says, in one line, what concurrent writers can rely on with this backend.
    """

    url: str = ""
    guarantee: str = ""

    # ---------------------------------------------------------------- plain keys
    @abstractmethod
    def get(self, key: str) -> bytes:
        """The bytes of `key`; raise KeyMissing if absent."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create or replace `key` atomically: readers see the old bytes or all new ones."""

    def get_small(self, key: str, limit: int, what: str = "object") -> bytes:
        """The bytes of `key`, refusing anything over `limit` bytes (metadata and refs from
        a remote are small; a huge one is damage or an attack, never read nor printed)."""
        data = self.get(key)
        if len(data) > limit:
            raise too_large(key, self.url, limit, what)
        return data

    def put_file(self, key: str, local: Path) -> None:
        """Upload a local file as `key` (atomically). Backends stream where they can."""
        self.put(key, Path(local).read_bytes())

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes `start` to `end` (exclusive) of `key`, in one request where the backend
        can; raise KeyMissing if absent. Callers check the range against the key's size
        (from `list_sizes`) first: a short answer means the key changed or is damaged."""
        return self.get(key)[start:end]

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """Every key under `prefix` (as `list`) and its size in bytes: one listing where
        the backend can."""
        out = {}
        for key in self.list(prefix):
            with contextlib.suppress(KeyMissing):
                out[key] = len(self.get(key))
        return out

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key under `prefix` (recursive), excluding temp and lock files."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    # ---------------------------------------------------------------- small mutable keys
    @abstractmethod
    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        """(bytes or None if absent, an opaque version token for `swap`)."""

    @abstractmethod
    def swap(self, key: str, data: bytes, expected: Any) -> None:
        """Replace `key` only if it still has the version `expected` (None: still absent).

        Raise RefConflictError if it changed.
        """

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release connections."""

    # ---------------------------------------------------------------- refs
    def read_ref(self, name: str) -> tuple[ObjectId | None, Any]:
        """A ref's commit id (None if absent). A ref holding anything but an id is refused
        without showing its content (it may be a huge file or a link to a private one)."""
        data, token = self.read_versioned(name)
        return self._ref_value(name, data), token

    def _ref_value(self, name: str, data: bytes | None) -> ObjectId | None:
        if not data:
            return None
        text = data[:MAX_REF_BYTES + 1].decode("ascii", "replace").strip()
        if len(data) > MAX_REF_BYTES or not is_object_id(text):
            raise RemoteError(f"ref {name[:200]!r} on {redact(self.url)} is damaged: it does not "
                              f"hold a commit id ({len(data)} bytes); repair or delete it "
                              "on the remote")
        return ObjectId(text)

    def cas_ref(self, name: str, new: ObjectId, expected: Any) -> None:
        self.swap(name, f"{new}\n".encode(), expected)

    def list_refs(self) -> dict[str, ObjectId]:
        """Every ref under refs/ and its value."""
        out: dict[str, ObjectId] = {}
        for key in sorted(self.list("refs/")):
            if not key.startswith(("refs/heads/", "refs/tags/")):
                continue  # e.g. a repository's own remote-tracking refs
            try:
                if len(key) > MAX_REF_NAME:
                    raise InvalidRefNameError(f"over {MAX_REF_NAME} characters")
                check_ref_name(key)
            except InvalidRefNameError as exc:
                raise RemoteError(f"{redact(self.url)} has a ref with an invalid name "
                                  f"{key[:100]!r} ({exc}); rename or delete it on the remote"
                                  ) from None
            try:  # bounded read: a huge "ref" is never loaded, nor shown
                data = self.get_small(key, MAX_REF_BYTES, "ref")
            except KeyMissing:
                continue
            value = self._ref_value(key, data)
            if value:
                out[key] = value
        return out

    def has_object(self, oid: ObjectId) -> bool:
        return self.exists(object_key(oid))

    # ---------------------------------------------------------------- existence
    def state(self) -> str:
        """"store" (a vrl remote: HEAD or refs there), "empty" (an empty directory the user
        made), "missing" (nothing there) or "other" (something that is not a vrl remote)."""
        return "store" if self.exists("HEAD") or self.list("refs/") else "missing"

    def create(self, branch: str = "main") -> None:
        """Make this an (empty) vrl remote: HEAD names `branch`. Existing ones are kept."""
        with contextlib.suppress(RefConflictError):
            if self.read_versioned("HEAD")[0] is None:
                self.swap("HEAD", f"ref: refs/heads/{branch}\n".encode(), None)

    # ---------------------------------------------------------------- errors
    @contextlib.contextmanager
    def guard(self, doing: str) -> Iterator[None]:
        """Turn backend exceptions into one-line RemoteErrors (credentials never shown)."""
        try:
            yield
        except (VrlError, KeyMissing):
            raise
        except Exception as exc:  # noqa: BLE001 - every backend raises its own types
            raise translate(exc, self.url, doing) from exc


_AUTH_NAMES = ("NoCredentialsError", "PartialCredentialsError", "PermissionDenied",
               "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
               "DefaultCredentialsError", "ClientAuthenticationError", "KeyImportError")
_NET_NAMES = ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
              "ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError",
              "ConnectionLost", "DisconnectError", "ChannelOpenError", "TimeoutError",
              "ConnectionError", "ClientOSError", "ProxyConnectionError")


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def translate(exc: BaseException, url: str, doing: str) -> RemoteError:
    """A one-line error for any backend failure; the URL is redacted."""
    where = redact(url)
    names = set()
    cur: BaseException | None = exc
    for _ in range(5):  # backends wrap the interesting error in their own
        if cur is None:
            break
        names |= _names(cur)
        cur = cur.__cause__ or cur.__context__
    detail = redact(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)[:200]
    if names & set(_AUTH_NAMES) or isinstance(exc, PermissionError):
        return RemoteAuthError(
            f"{where}: access denied or no credentials while {doing} ({detail}); configure "
            "the backend's usual credentials (AWS profile or env vars, SSH key or agent, "
            "gcloud / az login)")
    if names & set(_NET_NAMES) or isinstance(exc, (socket.gaierror, ConnectionError,
                                                    TimeoutError)) or \
            getattr(exc, "errno", None) in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                            errno.ETIMEDOUT, errno.ENETUNREACH):
        return RemoteUnreachableError(f"{where} is unreachable while {doing} ({detail}); "
                                      "check the URL / endpoint and that the server is up")
    if isinstance(exc, FileNotFoundError):
        return RemoteError(f"{where}: not found while {doing} ({detail}); check the bucket "
                           "or path exists")
    return RemoteError(f"{where}: error while {doing}: {type(exc).__name__}: {detail}")


__all__ = ["RemoteStore", "KeyMissing", "RefConflictError", "is_secret_option", "object_key",
           "redact", "redact_options", "translate"]


def require_remote(store: RemoteStore, *, create: bool = False, branch: str = "main",
                 doing: str = "push to") -> None:
    """Refuse to treat a mistyped location as a remote: it must be a vrl remote already,
    or (push only) be created on request (`create`) or be an empty directory."""
    where = redact(store.url)
    state = store.state()
    if state == "store":
        return
    if state == "other":
        raise RemoteError(f"cannot {doing} {where}: it is not a vrl remote (it holds other "
                          "files); check the URL, or use a new or empty location")
    if doing == "push to" and (create or state == "empty"):
        store.create(branch)
        return
    if doing == "push to":
        raise RemoteError(f"cannot push to {where}: no vrl remote there; check the URL, or "
                          "pass --create (`vrl push --create`, or `vrl remote add --create`) "
                          "to start a new remote there")
    raise RemoteError(f"cannot {doing} {where}: " + (
        "it is an empty directory, not a vrl remote" if state == "empty" else
        "no vrl repository or remote there (nothing has been pushed)") + "; check the URL")
