"""The commit engine: what every commit of a training loop runs - its tensors hashed and
stored, its layer statistics, its commit object written and its ref moved.

A `Repo` owns one (`repo.engine`) and is the facade users call (`repo.commit`,
`repo.snapshot`); the engine keeps what makes the next commit of the same run cheap: the
fingerprints of the tensors this process stored, the last snapshot's entries and views,
small payloads for the next statistics, and the parent the next commit may take without
reading its ref. The Snapshotter's committer process uses three more calls: `lending`
(payloads it keeps in memory for the next statistics), `last_digests` (the fingerprints
of what a snapshot read) and `recent_payload`.

Durability (docs/durability.md states the protocol and its invariants) is the object
store's, the ref store's and the journal's; this module orders their steps.
"""

from __future__ import annotations

import contextlib
import time as _time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from vrl.diff import compare
from vrl.errors import (
    MetadataError,
    ObjectNotFoundError,
    RefConflictError,
    VrlError,
    WorkspaceError,
)
from vrl.objects import (
    Commit,
    FileLayout,
    Manifest,
    ObjectId,
    TensorEntry,
    _stats_json,
    check_depth,
    hash_object,
)
from vrl.pack_set import PACK_MAX
from vrl.refs import short_ref, utc_now
from vrl.safetensors_file import RawTensor, SafetensorsFile
from vrl.tensors import ViewMemo, flatten, tensor_bytes, to_state
from vrl.workspace import canonical_header

if TYPE_CHECKING:
    from vrl.object_store import FileObjectStore
    from vrl.refs import RefStore

MMAP_MIN = 1 << 16  # smaller tensors are read, bigger ones memory-mapped
KNOWN_MAX = 1 << 16  # content pre-check entries kept for the next commit
RECENT_MAX = 4096  # small payloads kept in memory for the next commit's statistics,
RECENT_BYTES = 32 << 20  # at most this many bytes of them (objects below PACK_MAX),
RECENT_COMMIT_BYTES = RECENT_BYTES // 2  # and half of that from one commit: the parent's
# payloads must survive the child's, whose statistics read them
COMMIT_BACKOFF_MAX = 0.2  # seconds: the longest pause between two commit attempts


class FlatState(NamedTuple):
    """A checkpoint already split by `vrl.tensors.flatten`: {name: tensor, array, RawTensor
    or stored TensorEntry}, the JSON skeleton and {name: tied-to}."""
    tensors: dict[str, Any]
    tree: Any
    ties: dict[str, str]


class CommitEngine:
    """The commit path of one repository object (see the module docstring).

    `repo` provides what a commit reads and the locks it takes: `objects`, `refs`,
    `journal`, `read_commit`, `read_manifest`, `read_tensor`, `threshold`, `workdir`,
    `author`, `gc_lock`, `maintaining`. `commits` and `manifests` are its caches of parsed
    metadata, which a commit fills with what it writes. `journaled`: commit through the
    journal (vrl/journal.py) rather than by three rounds of fsyncs."""

    def __init__(self, repo: Any, commits: dict[ObjectId, Commit],
                 manifests: dict[ObjectId, Manifest], journaled: bool) -> None:
        self.repo = repo
        self.objects: FileObjectStore = repo.objects
        self.refs: RefStore = repo.refs
        self.journaled = journaled
        self._commits, self._manifests = commits, manifests
        # Tensors stored by this process: (xxh3-128 of the bytes, size) -> object id. Lets
        # an incremental commit skip the blake3 hash (and write) of unchanged tensors while
        # still reading every byte, so no write can be missed.
        self._known: OrderedDict[tuple[bytes, int], ObjectId] = OrderedDict()
        self._recent: OrderedDict[ObjectId, bytes | memoryview] = OrderedDict()
        self._recent_bytes = 0
        # name -> xxh3-128 of the bytes of each tensor the last snapshot read (the
        # Snapshotter's committer hands them back, so the next change check hashes the
        # live tensor instead of byte-comparing it with a held copy)
        self.last_digests: dict[str, bytes] = {}
        # name -> (xxh3-128 of its bytes, the entry) of the last snapshot stored: a tensor
        # with those bytes again gets that same entry object (no lookup by content), whose
        # manifest text (vrl.objects) is then already written
        self._stored: dict[str, tuple[bytes, TensorEntry]] = {}
        # where the tensors of the last snapshot were (vrl.tensors.ViewMemo): the next one
        # finds the same tensors' bytes with a few attribute reads each, and reads them all
        self._views = ViewMemo()
        # (ref, id) of this object's last commit, and whether the next commit on that ref
        # may take it as its parent without reading the ref (see commit)
        self._last: tuple[str, ObjectId] | None = None
        self._trusted = False
        # id -> the bytes a commit in progress just hashed: its layer statistics read the
        # new tensors from memory (their files may still be in flight) instead of mapping
        # them back from the store
        self._fresh: dict[ObjectId, memoryview] = {}
        # id -> a payload a caller keeps in memory and lends for read-only use (`lending`)
        self._lent: dict[ObjectId, memoryview] = {}

    # ------------------------------------------------------------------ the interface
    @contextlib.contextmanager
    def lending(self, payloads: dict[ObjectId, memoryview]) -> Iterator[None]:
        """Let the commits made meanwhile read these payloads (each exactly its object's)
        for their statistics instead of the store: the Snapshotter's committer lends the
        last snapshot's big tensors, so its next statistics read no object back from the
        disk."""
        self._lent = payloads
        try:
            yield
        finally:
            self._lent = {}

    def held_payload(self, oid: ObjectId, read_only: bool) -> memoryview | None:
        """The payload of `oid` if a commit in progress just hashed it, or (`read_only`
        use) a caller lends it; else None."""
        fresh = self._fresh.get(oid)
        if fresh is None and read_only:
            fresh = self._lent.get(oid)
        return fresh

    def recent_payload(self, oid: ObjectId) -> bytes | memoryview | None:
        """A small payload a recent commit of this object stored, kept in memory."""
        return self._recent.get(oid)

    def forget_parent(self) -> None:
        """A ref moved outside this engine: the next commit reads its parent from its ref
        instead of taking this object's last commit."""
        self._trusted = False

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, state: Any, *, write: bool = True
                 ) -> tuple[ObjectId, Manifest, set[ObjectId]]:
        """Store every tensor of `state` and its manifest (`Repo.snapshot`); return (id,
        manifest, ids newly written). With write=False nothing is stored."""
        views = None
        if isinstance(state, FlatState):
            tensors, tree, ties = state
        else:
            tensors, tree, ties = flatten(to_state(state), self._views)
            views = self._views.now
        opened = self.objects.begin_batch()  # (within a commit's batch: None)
        ok = False
        try:
            entries, new_ids = self._store_tensors(tensors, ties, write, views)
            layout = self._file_layout(state, tensors, entries, tree, write, new_ids) \
                if isinstance(state, SafetensorsFile) else None
            manifest = Manifest(entries, tree, layout)
            memo, tree_text = self._views, None
            if memo.tree is not None and tree is memo.tree:  # its skeleton again: the text
                tree_text = memo.tree_text  # of the first manifest that held it
                if tree_text is None:
                    tree_text = memo.tree_text = manifest.tree_json()
            payload = manifest.to_bytes(tree_text)
            mid = hash_object("manifest", payload)
            if write:
                if self.objects.put("manifest", payload, mid):
                    new_ids.add(mid)
                self._manifests[mid] = manifest
            ok = True
        finally:
            self.objects.end_batch(opened, ok)
        return mid, manifest, new_ids

    def _file_layout(self, source: SafetensorsFile, tensors: dict[str, Any],
                     entries: dict[str, TensorEntry], tree: Any, write: bool,
                     new_ids: set[ObjectId]) -> FileLayout | None:
        """The header to keep so that `source` can be written back byte for byte, or None
        where the canonical writer reproduces the file anyway (a file vrl wrote) or where
        the file's names do not match the snapshot's (hand-edited vrl metadata; such a
        file is written back in the canonical layout)."""
        stored = {n for n, e in entries.items() if e.tie is None}
        if stored != set(source.tensors):
            return None
        for name, raw in source.tensors.items():
            entry = entries[name]
            if entry.nbytes != raw.nbytes or (tensors[name] is not raw and
                                              entry.id != hash_object("tensor", raw.data)):
                return None
        head = bytes(source.header_bytes)
        try:
            if canonical_header(tree, entries)[0] == head:
                return None
        except VrlError:
            pass  # a dtype the canonical writer cannot write: keep the header
        hid = hash_object("tensor", head)
        if write and not self.objects.touch(hid):
            self.objects.write("tensor", head, hid)
            new_ids.add(hid)
        return FileLayout("safetensors", TensorEntry(hid, "uint8", (len(head),), len(head)))

    def _store_tensors(self, tensors: dict[str, Any], ties: dict[str, str], write: bool,
                       views: dict[str, Any] | None = None
                       ) -> tuple[dict[str, TensorEntry], set[ObjectId]]:
        """Hash and store each tensor. Exact: every byte is read on every commit; a fast
        xxh3-128 of the bytes recognises content this process stored before, which then
        needs neither the blake3 hash nor a write. A `TensorEntry` value is an object the
        caller knows is stored (the Snapshotter's committer, for unchanged tensors).
        `views`: `ViewMemo.now` of the flatten that made `tensors` (their bytes' views)."""
        views = views or {}
        entries: dict[str, TensorEntry] = {}
        new_ids: set[ObjectId] = set()
        digests: dict[str, bytes] = {}
        self.last_digests = digests
        known, objects, fingerprint = self._known, self.objects, _xxh3_128()
        last, made = self._stored, {}
        fresh = self._fresh
        remember = RECENT_COMMIT_BYTES  # bytes this commit may still keep in _recent
        for name, value in tensors.items():
            if name in ties:
                target = entries[ties[name]]
                entries[name] = TensorEntry(target.id, target.dtype, target.shape,
                                            target.nbytes, tie=ties[name])
                continue
            if isinstance(value, TensorEntry):
                # touch(): a reused object must look young, or a concurrent gc may delete
                # it (it can be unreachable and old) before our ref points at it
                if write and not objects.touch(value.id):
                    raise ObjectNotFoundError(f"tensor {name!r} ({value.id[:12]}) vanished "
                                              "from the store (a concurrent gc?); the next "
                                              "snapshot sends it again")
                entries[name] = value
                continue
            viewed = views.get(name)
            if viewed is not None and viewed.tensor is value:  # (flatten vouched for it)
                buf, dtype, shape = viewed.view, viewed.dtype, viewed.shape
            elif isinstance(value, RawTensor):
                buf, dtype, shape = value.data, value.dtype, value.shape
            else:
                buf, dtype, shape, _keep = tensor_bytes(value)
            nbytes = buf.nbytes
            # a fast non-cryptographic fingerprint of the bytes (the object id stays blake3)
            digest = fingerprint(buf)
            digests[name] = digest
            before = last.get(name)
            entry = before[1] if before is not None else None
            # the bytes this name had in the last snapshot (most tensors of a training run's
            # commit): that entry again, as the pre-check by content would find it
            again = entry is not None and before[0] == digest and entry.nbytes == nbytes \
                and entry.shape == shape and entry.dtype == dtype and \
                (not write or objects.touch(entry.id))
            if again:
                oid = entry.id
            else:
                key = (digest, nbytes)
                oid = known.get(key)
                if oid is None or (write and not objects.touch(oid)):
                    oid = hash_object("tensor", buf, threads=nbytes > (1 << 22) and
                                      objects.parallel_hashing)
                    if write and objects.put("tensor", buf, oid):
                        new_ids.add(oid)
                if write:
                    known[key] = oid
                    known.move_to_end(key)
                    if len(known) > KNOWN_MAX:
                        known.popitem(last=False)
            if write:
                if nbytes >= MMAP_MIN:
                    fresh[oid] = buf
                if nbytes < PACK_MAX and nbytes <= remember:
                    remember -= nbytes
                    self._remember(oid, buf)
            if not again and (entry is None or entry.id != oid or entry.shape != shape or
                              entry.nbytes != nbytes or entry.dtype != dtype):
                # (shapes are tuples of ints, dtypes strs, ids and sizes exact: equal
                # values are the same values, whose text is the same)
                entry = TensorEntry(oid, dtype, shape, nbytes)
            if write and type(dtype) is str:
                made[name] = (digest, entry)
            entries[name] = entry
        if write:
            self._stored = made
        return entries, new_ids

    def commit(self, state: Any, optimizer: Any = None, *, message: str = "",
               hparams: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
               step: int | None = None, env: bool | dict[str, Any] = True,
               meta: dict[str, Any] | None = None, allow_empty: bool = False,
               threshold: float | None = None, ref: str = "HEAD", author: str | None = None,
               time: str | None = None) -> ObjectId:
        """`Repo.commit`: snapshot `state` (plus optimizer) as a new commit on `ref`, moved
        by compare-and-swap; a lost swap re-parents this commit onto the winner's."""
        # metadata problems are found before anything is written
        if not isinstance(message, str):
            raise MetadataError(f"commit message must be a string, not "
                                f"{type(message).__name__}")
        for name, value in (("hparams", hparams), ("metrics", metrics), ("meta", meta)):
            if value is not None:
                if not isinstance(value, dict):
                    raise MetadataError(f"{name} must be a dict of names to values, not "
                                        f"{type(value).__name__}")
                check_depth(value, name)
        if optimizer is not None:
            state = {"model": to_state(state), "optimizer": to_state(optimizer)}
        # Durability (docs/durability.md states the protocol and its invariants):
        # 1. big tensors: loose files, fsynced, renamed, their directories fsynced - before
        #    anything that names them can appear;
        # 2-4. with the commit journal (`self.journaled`, the default on Linux) the batch
        #    is sealed, and the journal appends its pack, the ref's move and the reflog
        #    lines as one record and fdatasyncs it: the commit point (vrl/journal.py).
        #    Without it, three rounds: 2. the small objects' pack, written and fsynced on a
        #    worker thread while this one locks the ref and writes its temp file and reflog
        #    lines; 3. the pack directory, the ref's temp file and the lines fsynced
        #    together (`durable_first`); 4. the ref's rename and its directory.
        unsynced: set[str] = set()  # directories of step 2 (and of retries) not yet synced
        # (the batch is opened and closed by hand, not by context managers: every commit of
        # a training loop pays for what runs here)
        opened = [self.objects.begin_batch(defer=True, seal=self.journaled)]

        def end_batch(ok: bool = True) -> None:
            """Close the commit's batch (once; later calls do nothing)."""
            token, opened[0] = opened[0], None
            try:
                self.objects.end_batch(token, ok)
            finally:
                self._fresh.clear()

        ok = False
        try:
            mid, manifest, new_ids = self.snapshot(state)
            threshold = self.repo.threshold if threshold is None else threshold

            def layer_stats(parent: ObjectId | None) -> tuple[dict[str, Any], str | None]:
                """The statistics against `parent`, and their text in the commit."""
                parent_manifest = self.repo.read_manifest(self.repo.read_commit(parent).manifest) \
                    if parent else None
                result = compare(parent_manifest, manifest, self.repo.read_tensor,
                                 known_objects=lambda oid: oid not in new_ids,
                                 threshold=threshold)
                stats = result.to_json()
                stats["parent"] = parent
                return stats, _stats_json(stats, result.layer_texts())

            # the statistics against the expected parent are computed from memory while
            # the big tensors' writes and fsyncs are still in flight. The parent is this
            # object's own last commit on `ref` while nothing else was seen to move it
            # (a training loop's commits), else read: the compare-and-swap decides either
            # way, and a stale guess costs one more round (see _commit_loop)
            guessed = self.journaled and self._trusted and self._last is not None and \
                self._last[0] == ref
            expected = self._last[1] if guessed else self.refs.read(ref)  # type: ignore
            try:
                early = layer_stats(expected)
            except VrlError:
                if not guessed:
                    raise
                # the guess is stale (its tensors collected meanwhile): read the parent
                guessed = self._trusted = False
                expected = self.refs.read(ref)
                early = layer_stats(expected)
            env_info = env if isinstance(env, dict) else \
                (_capture_env(self.repo.workdir) if env else {})
            self.objects.sync()  # the big tensors (the staged pack is not written yet)
            self._fresh.clear()  # their buffers were only lent for the statistics

            def objects_ready() -> list[str]:  # waits for step 2
                unsynced.update(self.objects.take_unsynced_dirs())
                return sorted(unsynced)

            try:
                cid = self._commit_loop(ref, mid, manifest, allow_empty, layer_stats,
                                        (expected, early, guessed), end_batch, objects_ready,
                                        message=message, author=author, time=time,
                                        hparams=hparams, metrics=metrics,
                                        env_info=env_info, step=step, meta=meta)
                ok = True
                return cid
            finally:
                with contextlib.suppress(VrlError):  # a failure is reported by the loop
                    self.objects.flush()  # a pack still in flight when the loop gave up
                self.objects.drop_sealed()  # a journaled commit that failed: forgotten
        finally:
            end_batch(ok)

    def _unchanged(self, parent: ObjectId, mid: ObjectId, manifest: Manifest) -> bool:
        """Whether `manifest` holds what `parent` holds: the same manifest, or the same
        tensors from another container (a `.pt` of the weights a `.safetensors` held).
        The parent's manifest is cached by now: the statistics read it."""
        parent_mid = self.repo.read_commit(parent).manifest
        return parent_mid == mid or self.repo.read_manifest(parent_mid).same_content(manifest)

    def _commit_loop(self, ref: str, mid: ObjectId, manifest: Manifest, allow_empty: bool,
                     layer_stats: Callable[[ObjectId | None],
                                           tuple[dict[str, Any], str | None]],
                     early: tuple[ObjectId | None, tuple[dict[str, Any], str | None], bool],
                     end_batch: Callable[[], None], objects_ready: Callable[[], list[str]],
                     **fields: Any) -> ObjectId:
        """Write the commit object and move the ref, re-parenting after a lost
        compare-and-swap (see `commit`). `early`: the statistics already computed against
        the parent expected then, and whether that parent was guessed (this object's last
        commit) rather than read; another parent gets `layer_stats(parent)`."""
        message = fields["message"]
        attempt = 0
        first, guessed = True, early[2]
        stale = None  # the commit object made on a stale guess (taken out of the pack)
        while True:
            # the parent the statistics were computed against, read (or guessed) moments
            # ago: re-read only after a lost compare-and-swap (the swap itself checks it,
            # under the lock)
            parent = early[0] if first else self.refs.read(ref)
            first = False
            if parent and not allow_empty and self._unchanged(parent, mid, manifest):
                if guessed and self.refs.read(ref) != parent:
                    guessed = self._trusted = False  # moved meanwhile: commit onto it
                    continue
                raise WorkspaceError(f"nothing changed since {short_ref(ref)} "
                                     f"({parent[:12]}); use --allow-empty to commit "
                                     "anyway")
            stats, stats_text = early[1] if parent == early[0] else layer_stats(parent)
            commit = Commit(manifest=mid, parents=(parent,) if parent else (),
                            message=message, author=fields["author"] or self.repo.author,
                            time=fields["time"] or utc_now(),
                            hparams=fields["hparams"] or {},
                            metrics=fields["metrics"] or {}, env=fields["env_info"],
                            step=fields["step"], stats=stats, meta=fields["meta"] or {})
            payload = commit.to_bytes(stats_text)
            cid = (stale and self.objects.reseal(stale, "commit", payload)) or \
                self.objects.write("commit", payload)
            self._commits[cid] = commit
            end_batch()  # starts the pack's write (first attempt only; later a no-op)
            reason = f"commit: {message.splitlines()[0] if message else ''}"
            try:
                if self.journaled:  # one append + fdatasync (vrl/journal.py)
                    self.repo.journal.commit(ref, cid, parent, reason, self.objects.sync,
                                        self.repo.gc_lock.release_early)  # (vrl/gclock.py)
                else:
                    self.refs.update(ref, cid, expected=parent, reason=reason,
                                     durable_first=objects_ready)
            except RefConflictError:
                if guessed:  # the guessed parent was stale: read it, and retry at once
                    guessed = self._trusted = False
                    stale = cid
                    continue
                # Lost the compare-and-swap: another commit landed on the ref, which
                # is progress, so re-parent onto it and try again (as long as others
                # make progress, someone wins every round; the jittered backoff
                # spreads the losers out so no one is starved). A conflict without
                # any move of the ref (a lock held for a long time, a name clash) is
                # not ours to retry.
                if self.refs.read(ref) == parent:
                    raise
                attempt += 1
                _backoff(attempt)
                continue
            # the next commit on `ref` guesses its parent (this one) if nothing else moved
            # the ref since this object's last commit: a guess that held, or a parent read
            # that was that commit
            self._trusted = guessed or self._last == (ref, parent)
            self._last = (ref, cid)
            try:  # every AUTO_MERGE commits: their packs become one (reads stay fast)
                if self.objects.merge_due():
                    with self.repo.maintaining() as checkpoint:
                        self.objects.consolidate(checkpoint)
            except VrlError:
                pass  # the commit is done; the next one tries again
            return cid


    def _remember(self, oid: ObjectId, payload: memoryview) -> None:
        """Keep small payloads just committed: the next commit's layer statistics read them
        back (a read from a pack each otherwise, a main cost of snapshotting a small
        policy). Copied once: an unchanged tensor's payload is kept as it is."""
        recent = self._recent
        if oid in recent:
            recent.move_to_end(oid)
            return
        # staged for the batch's pack: a view of those (immutable) bytes, no second copy
        kept = self.objects.staged_payload(oid)
        recent[oid] = bytes(payload) if kept is None or kept.nbytes != payload.nbytes \
            else kept
        self._recent_bytes += payload.nbytes
        while len(recent) > RECENT_MAX or self._recent_bytes > RECENT_BYTES:
            self._recent_bytes -= memoryview(recent.popitem(last=False)[1]).nbytes


def _capture_env(workdir: Path) -> dict[str, Any]:
    from vrl import envinfo  # (its imports are not needed before a commit captures one)

    return envinfo.capture(workdir)


def _xxh3_128() -> Callable[[Any], bytes]:
    """xxhash's xxh3-128 digest function (imported on first use: metadata commands skip it)."""
    import xxhash

    return xxhash.xxh3_128_digest


def _backoff(attempt: int) -> None:
    """Sleep a random time up to an exponentially growing, capped bound ("full jitter")."""
    import random

    _time.sleep(random.uniform(0, min(COMMIT_BACKOFF_MAX, 0.002 * 2 ** min(attempt, 16))))
