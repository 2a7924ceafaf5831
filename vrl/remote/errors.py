"""Errors raised by remotes. Each is a VrlError, so the CLI prints one line and exits 1."""

from __future__ import annotations

from vrl.errors import RefConflictError, RevisionError, VrlError


class RemoteError(VrlError):
    """A remote could not be reached, read or written."""


class RemoteConfigError(RemoteError, ValueError):
    """A remote URL, name or option is not valid, or the remote is not configured."""


class UnknownRemoteError(RemoteConfigError, KeyError):
    """No remote with that name is configured."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingBackendError(RemoteError, ImportError):
    """The fsspec backend for a URL scheme is not installed."""


class RemoteUnreachableError(RemoteError, ConnectionError):
    """The endpoint refused, timed out or went away."""


class RemoteAuthError(RemoteError, PermissionError):
    """Credentials are missing or were refused."""


class RemoteObjectMissingError(RemoteError, RevisionError):
    """An object a ref needs is not on the remote."""


class NonFastForwardError(RefConflictError):
    """A push would lose commits on the remote (or a pull would lose local ones)."""
