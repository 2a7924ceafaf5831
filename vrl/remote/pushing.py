"""Push: refspecs, uploading what a remote lacks (big tensors as loose objects, the rest
in packs; the commits last) and the compare-and-swap of the remote refs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vrl import pack
from vrl.errors import RefConflictError, VrlError
from vrl.objects import HEADER_SIZE, Manifest, ObjectId
from vrl.refs import short_ref
from vrl.remote.base import (
    RemoteStore,
    object_key,
    pack_key,
    redact,
    require_remote,
)
from vrl.remote.common import (
    DEFAULT_JOBS,
    NoProgress,
    Progress,
    RefUpdate,
    TransferResult,
    _pool_map,
    _topo_order,
    ancestors,
    is_ancestor,
    verified_raw,
    verify_file,
)
from vrl.remote.errors import NonFastForwardError
from vrl.remote.fetching import _check_fetchable
from vrl.remote.packs import RemotePacks, cache_dir
from vrl.repo import Repo


def _refspecs(repo: Repo, refs: Iterable[str], all_branches: bool, tags: bool
              ) -> list[tuple[str, str]]:
    """(local ref, remote ref) pairs; `a:b` pushes local a to remote b."""
    out: list[tuple[str, str]] = []
    for spec in refs:
        src, _, dst = spec.partition(":")
        local = _full_ref(repo, src)
        out.append((local, _full_ref(repo, dst, like=local) if dst else local))
    if all_branches:
        out += [(r, r) for r in repo.refs.list("refs/heads/")]
    if not out:  # the current branch (also with --tags, which adds the tags)
        branch = repo.current_branch()
        if branch is None:
            raise VrlError("HEAD is detached: name the branch to push (vrl push REMOTE BRANCH)")
        out.append((f"refs/heads/{branch}", f"refs/heads/{branch}"))
    if tags:
        out += [(r, r) for r in repo.refs.list("refs/tags/")]
    return list(dict.fromkeys(out))


def _full_ref(repo: Repo, name: str, like: str | None = None) -> str:
    if name.startswith("refs/"):
        return name
    if like is not None:
        return ("refs/tags/" if like.startswith("refs/tags/") else "refs/heads/") + name
    for prefix in ("refs/heads/", "refs/tags/"):
        if repo.refs.read(prefix + name):
            return prefix + name
    raise VrlError(f"nothing to push called {name!r}: not a local branch or tag")


def push(repo: Repo, store: RemoteStore, remote_name: str, refs: Iterable[str] = (), *,
         all_branches: bool = False, tags: bool = False, force: bool = False,
         jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
         create: bool = False) -> TransferResult:
    """Upload what the remote lacks, then move each remote ref by compare-and-swap.

    A remote that does not exist yet is created only with `create` (a typo must not
    become a new store).
    """
    progress = progress or NoProgress()
    result = TransferResult()
    where = redact(store.url)
    plans: list[tuple[str, str, ObjectId, ObjectId | None, Any, str]] = []
    for local_ref, remote_ref in _refspecs(repo, refs, all_branches, tags):
        tip = repo.refs.read(local_ref)
        if tip is None:
            raise VrlError(f"{short_ref(local_ref)} has no commits to push")
        remote_tip, token = store.read_ref(remote_ref)
        if remote_tip == tip:
            status = "up-to-date"
        elif remote_tip is None:
            status = "new"
        elif is_ancestor(repo, remote_tip, tip):
            status = "fast-forward"
        elif force:
            status = "forced"
        else:
            raise _diverged(remote_name, remote_ref, remote_tip, local_ref, tip, where,
                            repo.objects.has(remote_tip))
        plans.append((local_ref, remote_ref, tip, remote_tip, token, status))
    if not any(p[3] for p in plans):  # none of our refs is there yet: is it a remote?
        heads = [p[1] for p in plans if p[1].startswith("refs/heads/")]
        require_remote(store, create=create, branch=short_ref(heads[0]) if heads else "main")

    pending = [p for p in plans if p[5] != "up-to-date"]
    if pending:
        _upload(repo, store, [p[2] for p in pending], [p[3] for p in plans if p[3]],
                list(repo.refs.list(f"refs/remotes/{remote_name}/").values()),
                jobs, progress, result)
    for local_ref, remote_ref, tip, remote_tip, token, status in plans:
        if status != "up-to-date":
            remote_tip, status = _move_remote_ref(repo, store, remote_name, local_ref,
                                                  remote_ref, tip, remote_tip, token,
                                                  status, force)
        result.updates.append(RefUpdate(remote_ref, remote_tip, tip, status))
        if remote_ref.startswith("refs/heads/"):
            _set_tracking(repo, remote_name, remote_ref, tip, "push")
    if pending:
        _ensure_remote_head(store, [p[1] for p in plans])
    return result


def _diverged(remote_name: str, remote_ref: str, remote_tip: ObjectId, local_ref: str,
              tip: ObjectId, where: str, known: bool) -> NonFastForwardError:
    why = "the histories diverged" if known else "it has commits you do not have"
    return NonFastForwardError(
        f"push to {remote_name}/{short_ref(remote_ref)} rejected (not a fast-forward): "
        f"{remote_name} is at {remote_tip[:12]}, your {short_ref(local_ref)} is at "
        f"{tip[:12]} and {why}; run `vrl pull {remote_name}` (or `vrl fetch`) and retry, "
        "or push with --force to overwrite the remote")


def _move_remote_ref(repo: Repo, store: RemoteStore, remote_name: str, local_ref: str,
                     remote_ref: str, tip: ObjectId, remote_tip: ObjectId | None, token: Any,
                     status: str, force: bool) -> tuple[ObjectId | None, str]:
    for _ in range(5):
        try:
            store.cas_ref(remote_ref, tip, token)
            return remote_tip, status
        except RefConflictError:
            # Someone else moved it after we looked: retry only if we still fast-forward.
            now, token = store.read_ref(remote_ref)
            if now == tip:
                return remote_tip, "up-to-date"
            if now is not None and not force and not is_ancestor(repo, now, tip):
                raise _diverged(remote_name, remote_ref, now, local_ref, tip,
                                redact(store.url), repo.objects.has(now)) from None
            remote_tip = now
    raise RefConflictError(f"{remote_name}/{short_ref(remote_ref)} keeps moving (other "
                           "pushers are busy); retry")


def _ensure_remote_head(store: RemoteStore, pushed: list[str]) -> None:
    """Give a fresh remote a HEAD (so clones know the default branch); best effort."""
    branches = [r for r in pushed if r.startswith("refs/heads/")]
    if not branches:
        return
    try:
        data, token = store.read_versioned("HEAD")
        if data is None:
            store.swap("HEAD", f"ref: {branches[0]}\n".encode(), None)
    except RefConflictError:
        pass


def _set_tracking(repo: Repo, remote_name: str, remote_ref: str, tip: ObjectId,
                  why: str) -> None:
    name = f"refs/remotes/{remote_name}/{remote_ref[len('refs/heads/'):]}"
    if repo.refs.read(name) != tip:
        repo.refs.update(name, tip, reason=f"{why}: {remote_name}")


LIST_THRESHOLD = 256  # above this many questions, one listing beats one HEAD per object
PACK_SPLIT = 64 << 20  # an uploaded pack of tensors holds at most about this many bytes
ONE_PACK_MAX = 1 << 20  # a push this small sends one pack; a bigger one sends its tensors'
# pack(s), then one pack of manifests and commits (so fetches find the history in one read)
REMOTE_PACK_MAX = 1 << 20
"""Tensors smaller than this are pushed inside the pack (bigger ones loose). As the local
store's PACK_MAX: over a network a request costs more than sending ~1 MiB (S3:
tens of ms each), while a fetch still reads a single packed tensor with one ranged read;
fetched objects are written through the local store, which keeps its own layout."""


def _remote_has(store: RemoteStore, packs: RemotePacks, ids: list[ObjectId], jobs: int
                ) -> set[ObjectId]:
    """Which of `ids` the remote holds: in its packs, else loose (from the listing when
    `packs` listed loose objects or there are many questions, else one HEAD each)."""
    if not ids:
        return set()
    found = {o for o in ids if packs.where(o)}
    rest = [o for o in ids if o not in found]
    if rest and packs.loose is None and len(rest) > LIST_THRESHOLD:
        packs.load(loose=True)
    if packs.loose is not None:
        return found | (set(rest) & packs.loose)
    return found | {o for o, ok in zip(rest, _pool_map(store.has_object, rest, jobs),
                                       strict=True) if ok}


def _upload(repo: Repo, store: RemoteStore, tips: list[ObjectId], remote_tips: list[ObjectId],
            tracking: list[ObjectId], jobs: int, progress: Progress,
            result: TransferResult) -> None:
    """Send what the remote lacks of the history behind `tips`: big tensors as loose
    objects, then everything else in one pack; over ONE_PACK_MAX bytes, the small
    tensors in packs of up to PACK_SPLIT bytes, then the manifests and commits in one."""
    for tip in tips:
        if not repo.objects.has(tip):
            raise VrlError(f"commit {tip[:12]} is missing locally; run `vrl fsck`")
    packs = RemotePacks(store, cache_dir(repo.vrl_dir), jobs)
    # Commits a remote ref points to are complete there with all their ancestors, because
    # refs move only after everything is uploaded: no need to ask. Remote-tracking refs
    # may be stale (the remote was recreated): ask about those.
    trusted = [c for c in dict.fromkeys(remote_tips) if repo.objects.has(c)]
    ask = [c for c in dict.fromkeys(tracking) if c not in trusted and repo.objects.has(c)]
    found = _remote_has(store, packs, ask, jobs)
    if not trusted and not found:  # a new remote, or leftovers of an interrupted push:
        packs.load(loose=True)  # one listing tells what is there
    base = ancestors(repo, trusted + sorted(found))
    local = ancestors(repo, tips) - base
    commits = _topo_order(local, lambda c: repo.read_commit(c).parents)
    boundary = {p for c in commits for p in repo.read_commit(c).parents if p not in local}
    known: set[ObjectId] = set()
    for c in boundary:
        if repo.objects.has(c):
            known |= {e.id for e in _manifest(repo, c).data_entries().values()}
    manifests = list(dict.fromkeys(repo.read_commit(c).manifest for c in commits))
    tensors: list[ObjectId] = []
    tensor_sizes: dict[ObjectId, int] = {}
    for m in manifests:
        for entry in repo.read_manifest(m).data_entries().values():
            if entry.id not in known:
                known.add(entry.id)
                tensors.append(entry.id)
                tensor_sizes[entry.id] = entry.nbytes
    # An interrupted push (or another branch) may have left some of these there: skip
    # those in a pack, and big tensors already there loose (one HEAD each, or the listing).
    # A small object outside every pack is sent again: cheaper than asking.
    big = [t for t in tensors if tensor_sizes[t] >= REMOTE_PACK_MAX]
    there = packs.packed() & set(tensors + manifests + commits)
    there |= _remote_has(store, packs, [t for t in big if t not in there], jobs)
    if packs.loose is not None:
        there |= packs.loose & set(tensors + manifests + commits)
    data = [o for o in tensors + manifests if o not in there]
    new_commits = [c for c in commits if c not in there]
    missing_local = [o for o in data if not repo.objects.has(o)]
    if missing_local and repo.lazy:
        repo.fetch_missing(missing_local, {o: ("tensor", tensor_sizes[o]) for o in missing_local
                                           if o in tensor_sizes})
    for o in data:
        if not repo.objects.has(o):
            raise VrlError(f"object {o[:12]} is needed for the push but is not in this "
                           "repository (pruned or a metadata-only clone) nor on the remote")
    sizes = {o: HEADER_SIZE + repo.objects.kind_and_size(o)[1] for o in data + new_commits}
    where = redact(store.url)
    progress.begin(f"push {where}", sum(sizes.values()), len(sizes))
    kinds = dict.fromkeys(tensors, "tensor") | dict.fromkeys(manifests, "manifest") | \
        dict.fromkeys(new_commits, "commit")
    loose = sorted((o for o in data if o in tensor_sizes and
                    tensor_sizes[o] >= REMOTE_PACK_MAX),
                   key=lambda o: -sizes[o])  # biggest first keeps every worker busy
    small = [o for o in data if o not in set(loose)]
    if sum(sizes[o] for o in small + new_commits) <= ONE_PACK_MAX:
        groups, last = [], small + new_commits  # read whole by any fetch anyway
    else:  # the history (manifests, commits) apart: a clone reads it whole, lazy or not
        groups = _split([o for o in small if kinds[o] == "tensor"], sizes)
        last = [o for o in small if kinds[o] != "tensor"] + new_commits

    # Every object is hashed before it is sent (blake3: GB/s): damage here must not reach
    # the remote, where every clone would fail on it.
    def checked(oid: ObjectId) -> bytes:
        raw = verified_raw(repo, oid, kinds[oid], where)
        if kinds[oid] != "tensor":
            _check_fetchable(oid, raw, kinds[oid])
        return raw

    def send(oid: ObjectId) -> None:
        path = repo.objects.loose_path(oid) if kinds[oid] == "tensor" else None
        if path is not None:  # big tensors: streamed from their file
            verify_file(oid, path, kinds[oid], where)
            store.put_file(object_key(oid), path)
        else:  # packed here: its bytes, read by id
            store.put(object_key(oid), checked(oid))
        progress.advance(sizes[oid])

    def send_pack(ids: list[ObjectId]) -> None:
        name, data_, entries = pack.build_bytes((o, checked(o)) for o in ids)
        if pack_key(name) not in packs.sizes:  # else a rerun: that very pack is there
            store.put(pack_key(name), data_)
        packs.add(name, data_, entries)
        progress.advance(sum(sizes[o] for o in ids))

    def send_any(job: ObjectId | list[ObjectId]) -> None:
        send_pack(job) if isinstance(job, list) else send(job)

    try:
        # The tensors (loose ones, and their packs when apart) in parallel; then the pack
        # with the commits, only after all the data they name; the ref moves last.
        _pool_map(send_any, [*loose, *groups], jobs)
        if last:
            send_pack(last)
        for o in data + new_commits:
            result.objects[kinds[o]] += 1
            result.bytes += sizes[o]
    finally:
        progress.end()


def _split(ids: list[ObjectId], sizes: dict[ObjectId, int]) -> list[list[ObjectId]]:
    """`ids` in groups of at most about PACK_SPLIT bytes."""
    groups: list[list[ObjectId]] = [[]]
    total = 0
    for o in ids:
        if groups[-1] and total + sizes[o] > PACK_SPLIT:
            groups.append([])
            total = 0
        groups[-1].append(o)
        total += sizes[o]
    return [g for g in groups if g]


def _manifest(repo: Repo, commit: ObjectId) -> Manifest:
    return repo.read_manifest(repo.read_commit(commit).manifest)

