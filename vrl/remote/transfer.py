"""Push, fetch, pull and clone between a Repo and a RemoteStore.

Invariants: on a remote, a commit a ref points to is complete (its manifest, tensors and
all its ancestors are there), and a commit object is never uploaded before its manifest
and tensors; so push uploads big tensors (loose), then one pack holding every small
object, manifest and commit (a pack appears whole or not at all), and moves the ref last.
Locally, a commit object present means its ancestors are present (and its tensors, unless
the repository is a partial clone); so fetch writes commits last, oldest first. An
interrupted transfer leaves only unreferenced objects, and the next run skips whatever
already arrived.

The code lives by concept: vrl.remote.pushing (push), vrl.remote.fetching (fetch, and
the caps on a remote's metadata), vrl.remote.cloning (pull, clone, the on-demand
fetchers) and vrl.remote.common (results, progress, verification). This module gives
their public names in one place. Its constants are copies: a test that changes one
patches the module that reads it (MAX_*_BYTES: fetching; REMOTE_PACK_MAX, ONE_PACK_MAX,
PACK_SPLIT, LIST_THRESHOLD: pushing).
"""

from vrl.remote.cloning import (
    clone,
    fetch_missing,
    fetch_pruned,
    pull,
)
from vrl.remote.common import (
    DEFAULT_JOBS,
    NoProgress,
    Progress,
    RefUpdate,
    TransferResult,
    ancestors,
    damaged_here,
    is_ancestor,
    verified_raw,
    verify_file,
)
from vrl.remote.fetching import (
    FETCH_BATCH,
    MAX_COMMIT_BYTES,
    MAX_MANIFEST_BYTES,
    MAX_PARSE_BYTES,
    PARSE_OVERHEAD,
    Links,
    fetch,
    fetch_objects,
    parse_cost,
    parse_remote,
)
from vrl.remote.pushing import (
    LIST_THRESHOLD,
    ONE_PACK_MAX,
    PACK_SPLIT,
    REMOTE_PACK_MAX,
    push,
)

__all__ = [
    "DEFAULT_JOBS", "FETCH_BATCH", "LIST_THRESHOLD", "MAX_COMMIT_BYTES", "MAX_MANIFEST_BYTES",
    "MAX_PARSE_BYTES", "ONE_PACK_MAX", "PACK_SPLIT", "PARSE_OVERHEAD", "REMOTE_PACK_MAX",
    "Links", "NoProgress", "Progress", "RefUpdate", "TransferResult", "ancestors", "clone",
    "damaged_here", "fetch", "fetch_missing", "fetch_objects", "fetch_pruned",
    "is_ancestor", "parse_cost", "parse_remote", "pull", "push",
    "verified_raw", "verify_file",
]
