"""Repository maintenance: retention (prune), reachability, gc, repack and fsck.

A mixin of `vrl.Repo`: what it needs from the repository is declared on the class, so
it never imports Repo (not even for annotations).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.durable import discard
from vrl.errors import ObjectNotFoundError, PrunedError, VrlError
from vrl.gclock import GcLock
from vrl.objects import HEADER_SIZE, Commit, Manifest, ObjectId, TensorEntry, is_object_id
from vrl.refs import ANY, ReflogEntry, interrupted, short_ref

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from vrl.config import Config
    from vrl.journal import Journal
    from vrl.object_store import FileObjectStore
    from vrl.refs import RefStore


@dataclass(frozen=True)
class Problem:
    """One finding of `fsck`."""

    kind: str  # object | ref | reflog | connectivity | manifest
    where: str  # an object id, or a path under .vrl
    message: str


@dataclass
class FsckState:
    """What the checks of one `fsck` run share; each check adds what it finds."""

    lazy: bool
    pruned: set[ObjectId]
    progress: Callable[[int, int], None] | None = None
    kinds: dict[ObjectId, str] = field(default_factory=dict)  # objects that verified
    sizes: dict[ObjectId, int] = field(default_factory=dict)
    referenced: set[ObjectId] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    count: int = 0

    def add(self, kind: str, where: str, message: str) -> None:
        self.problems.append(Problem(kind, where, message))

    def has_commit(self, oid: ObjectId) -> bool:
        return self.kinds.get(oid) == "commit"


def _entry_problem(manifest: Manifest, name: str, entry: TensorEntry) -> str | None:
    """What is inconsistent about one manifest entry (None if nothing)."""
    if not isinstance(entry.id, str) or not is_object_id(entry.id):
        return f"names {str(entry.id)[:20]!r}, not an object id"
    if entry.tie is not None:
        target = manifest.tensors.get(entry.tie)
        if target is None or target.id != entry.id:
            return f"is tied to {str(entry.tie)[:40]!r}, which " + \
                ("is not in the manifest" if target is None else "holds other data")
    return None


class GcBlockedError(VrlError):
    """gc cannot tell what a damaged ref or reflog protects, so it deletes nothing."""


class Maintenance:
    """prune, reachable, gc, fsck (mixed into Repo)."""

    # what Repo provides
    vrl_dir: Path
    objects: FileObjectStore
    refs: RefStore
    journal: Journal | None
    config: Config
    lazy: bool
    read_commit: Callable[[ObjectId], Commit]
    read_manifest: Callable[[ObjectId], Manifest]
    head: Callable[[], ObjectId | None]
    resolve: Callable[[str], ObjectId]
    tags: Callable[[], dict[str, ObjectId]]
    maintaining: Callable[[], AbstractContextManager[Callable[[], None]]]

    # ------------------------------------------------------------------ retention
    def _pruned_path(self) -> Path:
        return self.vrl_dir / "pruned"

    def pruned(self) -> set[ObjectId]:
        """Commits whose tensor data retention released (gc then frees it)."""
        try:
            text = self._pruned_path().read_text()
        except FileNotFoundError:
            return set()
        return {ObjectId(line) for line in text.split() if is_object_id(line)}

    def _write_pruned(self, pruned: set[ObjectId]) -> None:
        """Rewrite the pruned list (the caller holds the `refs/pruned` lock)."""
        lines = sorted(pruned)
        self.objects.write_raw(self._pruned_path(),
                               ["\n".join(lines).encode() + b"\n" if lines else b""],
                               "the pruned list")
        # durable before gc may delete what it releases (a power cut must not keep the
        # deletions and lose the list)
        self.objects.sync()

    def first_parent_chain(self, oid: ObjectId | None) -> list[ObjectId]:
        chain = []
        while oid is not None:
            chain.append(oid)
            try:
                parents = self.read_commit(oid).parents
            except ObjectNotFoundError:
                break
            oid = parents[0] if parents else None
        return chain

    def prune(self, keep_last: int = 10, refs: list[str] | None = None,
              keep: tuple[str, ...] = (), dry_run: bool = False) -> list[ObjectId]:
        """Release the tensor data of old snapshots; return the commits newly pruned.

        Kept: the last `keep_last` commits of every branch, every tagged commit (the best
        snapshot is a tag), every branch head and HEAD, and the revisions in `keep`. Only
        the first-parent history of `refs` (default: every branch) is pruned. Commits,
        manifests, metrics and layer statistics stay; tensors reachable from any kept
        snapshot are never released. `gc` frees the space.
        """
        if keep_last < 1:
            raise VrlError("keep_last must be at least 1")
        # under the lock a tag or branch takes to un-prune, so none is created unseen
        with self.refs.lock("refs/pruned"):
            branches = self.refs.list("refs/heads/")
            kept: set[ObjectId] = set(branches.values()) | set(self.tags().values())
            head = self.head()
            if head:
                kept.add(head)
            kept.update(self.resolve(k) for k in keep)
            for tip in branches.values():
                kept.update(self.first_parent_chain(tip)[:keep_last])
            targets = [self.refs.read(r) for r in refs] if refs else list(branches.values())
            already = self.pruned()
            newly: list[ObjectId] = []
            for tip in targets:
                for oid in self.first_parent_chain(tip):
                    if oid not in kept and oid not in already and oid not in newly:
                        newly.append(oid)
            if newly and not dry_run:
                self._write_pruned(already | set(newly))
        return newly

    def ensure_restorable(self, oid: ObjectId, action: str, keep: bool = False) -> None:
        """Before a ref moves to `oid`: a ref keeps what it points to.

        A pruned snapshot whose tensors are all still here is fine (with `keep`, it is
        un-pruned, so gc keeps its tensors, and they are freshened against a concurrent
        gc); one whose tensors gc has freed is refused (a lazy clone fetches on demand).
        """
        if oid not in self.pruned():
            return
        manifest = self.read_manifest(self.read_commit(oid).manifest)
        ids = {e.id for e in manifest.data_entries().values()}
        missing = [i for i in ids if not self.objects.has(i)]
        if missing and not self.lazy:
            raise PrunedError(
                f"cannot {action} {oid[:12]}: it was pruned by retention and `vrl gc` has "
                "freed its tensors, so it could not be restored from here; restore it from "
                "a remote that has it (`vrl checkout` fetches it) or pick a kept snapshot")
        if keep:
            with self.refs.lock("refs/pruned"):
                for i in ids:
                    self.objects.touch(i)
                current = self.pruned()
                if oid in current:
                    self._write_pruned(current - {oid})

    # ------------------------------------------------------------------ gc
    def _never_moved(self, name: str, entries: list[ReflogEntry]) -> set[ObjectId]:
        """Missing commits named only as the target of reflog lines whose move never
        happened (a power cut between the line and the ref's rename; refs.interrupted)."""
        try:
            value: object = self.head() if name == "HEAD" else self.refs.read(name)
        except VrlError:
            value = ANY  # a damaged ref: nothing is known to be interrupted
        out = {e.new for e in interrupted(entries, value) if e.new and
               not self.objects.has(e.new)}
        if out:  # still named by an applied entry: that one counts (it is damage)
            out -= {x for e in entries if e.new not in out for x in (e.old, e.new)}
        return out  # type: ignore[return-value]

    def _reflog_roots(self, strict: bool) -> set[ObjectId]:
        """Every id a reflog names. With `strict`, a damaged reflog stops the caller."""
        roots: set[ObjectId] = set()
        for name in self.refs.all_logs():
            read = self.refs.read_log(name)
            if read.damaged and strict:
                raise GcBlockedError(
                    f"{read.damaged[0]}: gc cannot tell which snapshots this reflog "
                    "protects, so it deleted nothing; fix or delete that line, or forget "
                    "every reflog with `vrl gc --expire-reflog`")
            named = {x for entry in read.entries for x in (entry.old, entry.new) if x}
            named -= self._never_moved(name, read.entries)
            # a flipped hex digit still parses, but names a commit that is not here
            lost = sorted(x for x in named if not self.objects.has(x))
            if lost and strict and not self.lazy:
                raise GcBlockedError(
                    f"logs/{name} names commit {lost[0][:12]}, which is not here (the reflog "
                    "is damaged or objects were lost; `vrl fsck` checks): gc cannot tell "
                    "which snapshots it protects, so it deleted nothing")
            roots |= named
        return roots

    def reachable(self, include_reflog: bool = True, strict: bool = False
                  ) -> set[ObjectId]:
        """Every object reachable from refs, HEAD and (by default) the reflog.

        Pruned commits keep their commit and manifest objects but not their tensors
        (unless a kept snapshot reaches the same tensors). A ref keeps what it points to:
        the snapshot at a ref or HEAD keeps its tensors even if it was pruned.
        """
        tips: set[ObjectId] = set(self.refs.list().values())
        head = self.head()
        if head:
            tips.add(head)
        roots = set(tips)
        if include_reflog:
            roots |= self._reflog_roots(strict)
        return self._closure(roots, tips)

    def _closure(self, roots: set[ObjectId], tips: set[ObjectId] | None = None
                 ) -> set[ObjectId]:
        """`roots` (commits) and every object they reach; a pruned commit's tensors only
        when it is one of `tips` (a ref keeps what it points to)."""
        seen: set[ObjectId] = set()
        pruned = self.pruned() - (tips or set())
        stack = list(roots)
        while stack:
            oid = stack.pop()
            if oid in seen or not self.objects.has(oid):
                continue
            seen.add(oid)
            try:
                commit = self.read_commit(oid)
            except VrlError:
                continue
            stack.extend(commit.parents)
            if self.objects.has(commit.manifest):
                seen.add(commit.manifest)
                if oid in pruned:
                    continue
                try:
                    seen.update(e.id for e in
                                self.read_manifest(commit.manifest).data_entries().values())
                except VrlError:
                    continue
        return seen

    def _check_refs_for_gc(self, expire_reflog: bool) -> None:
        """A damaged ref's value is unknown: gc goes on only while its reflog (which names
        every value it had) is readable and kept."""
        for name, why in self.refs.damaged().items():
            if expire_reflog or not self.refs.reflog(name):
                raise GcBlockedError(f"{why}; gc cannot tell what it protects, so it deleted "
                                     "nothing")

    def _unreachable(self, keep: set[ObjectId]) -> Iterator[tuple[ObjectId, float, int]]:
        """(id, mtime, size) of every object not in `keep` (a packed one has its pack's
        mtime)."""
        for oid in list(self.objects.ids()):
            if oid in keep:
                continue
            try:
                yield oid, self.objects.mtime(oid), \
                    HEADER_SIZE + self.objects.kind_and_size(oid)[1]
            except (OSError, VrlError):
                continue

    @functools.cached_property
    def gc_lock(self) -> GcLock:
        """Held shared by writers and exclusively by gc (vrl/gclock.py)."""
        return GcLock(self.vrl_dir)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the gc lock shared: from a writer's first look at the store until its ref
        has moved. After a gc, what this object remembered as stored is looked at again."""
        with self.gc_lock.shared() as collected:
            if collected:
                self.objects.forget_stored()
            yield

    def gc(self, grace: float | None = None, dry_run: bool = False,
           expire_reflog: bool = False, on_wait: Callable[[], None] | None = None
           ) -> tuple[int, int]:
        """Delete unreachable objects older than `grace` seconds; return (count, bytes).

        Stops, deleting nothing, when a reflog or ref it relies on is damaged. Holds the
        gc lock exclusively (a dry run takes none): commits in flight finish first, and
        the ones that arrive wait for it, so no grace period, not even 0, can break a
        commit; `on_wait()` is called once if it has to wait for them.
        """
        if grace is not None and not grace >= 0:  # (NaN too)
            raise VrlError(f"gc grace must be 0 or more seconds, not {grace}")
        if dry_run:
            return self._collect(grace, dry_run, expire_reflog)
        with self.gc_lock.exclusive(on_wait):
            return self._collect(grace, dry_run, expire_reflog)

    def _collect(self, grace: float | None, dry_run: bool, expire_reflog: bool
                 ) -> tuple[int, int]:
        """gc's mark and sweep."""
        grace = self.config.getfloat("gc", "grace") if grace is None else grace
        if self.journal is not None:  # what a crash left is finished and made durable
            self.journal.checkpoint()
        self._check_refs_for_gc(expire_reflog)
        if expire_reflog and not dry_run:
            self.refs.expire_logs()
        keep = self.reachable(strict=True)  # raises before anything is deleted
        cutoff = time.time() - grace
        # As git does: what a young unreachable commit reaches is kept with it. (A packed
        # commit is as young as its pack, which a reuse of any object in it freshens; its
        # parent, alone in an older pack, must not go first and leave it broken.)
        keep |= self._closure({o for o in self.objects.ids()
                               if o not in keep and _young_commit(self, o, cutoff)})
        # Each object's age is re-checked just before it goes: a concurrent commit freshens
        # the objects (or packs) it reuses, and its new objects are young.
        count, freed = self.objects.delete_many(
            [o for o in self.objects.ids() if o not in keep], older_than=cutoff,
            dry_run=dry_run)
        if not dry_run:
            for tmp, mtime in self.objects.temp_files():
                if mtime < cutoff:
                    discard(tmp)
            if count:  # commits collected are no longer "pruned" (nothing to restore)
                with self.refs.lock("refs/pruned"):
                    pruned = self.pruned()
                    gone = {o for o in pruned if not self.objects.has(o)}
                    if gone:
                        self._write_pruned(pruned - gone)
        return count, freed

    def gc_pending(self, grace: float | None = None) -> tuple[int, float | None]:
        """Unreachable bytes that gc keeps for now (younger than the grace period), and
        when the last of them becomes freeable (a Unix time; None if there are none)."""
        grace = self.config.getfloat("gc", "grace") if grace is None else grace
        cutoff = time.time() - grace
        size, latest = 0, None
        for _, mtime, nbytes in self._unreachable(self.reachable()):
            if mtime > cutoff:
                size += nbytes
                latest = max(latest or 0.0, mtime + grace)
        return size, latest

    def repack(self) -> tuple[int, int]:
        """Merge all packs and small loose objects into one pack; return (objects packed,
        files removed). Crash-safe: the new pack is durable before anything goes."""
        with self.maintaining() as checkpoint:
            return self.objects.repack(checkpoint)

    # ------------------------------------------------------------------ fsck
    def fsck(self, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Check everything and stop at nothing: objects (re-hashed), commits and their
        connectivity, manifests, refs and reflogs.

        Returns {"ok", "objects", "problems": [message], "errors": [{kind, where,
        message}], "warnings": [...], "dangling_commits"}; "problems" and "errors" list
        the same findings.
        """
        lazy = self.config.flag("core", "partial")
        state = FsckState(lazy=lazy, pruned=self.pruned(), progress=progress)
        # objects first: the later checks rely on what verified (state.kinds)
        for check in (self._fsck_objects, self._fsck_commits, self._fsck_refs,
                      self._fsck_reflogs):
            check(state)
        dangling = sorted(o for o, k in state.kinds.items()
                          if k == "commit" and o not in state.referenced)
        return {"objects": state.count, "problems": [p.message for p in state.problems],
                "errors": [asdict(p) for p in state.problems],
                "warnings": [asdict(p) for p in state.warnings],
                "dangling_commits": dangling, "ok": not state.problems}

    def _fsck_objects(self, state: FsckState) -> None:
        ids = list(self.objects.ids())
        state.count = len(ids)
        for i, oid in enumerate(ids):
            try:
                state.kinds[oid] = self.objects.verify(oid)
                state.sizes[oid] = self.objects.kind_and_size(oid)[1]
            except VrlError as exc:
                state.add("object", oid, f"corrupt object {oid}: {exc}")
            if state.progress:
                state.progress(i + 1, len(ids))
        for message in self.objects.check():  # packs: trailer, index, every object's bytes
            state.add("pack", "objects/pack", message)

    def _fsck_commits(self, state: FsckState) -> None:
        """Connectivity and manifests: every commit's parents and manifest, and every
        manifest's tensors, are here (or recorded as pruned, or lazy)."""
        for oid, kind in list(state.kinds.items()):
            if kind != "commit":
                continue
            try:
                commit = Commit.from_bytes(self.objects.read(oid)[1])
            except VrlError as exc:
                state.add("object", oid, f"bad commit {oid}: {exc}")
                continue
            if not all(isinstance(x, str) and is_object_id(x)
                       for x in (commit.manifest, *commit.parents)):
                state.add("object", oid, f"bad commit {oid}: a parent or manifest is not an "
                          "object id")
                continue
            for parent in commit.parents:
                state.referenced.add(parent)
                if not state.has_commit(parent) and not state.lazy:
                    state.add("connectivity", oid,
                              f"commit {oid[:12]}: parent {parent[:12]} is missing")
            state.referenced.add(commit.manifest)
            if state.kinds.get(commit.manifest) != "manifest":
                state.add("connectivity", oid,
                          f"commit {oid[:12]}: manifest {commit.manifest[:12]} is missing")
                continue
            try:
                manifest = Manifest.from_bytes(self.objects.read(commit.manifest)[1])
            except VrlError as exc:
                state.add("manifest", commit.manifest, f"bad manifest {commit.manifest}: {exc}")
                continue
            pruned = oid in state.pruned
            for name, entry in manifest.data_entries().items():
                why = _entry_problem(manifest, name, entry)
                if why:
                    state.add("manifest", commit.manifest,
                              f"manifest {commit.manifest[:12]}: tensor {name} {why}")
                    continue
                state.referenced.add(entry.id)
                if entry.id not in state.kinds:
                    if not (pruned or state.lazy or self.objects.has(entry.id)):  # corrupt:
                        state.add("connectivity", oid,  # reported above
                                  f"commit {oid[:12]}: tensor {name} ({entry.id[:12]}) is "
                                  "missing")
                elif state.kinds[entry.id] != "tensor" or \
                        state.sizes[entry.id] != entry.nbytes:
                    state.add("manifest", commit.manifest,
                              f"commit {oid[:12]}: tensor {name} has the wrong kind or size")

    def _fsck_refs(self, state: FsckState) -> None:
        """Every ref file is readable and names a commit that is here; the snapshot a ref
        points to still has its tensors (a pruned one keeps them while a ref is on it)."""
        refs: dict[str, ObjectId] = {}
        for name, why in self.refs.damaged().items():
            state.add("ref", name, why)
        refs.update(self.refs.list())
        if self.refs.read_raw("HEAD") is None:
            state.add("ref", "HEAD", "HEAD is missing")
        else:
            try:
                head = self.refs.read("HEAD")
                if head:
                    refs["HEAD"] = head
            except VrlError as exc:
                state.add("ref", "HEAD", str(exc))
        for name, oid in refs.items():
            state.referenced.add(oid)
            if not state.has_commit(oid):
                state.add("ref", name,
                          f"ref {name} points to {oid[:12]}, which is not a commit here")
            elif oid in state.pruned and not state.lazy:
                missing = self._missing_tensors(oid)
                if missing:
                    state.add("connectivity", name,
                              f"ref {short_ref(name)} points to pruned snapshot {oid[:12]}, "
                              f"whose tensors are gone ({len(missing)} missing): it cannot be "
                              "restored here; fetch it from a remote or delete the ref")

    def _missing_tensors(self, oid: ObjectId) -> list[ObjectId]:
        try:
            manifest = self.read_manifest(self.read_commit(oid).manifest)
        except VrlError:
            return []  # reported by _fsck_commits
        return [e.id for e in manifest.data_entries().values() if not self.objects.has(e.id)]

    def _fsck_reflogs(self, state: FsckState) -> None:
        """Every reflog line parses and names commits that are here (gc relies on them)."""
        for name in sorted(self.refs.all_logs()):
            try:
                read = self.refs.read_log(name)
            except VrlError as exc:
                state.add("reflog", f"logs/{name}", str(exc))
                continue
            for message in read.damaged:
                state.add("reflog", f"logs/{name}", message)
            if read.torn:
                state.warnings.append(Problem("reflog", f"logs/{name}", read.torn))
            # a line names the time to the microsecond and its process: one seen twice was
            # written twice (a replay that applied a record again), not moved twice
            if len(set(read.entries)) != len(read.entries):
                state.add("reflog", f"logs/{name}", f"logs/{name} holds a line twice (a move "
                          "logged twice); delete the repeated line")
            if state.lazy:
                continue
            named = {x for e in read.entries for x in (e.old, e.new) if x}
            for oid in sorted(self._never_moved(name, read.entries)):
                named.discard(oid)
                state.warnings.append(Problem(
                    "reflog", f"logs/{name}", f"logs/{name} names commit {oid[:12]} of a "
                    "move that never happened (a crash before the ref moved): harmless"))
            for oid in sorted(named):
                state.referenced.add(oid)
                if not state.has_commit(oid):
                    state.add("reflog", f"logs/{name}",
                              f"logs/{name} names commit {oid[:12]}, which is missing or "
                              "damaged")

    def iter_commits(self) -> Iterator[ObjectId]:
        """Every commit object in the store, reachable or not."""
        for oid in self.objects.ids():
            try:
                if self.objects.kind_and_size(oid)[0] == "commit":
                    yield oid
            except VrlError:
                continue


def _young_commit(repo: Maintenance, oid: ObjectId, cutoff: float) -> bool:
    try:
        return repo.objects.mtime(oid) > cutoff and \
            repo.objects.kind_and_size(oid)[0] == "commit"
    except (VrlError, OSError):  # gone meanwhile
        return False
