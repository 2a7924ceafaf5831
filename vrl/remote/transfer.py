"""Push, fetch, pull and clone between a Repo and a RemoteStore.

Invariants: on a remote, a commit a ref points to is complete (its manifest, tensors and
all its ancestors are there), and a commit object is never uploaded before its manifest
and tensors; so push uploads big tensors (loose), then one pack holding every small
object, manifest and commit (a pack appears whole or not at all), and moves the ref last.
Locally, a commit object present means its ancestors are present (and its tensors, unless
the repository is a partial clone); so fetch writes commits last, oldest first. An
interrupted transfer leaves only unreferenced objects, and the next run skips whatever
already arrived.
"""

from __future__ import annotations

import itertools
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import blake3

from vrl import pack
from vrl.errors import CorruptObjectError, RefConflictError, VrlError
from vrl.gclock import writes
from vrl.objects import HEADER_SIZE, Commit, Manifest, ObjectId, is_object_id, parse_header
from vrl.refs import short_ref
from vrl.remote.base import (
    MAX_REF_BYTES,
    KeyMissing,
    RemoteStore,
    object_key,
    pack_key,
    redact,
    require_remote,
)
from vrl.remote.errors import NonFastForwardError, RemoteError, RemoteObjectMissingError
from vrl.remote.packs import PackReader, RemotePacks, cache_dir
from vrl.repo import Repo, register_fetchers

DEFAULT_JOBS = 8


class Progress(Protocol):
    """What transfers report to (the CLI passes a tqdm bar; the library default is silent)."""

    def begin(self, label: str, total_bytes: int, total_objects: int) -> None: ...

    def advance(self, nbytes: int) -> None: ...

    def end(self) -> None: ...


class NoProgress:
    def begin(self, label: str, total_bytes: int, total_objects: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def end(self) -> None:
        pass


@dataclass
class RefUpdate:
    """One ref a transfer looked at: `status` is new, fast-forward, forced or up-to-date."""

    ref: str
    old: ObjectId | None
    new: ObjectId | None
    status: str


@dataclass
class TransferResult:
    """What moved: objects per kind and bytes, plus the refs touched."""

    updates: list[RefUpdate] = field(default_factory=list)
    objects: dict[str, int] = field(default_factory=lambda: {"tensor": 0, "manifest": 0,
                                                             "commit": 0})
    bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"updates": [u.__dict__ for u in self.updates], "objects": self.objects,
                "bytes": self.bytes}


# ------------------------------------------------------------------------------ helpers


def _pool_map(func: Callable[[Any], Any], items: Iterable[Any], jobs: int) -> list[Any]:
    """`[func(i) for i in items]` on up to `jobs` threads. The first failure stops the
    rest: a remote that names 100,000 objects it does not have is refused at the first
    one, not after asking for every one (nor after queueing a future for each)."""
    items = list(items)
    if jobs <= 1 or len(items) <= 1:
        return [func(i) for i in items]
    results: list[Any] = [None] * len(items)
    failed: list[BaseException] = []
    order = itertools.count()  # next() on it is atomic: each index is taken once

    def work() -> None:
        while not failed:
            i = next(order)
            if i >= len(items):
                return
            try:
                results[i] = func(items[i])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                failed.append(exc)

    threads = [threading.Thread(target=work, daemon=True)
               for _ in range(min(jobs, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return results


def ancestors(repo: Repo, tips: Iterable[ObjectId]) -> set[ObjectId]:
    """Every commit reachable from `tips` that this repository has (tips included)."""
    seen: set[ObjectId] = set()
    stack = [t for t in tips if t]
    while stack:
        oid = stack.pop()
        if oid in seen or not repo.objects.has(oid):
            continue
        seen.add(oid)
        try:
            stack.extend(repo.read_commit(oid).parents)
        except VrlError:
            continue
    return seen


def is_ancestor(repo: Repo, old: ObjectId, new: ObjectId) -> bool:
    """True if `old` is `new` or one of its ancestors (as far as this repository knows)."""
    if old == new:
        return True
    if not repo.objects.has(old):
        return False
    return old in ancestors(repo, [new])


def _verify(oid: ObjectId, raw: bytes, where: str, kind: str | None = None) -> str:
    """Check that downloaded bytes hash to their id; return the object's kind."""
    if blake3.blake3(raw, max_threads=blake3.blake3.AUTO if len(raw) > (1 << 22) else 1
                     ).hexdigest() != oid:
        raise CorruptObjectError(f"object {oid} from {where} is corrupted (its bytes do not "
                                 "hash to its id); nothing was written; repair the remote "
                                 "with `vrl push --repair` from a repository that holds "
                                 "a good copy")
    got, size = parse_header(raw)
    if len(raw) - HEADER_SIZE != size or (kind and got != kind):
        raise CorruptObjectError(f"object {oid} from {where} is not a valid {kind or 'object'}"
                                 "; nothing was written")
    return got


def _reader(repo: Repo, store: RemoteStore, jobs: int) -> PackReader:
    """Reads objects from `store`'s packs and loose keys (its pack indexes cached here)."""
    return PackReader(store, RemotePacks(store, cache_dir(repo.vrl_dir), jobs), jobs)


def _download(reader: PackReader, oid: ObjectId, kind: str | None = None,
              limit: int | None = None, what: str = "object", limit_loose: bool = True
              ) -> bytes:
    """One object, verified. A packed copy that fails verification is replaced by a loose
    copy of the same id when the remote has one (a remote may hold both)."""
    where = redact(reader.store.url)
    try:
        raw = reader.get(oid, limit, what, limit_loose)
    except KeyMissing:
        raise RemoteObjectMissingError(f"object {oid[:12]} is missing on {where}"
                                       + reader.packs.damage_note()) from None
    try:
        _verify(oid, raw, where, kind)
    except CorruptObjectError:
        other = reader.loose_fallback(oid, limit if limit_loose else None, what)
        if other is None:
            raise
        _verify(oid, other, where, kind)
        raw = other
    return raw


def _store_raw(repo: Repo, oid: ObjectId, raw: bytes) -> None:
    kind, _ = parse_header(raw)
    repo.objects.write(kind, memoryview(raw)[HEADER_SIZE:], oid)


def _hashes_to(oid: ObjectId, data: bytes | memoryview) -> bool:
    threads = blake3.blake3.AUTO if len(data) > (1 << 22) else 1
    return blake3.blake3(data, max_threads=threads).hexdigest() == oid


def damaged_here(oid: ObjectId, kind: str, remote: str) -> CorruptObjectError:
    """The error of a push that found a damaged object in this repository."""
    return CorruptObjectError(
        f"{kind} {oid[:12]} in this repository is damaged (its bytes do not match its "
        f"id); the push sent nothing damaged and moved no ref on {remote}; run `vrl fsck`, "
        "then restore the object from a good copy (e.g. `vrl fetch` from a remote that "
        "holds it intact) and push again")


def verified_raw(repo: Repo, oid: ObjectId, kind: str, remote: str) -> bytes:
    """An object's stored bytes (header + payload), hashed to its id first: what a push
    sends is never damage it would spread to every clone."""
    try:
        raw = repo.objects.read_raw(oid)
    except CorruptObjectError:
        raise damaged_here(oid, kind, remote) from None
    if not _hashes_to(oid, raw):
        raise damaged_here(oid, kind, remote)
    return raw


def verify_file(oid: ObjectId, path: Path, kind: str, remote: str) -> None:
    """Hash a loose object file (through a read-only map, on several cores when big)
    before it is uploaded from that file. Objects are immutable: the file read again for
    the upload holds the bytes just hashed."""
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    try:
        if path.stat().st_size:
            hasher.update_mmap(path)
    except OSError:
        raise damaged_here(oid, kind, remote) from None
    if hasher.hexdigest() != oid:
        raise damaged_here(oid, kind, remote)


# ------------------------------------------------------------------------------ push


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
    if missing_local and repo.fetch_missing is not None:
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


def _check_fetchable(oid: ObjectId, raw: bytes, kind: str) -> None:
    """Refuse to push a commit or manifest no fetch would accept (over the caps fetch
    puts on a remote's metadata): the push would succeed and every clone fail."""
    limit = MAX_COMMIT_BYTES if kind == "commit" else MAX_MANIFEST_BYTES
    cost = parse_cost(raw)
    if len(raw) - HEADER_SIZE > limit or cost > MAX_PARSE_BYTES:
        raise VrlError(
            f"{kind} {oid[:12]} is too big to push: {(len(raw) - HEADER_SIZE) >> 20} MiB, "
            f"up to {cost >> 20} MiB to read, and a fetch reads a {kind} of at most "
            f"{limit >> 20} MiB taking at most {MAX_PARSE_BYTES >> 20} MiB (so that a "
            "hostile remote cannot exhaust memory); no ref moved")


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


def _topo_order(commits: Iterable[ObjectId],
                parents: Callable[[ObjectId], Iterable[ObjectId]]) -> list[ObjectId]:
    """Parents before children (only parents within `commits` count)."""
    members = set(commits)
    order: list[ObjectId] = []
    done: set[ObjectId] = set()
    opened: set[ObjectId] = set()  # a cycle (impossible with intact hashes) cannot loop
    for start in sorted(members):
        stack: list[tuple[ObjectId, bool]] = [(start, False)]
        while stack:
            oid, expanded = stack.pop()
            if oid in done:
                continue
            if expanded:
                done.add(oid)
                order.append(oid)
                continue
            if oid in opened:
                continue
            opened.add(oid)
            stack.append((oid, True))
            stack.extend((p, False) for p in parents(oid) if p in members and p not in done)
    return order


# ------------------------------------------------------------------------------ fetch


# Caps on metadata read from a remote: what a hostile remote can make a fetch hold is what
# these allow, so they are set from what real objects need, not "big enough".
MAX_COMMIT_BYTES = 16 << 20  # a real commit is KBs (layer statistics: ~100 bytes a layer)
MAX_MANIFEST_BYTES = 32 << 20
"""A manifest holds ~300 bytes per tensor (its entry and its place in the tree). The
largest open checkpoints by tensor count are MoE models: DeepSeek-V3's (61 layers, 256
experts, FP8 weights each with a scale tensor) is 90,427 tensors, a 26.1 MiB manifest; 32
MiB holds ~110,000 such tensors (~100,000 within `MAX_PARSE_BYTES`). A fetch takes ~7
times a manifest's size to read it (a Python object per JSON value), so the cap is what
keeps a forged one to ~256 MB (under the old 256 MiB cap, one cost 2.3 GB);
`MAX_PARSE_BYTES` bounds the shapes of JSON that cost more per byte."""
MAX_PARSE_BYTES = 240 << 20
"""What reading one commit or manifest from a remote may take - its bytes as downloaded,
and parsing them - as `parse_cost` bounds it from the text before anything is parsed: a
forged one costs at most this (~250 MB). Real manifests take ~6 bytes per byte of text
(DeepSeek-V3's: 154 MiB; 213 MiB by that bound, so ~100,000 such tensors pass); forged
ones of tiny values (`[{"a":0},...]`, `[[[[0]]]]`, astral characters that widen every
string) up to 36, and are refused unless small."""


PARSE_OVERHEAD = 64 << 10  # what parsing even an empty manifest takes (objects, buffers)


def parse_cost(raw: bytes) -> int:
    """An upper bound of the memory that reading the object `raw` (header + payload)
    takes, from its text: `raw` itself, a fixed overhead, the decoded text and its
    strings (1 byte a character where the text is ASCII without \\u escapes, else up to 4;
    with escapes, the pieces a string is built from too), plus per token what the
    costliest JSON made of it builds, as traced (a dict of 1-5 keys, or a manifest entry's
    checked TensorEntry, per "{"; a list of up to 4 items per "["; a number and its slot
    per ","; a string's header per quote; each also a slot in the depth check's walk). A
    real manifest comes out ~1.4 times what it takes, forged ones 1-4 times."""
    n = len(raw) - HEADER_SIZE
    ascii_ = raw.isascii()
    text = n if ascii_ else 4 * n
    strings = n if ascii_ and raw.find(b"\\u", HEADER_SIZE) < 0 else 4 * n
    if raw.find(b"\\", HEADER_SIZE) >= 0:  # a string with escapes is built from pieces
        strings += text
    return len(raw) + PARSE_OVERHEAD + text + strings + \
        208 * raw.count(b"{", HEADER_SIZE) + 112 * raw.count(b"[", HEADER_SIZE) + \
        64 * raw.count(b",", HEADER_SIZE) + 24 * raw.count(b'"', HEADER_SIZE)


def parse_remote(oid: ObjectId, raw: bytes, kind: str, where: str) -> Commit | Manifest:
    """A commit or manifest downloaded (and hash-verified) from `where`, parsed within
    `MAX_PARSE_BYTES`: one whose text would take more is refused before it is parsed
    (CorruptObjectError). The payload is decoded straight from `raw` (no copy first)."""
    cost = parse_cost(raw)
    if cost > MAX_PARSE_BYTES:
        raise CorruptObjectError(
            f"reading it would take up to {cost >> 20} MiB of memory, over the "
            f"{MAX_PARSE_BYTES >> 20} MiB a {kind} may take (too many tiny values for its "
            "size)")
    try:
        text = str(memoryview(raw)[HEADER_SIZE:], "utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise CorruptObjectError(f"{kind} is not valid JSON") from None
    return Commit.from_bytes(text) if kind == "commit" else Manifest.from_bytes(text)


@writes  # (a gc waits for it: what it found stored stays until its refs moved)
def fetch(repo: Repo, store: RemoteStore, remote_name: str, *, metadata_only: bool = False,
          jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
          tags: bool = True) -> TransferResult:
    """Download the remote's refs into refs/remotes/<name>/ and the objects we lack.

    Objects already here are not trusted to be complete: the whole history behind the
    remote's refs is walked, and any missing parent, manifest or tensor (e.g. deleted by
    an interrupted `gc`) is fetched too; tensors are skipped only where that is explicit
    (a metadata-only fetch or clone, or a snapshot pruned here). Every remote ref must
    name a commit.
    """
    progress = progress or NoProgress()
    result = TransferResult()
    remote_refs = store.list_refs()
    if not remote_refs:
        require_remote(store, doing="fetch from")
    lazy = metadata_only or repo.config.flag("core", "partial")
    reader = _reader(repo, store, jobs)  # lists the packs at the first object it needs
    commits, new_commits = _walk_history(repo, reader, remote_refs, jobs)
    manifests, new_manifests = _complete_manifests(repo, reader, commits, jobs)
    if not lazy:
        pruned = repo.pruned()
        wanted: dict[ObjectId, int] = {}
        for oid, commit in commits.items():
            if oid in pruned:
                continue
            for tid, nbytes in manifests[commit.manifest].items():
                if tid not in wanted and not repo.objects.has(tid):
                    wanted[tid] = nbytes
        fetch_objects(repo, store, list(wanted), jobs=jobs, progress=progress,
                      sizes={o: n + HEADER_SIZE for o, n in wanted.items()}, result=result,
                      expect={o: ("tensor", n) for o, n in wanted.items()}, reader=reader)
    with repo.objects.batch():  # one pack: every manifest and commit appear at once
        for m, raw in new_manifests.items():
            _store_raw(repo, m, raw)
            result.objects["manifest"] += 1
            result.bytes += len(raw)
        for c in _topo_order(new_commits, lambda o: commits[o].parents):
            _store_raw(repo, c, new_commits[c])
            result.objects["commit"] += 1
            result.bytes += len(new_commits[c])
    repo.objects.sync()  # objects durable before refs point at them
    for ref, oid in remote_refs.items():
        if ref.startswith("refs/heads/"):
            name = f"refs/remotes/{remote_name}/{ref[len('refs/heads/'):]}"
            old = repo.refs.read(name)
            if old != oid:
                repo.refs.update(name, oid, reason=f"fetch: {remote_name}")
                result.updates.append(RefUpdate(name, old, oid, "new" if old is None else
                                                "fast-forward" if is_ancestor(repo, old, oid)
                                                else "forced"))
        elif ref.startswith("refs/tags/") and tags and repo.refs.read(ref) is None:
            repo.refs.update(ref, oid, expected=None, reason=f"fetch: {remote_name}")
            result.updates.append(RefUpdate(ref, None, oid, "new"))
    return result


class Links(NamedTuple):
    """What a fetch keeps of a commit: its parents and manifest (the rest of a parsed
    commit - hyperparameters, metrics, layer statistics - is dropped at once)."""

    parents: tuple[ObjectId, ...]
    manifest: ObjectId


def _walk_history(repo: Repo, reader: PackReader, remote_refs: dict[str, ObjectId],
                  jobs: int) -> tuple[dict[ObjectId, Links], dict[ObjectId, bytes]]:
    """Every commit behind the remote's refs, parsed, wave by wave: local ones read here
    (their parents are checked too, never assumed), missing ones downloaded and verified
    (a small pack holding one is read whole, so its other commits cost nothing more).
    Returns (the links of all commits, raw bytes of the downloaded ones)."""
    where = redact(reader.store.url)
    commits: dict[ObjectId, Links] = {}
    new: dict[ObjectId, bytes] = {}
    named_by = {oid: f"remote ref {short_ref(ref)}" for ref, oid in remote_refs.items()}
    wave = list(dict.fromkeys(remote_refs.values()))
    while wave:
        missing = [c for c in wave if not repo.objects.has(c)]
        raws = dict(zip(missing, _pool_map(
            lambda c: _download(reader, c, limit=MAX_COMMIT_BYTES, what="commit"), missing,
            jobs), strict=True))
        for oid in wave:
            raw = raws.pop(oid, None)
            kind = parse_header(raw)[0] if raw is not None else repo.objects.kind_and_size(oid)[0]
            if kind != "commit":
                raise CorruptObjectError(f"{named_by.get(oid, 'object')} {oid[:12]} on {where} "
                                         f"is a {kind}, not a commit; refusing it (nothing "
                                         "was changed)")
            try:
                commit = parse_remote(oid, raw, "commit", where) if raw is not None \
                    else repo.read_commit(oid)
            except CorruptObjectError as exc:
                raise CorruptObjectError(f"commit {oid[:12]} " + (f"from {where}" if raw is not
                                         None else "here") + f" is damaged: {exc}") from None
            commits[oid] = Links(commit.parents, commit.manifest)
            if raw is not None:
                new[oid] = raw
        nxt: dict[ObjectId, None] = {}
        for oid in wave:
            for parent in commits[oid].parents:
                if parent not in commits:
                    nxt[parent] = None
                    named_by.setdefault(parent, f"parent of {oid[:12]}")
        wave = list(nxt)
    return commits, new


def _check_tensor_kinds(repo: Repo, mid: ObjectId, entries: dict[ObjectId, int],
                        metadata: set[ObjectId], checked: set[ObjectId]) -> None:
    """Every tensor manifest `mid` names (id -> size) that is already here (or arriving as
    metadata) must be a tensor of the size the manifest says: a forged manifest may name a
    commit. `checked`: the ids seen in earlier manifests."""
    for tid, nbytes in entries.items():
        if tid in checked:
            continue
        checked.add(tid)
        if tid in metadata:
            kind, size = "commit or manifest", None
        elif repo.objects.has(tid):
            kind, size = repo.objects.kind_and_size(tid)
        else:
            continue
        if kind != "tensor" or size != nbytes:
            raise CorruptObjectError(
                f"manifest {mid[:12]} names {tid[:12]} as a {nbytes}-byte tensor, but it "
                f"is a {kind}" + (f" of {size} bytes" if size is not None else "") +
                "; refusing it")


def _complete_manifests(repo: Repo, reader: PackReader, commits: dict[ObjectId, Links],
                        jobs: int) -> tuple[dict[ObjectId, dict[ObjectId, int]],
                                            dict[ObjectId, bytes]]:
    """The data objects each commit's manifest names (id -> payload size): local manifests
    read, missing ones downloaded; each parsed (which checks every tensor entry's shape,
    dtype and size agree) and checked against what is here, one at a time, keeping only
    those ids (a parsed manifest takes ~7 times its text; never more than one is held)."""
    where = redact(reader.store.url)
    wanted = list(dict.fromkeys(c.manifest for c in commits.values()))
    missing = [m for m in wanted if not repo.objects.has(m)]
    reader.prefetch(missing, dict.fromkeys(missing, MAX_MANIFEST_BYTES))
    raws = dict(zip(missing, _pool_map(
        lambda m: _download(reader, m, "manifest", limit=MAX_MANIFEST_BYTES, what="manifest"),
        missing, jobs), strict=True))
    metadata = set(commits) | set(wanted)
    checked: set[ObjectId] = set()
    entries: dict[ObjectId, dict[ObjectId, int]] = {}
    for m in wanted:
        try:
            manifest = parse_remote(m, raws[m], "manifest", where) if m in raws \
                else repo.read_manifest(m)
        except VrlError as exc:
            raise CorruptObjectError(f"manifest {m[:12]} " + (f"from {where}" if m in raws
                                     else "here") + f" is damaged: {exc}") from None
        entries[m] = {e.id: e.nbytes for e in manifest.data_entries().values()}
        del manifest
        _check_tensor_kinds(repo, m, entries[m], metadata, checked)
    return entries, raws


FETCH_BATCH = 64 << 20  # packed bytes read ahead (and held) at a time


def fetch_objects(repo: Repo, store: RemoteStore, ids: list[ObjectId], *,
                  jobs: int = DEFAULT_JOBS, progress: Progress | None = None,
                  sizes: dict[ObjectId, int] | None = None,
                  result: TransferResult | None = None,
                  expect: dict[ObjectId, tuple[str, int]] | None = None,
                  reader: PackReader | None = None) -> None:
    """Download objects by id (verifying each before it is written; `expect` gives the
    kind and payload size a manifest promised for some of them). Packed ones are read
    a whole small pack or a few ranges at a time; a promised size caps each read."""
    progress = progress or NoProgress()
    ids = [o for o in dict.fromkeys(ids) if is_object_id(o) and not repo.objects.has(o)]
    if not ids:
        return
    reader = reader or _reader(repo, store, jobs)
    limits = {o: n + HEADER_SIZE for o, (k, n) in (expect or {}).items()
              if k == "tensor" and isinstance(n, int)}
    progress.begin(f"fetch {redact(store.url)}", sum((sizes or {}).get(o, 0) for o in ids),
                   len(ids))

    def get(oid: ObjectId) -> int:
        kind, nbytes = (expect or {}).get(oid, (None, None))
        raw = _download(reader, oid, kind, limits.get(oid),
                        "tensor" if oid in limits else "object", limit_loose=False)
        if nbytes is not None and len(raw) - HEADER_SIZE != nbytes:
            raise CorruptObjectError(f"{kind} {oid[:12]} from {redact(store.url)} has "
                                     f"{len(raw) - HEADER_SIZE} bytes but its manifest says "
                                     f"{nbytes}; nothing was written")
        _store_raw(repo, oid, raw)
        progress.advance(len(raw))
        return len(raw)

    got: list[int] = []
    try:
        with repo.objects.batch():  # the small ones land in one pack
            for chunk in _chunks(ids, reader.packs, FETCH_BATCH):
                reader.prefetch([o for o in chunk if o in limits], limits, "tensor")
                reader.prefetch([o for o in chunk if o not in limits], {})
                got += _pool_map(get, chunk, jobs)
    finally:
        progress.end()
    repo.objects.sync()
    if result is not None:
        result.objects["tensor"] += len(got)
        result.bytes += sum(got)


def _chunks(ids: list[ObjectId], packs: RemotePacks, limit: int) -> list[list[ObjectId]]:
    """`ids` in pack order, in chunks of at most about `limit` packed bytes."""
    def place(o: ObjectId) -> tuple[str, int]:
        where = packs.where(o)
        return (where[0], where[1]) if where else ("", 0)

    chunks: list[list[ObjectId]] = [[]]
    total = 0
    for o in sorted(ids, key=place):
        where = packs.where(o)
        size = where[2] if where else 0
        if chunks[-1] and total + size > limit:
            chunks.append([])
            total = 0
        chunks[-1].append(o)
        total += size
    return chunks


# ------------------------------------------------------------------------------ pull / clone


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
            # Reopen so the lazy fetcher (installed from the config) is in place.
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


def install_lazy_fetcher(repo: Repo, remote_name: str, jobs: int = DEFAULT_JOBS) -> None:
    """Make missing objects download on demand from `remote_name` (partial clones)."""

    def fetch_missing(ids: list[ObjectId],
                      expect: dict[ObjectId, tuple[str, int]] | None = None) -> None:
        from vrl.remote.config import open_named

        store = open_named(repo, remote_name)
        try:
            fetch_objects(repo, store, list(ids), jobs=jobs, expect=expect)
        finally:
            store.close()

    repo.fetch_missing = fetch_missing


def fetch_from_remotes(repo: Repo, ids: list[ObjectId],
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


def install_fetchers(repo: Repo) -> None:
    """What the remote layer gives every repository it opens: on-demand downloads from the
    promisor remote (partial clones) and fetching of pruned snapshots from remotes."""
    promisor = repo.config.get("core", "promisor")
    if promisor:
        install_lazy_fetcher(repo, promisor)
    repo.fetch_pruned = lambda ids, expect=None: fetch_from_remotes(repo, ids, expect)


register_fetchers(install_fetchers)
