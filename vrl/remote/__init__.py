"""Remotes: push, fetch, pull and clone snapshots over fsspec URLs (docs/remotes.md).

Importing this package imports no backend; each is loaded when its URL is first opened.
"""

from vrl.remote.base import RemoteStore, redact
from vrl.remote.config import (
    add_remote,
    default_remote,
    dvc_remote,
    open_named,
    remotes,
    remove_remote,
    rename_remote,
)
from vrl.remote.stores import open_remote
from vrl.remote.transfer import (
    TransferResult,
    clone,
    fetch,
    is_ancestor,
    pull,
    push,
)

__all__ = [
    "RemoteStore", "TransferResult", "add_remote", "clone", "default_remote", "dvc_remote",
    "fetch", "is_ancestor", "open_named", "open_remote", "pull",
    "push", "redact", "remotes", "remove_remote", "rename_remote",
]
