"""Pull and clone, and the on-demand downloads a repository asks for (`Repo.fetch_missing`
and `Repo.fetch_pruned` find this module through the `vrl.remote` entry point)."""

from __future__ import annotations

import shutil
from pathlib import Path

from vrl.errors import VrlError
from vrl.objects import ObjectId
from vrl.refs import short_ref
from vrl.remote.base import (
    MAX_REF_BYTES,
    KeyMissing,
    RemoteStore,
    redact,
    require_remote,
)
from vrl.remote.common import (
    DEFAULT_JOBS,
    Progress,
    RefUpdate,
    TransferResult,
    is_ancestor,
)
from vrl.remote.errors import NonFastForwardError, RemoteError
from vrl.remote.fetching import fetch, fetch_objects
from vrl.repo import Repo


def pull(repo: Repo, store: RemoteStore, remote_name: str, branch: str | None = None, *,
         jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
         metadata_only: bool = False) -> tuple[RefUpdate, TransferResult]:
    """Fetch, then fast-forward the current branch (or `branch`) to its remote twin."""
    branch = branch or repo.current_branch()
    if branch is None:
        raise VrlError("HEAD is detached: check out a branch, or name one (vrl pull REMOTE "
                       "BRANCH)")
    partial = repo.config.flag("core", "partial")
    result = fetch(repo, store, remote_name, jobs=jobs, progress=progress,
                   metadata_only=metadata_only or partial)
    theirs = repo.refs.read(f"refs/remotes/{remote_name}/{branch}")
    if theirs is None:
        raise RemoteError(f"{remote_name} has no branch {branch!r}")
    ref = f"refs/heads/{branch}"
    ours = repo.refs.read(ref)
    if ours == theirs or (ours is not None and is_ancestor(repo, theirs, ours)):
        return RefUpdate(ref, ours, ours, "up-to-date"), result
    if ours is not None and not is_ancestor(repo, ours, theirs):
        raise NonFastForwardError(
            f"cannot fast-forward {branch}: your {branch} ({ours[:12]}) and "
            f"{remote_name}/{branch} ({theirs[:12]}) have diverged; keep yours with "
            f"`vrl push {remote_name} {branch}:<new-branch>`, or take theirs with "
            f"`vrl reset --hard {remote_name}/{branch}`")
    repo.refs.update(ref, theirs, expected=ours, reason=f"pull: fast-forward from "
                                                        f"{remote_name}")
    return RefUpdate(ref, ours, theirs, "fast-forward" if ours else "new"), result


def clone(url: str, directory: str | Path | None = None, *, branch: str | None = None,
          options: dict[str, str] | None = None, metadata_only: bool = False,
          jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
          checkout: bool = True, remote_name: str = "origin") -> Repo:
    """init + add remote + fetch + check out `branch` (the remote's HEAD by default).

    A failed clone removes the directory it created.
    """
    from vrl.remote.config import add_remote, default_dir, open_named
    from vrl.remote.stores import check_options, check_url, open_remote

    check_url(url)
    check_options(dict(options or {}))
    if "://" not in url:  # the remote's config entry must not depend on the current directory
        url = str(Path(url).expanduser().absolute())
    target = Path(directory or default_dir(url))
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise VrlError(f"destination {target} already exists and is not empty")
    probe = open_remote(url, options)
    try:  # before anything is created here: a typo must not leave a half-made clone
        if probe.state() != "store":
            require_remote(probe, doing="clone")
    finally:
        probe.close()
    created = not target.exists()
    try:
        repo = Repo.init(target, branch=branch or "main")
        add_remote(repo, remote_name, url, options or {})
        if metadata_only:
            repo.config.set("core", "partial", "true")
            repo.config.set("core", "promisor", remote_name)
            repo.config.save()
        store = open_named(repo, remote_name)
        try:
            fetch(repo, store, remote_name, metadata_only=metadata_only, jobs=jobs,
                  progress=progress)
            chosen = branch or _remote_default_branch(repo, store, remote_name)
        finally:
            store.close()
        if chosen:
            tip = repo.refs.read(f"refs/remotes/{remote_name}/{chosen}")
            if tip is None:
                raise RemoteError(f"{remote_name} has no branch {chosen!r}")
            repo.refs.update(f"refs/heads/{chosen}", tip, expected=None,
                             reason=f"clone: from {redact(url)}")
            repo.refs.set_head(f"refs/heads/{chosen}", reason=f"clone: checkout {chosen}")
            if checkout and not metadata_only:
                repo.write_workspace(tip)
        if metadata_only:
            # reopened: a partial clone, as its config now says
            repo = Repo(target)
        return repo
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            shutil.rmtree(target / ".vrl", ignore_errors=True)
        raise


def _remote_default_branch(repo: Repo, store: RemoteStore, remote_name: str) -> str | None:
    branches = [short_ref(r)[len(remote_name) + 1:]
                for r in repo.refs.list(f"refs/remotes/{remote_name}/")]
    if not branches:
        return None
    try:
        data = store.get_small("HEAD", MAX_REF_BYTES, "HEAD")
    except KeyMissing:
        data = b""
    text = data.decode("utf-8", "replace").strip()
    if text.startswith("ref: refs/heads/") and text[16:] in branches:
        return text[16:]
    return "main" if "main" in branches else branches[0]


# ------------------------------------------------------------------------------ lazy tensors


def fetch_missing(repo: Repo, ids: list[ObjectId],
                  expect: dict[ObjectId, tuple[str, int]] | None = None,
                  jobs: int = DEFAULT_JOBS) -> None:
    """Download `ids` from a partial clone's promisor remote (`Repo.fetch_missing`)."""
    from vrl.remote.config import open_named

    store = open_named(repo, repo.config.get("core", "promisor"))
    try:
        fetch_objects(repo, store, list(ids), jobs=jobs, expect=expect)
    finally:
        store.close()


def fetch_pruned(repo: Repo, ids: list[ObjectId],
                       expect: dict[ObjectId, tuple[str, int]] | None = None) -> bool | str:
    """Fetch objects (a pruned snapshot's tensors) from the first remote that has them all;
    `expect` maps ids to the (kind, payload size) the manifest promised.

    Returns True on success, else the names of the remotes tried ("" if none).
    """
    from vrl.remote.config import open_named, remotes

    names = list(remotes(repo))
    for name in names:
        missing = [o for o in ids if not repo.objects.has(o)]
        try:
            store = open_named(repo, name)
            try:
                fetch_objects(repo, store, missing, expect=expect)
            finally:
                store.close()
        except VrlError:
            continue
        if all(repo.objects.has(o) for o in ids):
            return True
    return ", ".join(names)
