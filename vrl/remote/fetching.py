"""Fetch: walking a remote's history, completing its manifests, downloading the objects
a repository lacks (through a PackReader), storing them, and the tracking refs; with
the caps on what a fetch reads of a remote's metadata (and so on what a push sends)."""

from __future__ import annotations

from typing import NamedTuple

from vrl.errors import CorruptObjectError, VrlError
from vrl.gclock import writes
from vrl.objects import HEADER_SIZE, Commit, Manifest, ObjectId, is_object_id, parse_header
from vrl.refs import short_ref
from vrl.remote.base import (
    RemoteStore,
    redact,
    require_remote,
)
from vrl.remote.common import (
    DEFAULT_JOBS,
    NoProgress,
    Progress,
    RefUpdate,
    TransferResult,
    _download,
    _pool_map,
    _reader,
    _store_raw,
    _topo_order,
    is_ancestor,
)
from vrl.remote.packs import PackReader, RemotePacks
from vrl.repo import Repo

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

