"""Repository maintenance: retention (prune), reachability, gc, repack and fsck.

A mixin of `vrl.Repo`; it needs the repository's `objects`, `refs`, `config` and its
commit/manifest readers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vrl.errors import ObjectNotFoundError, VrlError
from vrl.object_store import discard
from vrl.objects import Commit, Manifest, ObjectId, is_object_id

if TYPE_CHECKING:
    from vrl.repo import Repo


class Maintenance:
    """prune, reachable, gc, fsck (mixed into Repo)."""

    def _pruned_path(self: Repo) -> Path:
        return self.vrl_dir / "pruned"

    def pruned(self: Repo) -> set[ObjectId]:
        """Commits whose tensor data retention released (gc then frees it)."""
        try:
            text = self._pruned_path().read_text()
        except FileNotFoundError:
            return set()
        return {ObjectId(line) for line in text.split() if is_object_id(line)}

    def first_parent_chain(self: Repo, oid: ObjectId | None) -> list[ObjectId]:
        chain = []
        while oid is not None:
            chain.append(oid)
            try:
                parents = self.read_commit(oid).parents
            except ObjectNotFoundError:
                break
            oid = parents[0] if parents else None
        return chain

    def prune(self: Repo, keep_last: int = 10, refs: list[str] | None = None,
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
            with self.refs.lock("refs/pruned"):
                current = self.pruned()
                lines = sorted(current | set(newly))
                self.objects.write_raw(self._pruned_path(), ["\n".join(lines).encode() + b"\n"],
                                       "the pruned list")
        return newly

    def reachable(self: Repo, include_reflog: bool = True) -> set[ObjectId]:
        """Every object reachable from refs, HEAD and (by default) the reflog.

        Pruned commits keep their commit and manifest objects but not their tensors (unless
        a kept snapshot reaches the same tensors).
        """
        roots: set[ObjectId] = set(self.refs.list().values())
        head = self.head()
        if head:
            roots.add(head)
        if include_reflog:
            for name in self.refs.all_logs():
                for entry in self.refs.reflog(name):
                    roots.update(x for x in (entry.old, entry.new) if x)
        return self._closure(roots)

    def _closure(self: Repo, roots: set[ObjectId]) -> set[ObjectId]:
        """`roots` (commits) and every object they reach."""
        seen: set[ObjectId] = set()
        pruned = self.pruned()
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
                    seen.update(e.id for e in self.read_manifest(commit.manifest).tensors.values())
                except VrlError:
                    continue
        return seen

    def gc(self: Repo, grace: float | None = None, dry_run: bool = False,
           expire_reflog: bool = False) -> tuple[int, int]:
        """Delete unreachable objects older than `grace` seconds; return (count, bytes)."""
        grace = self.config.getfloat("gc", "grace") if grace is None else grace
        if expire_reflog and not dry_run:
            self.refs.expire_logs()
        keep = self.reachable()
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
        return count, freed

    def repack(self: Repo) -> tuple[int, int]:
        """Merge all packs and small loose objects into one pack; return (objects packed,
        files removed). Crash-safe: the new pack is durable before anything goes."""
        return self.objects.repack()

    def fsck(self: Repo, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
        """Re-hash every object and check every commit, manifest and ref."""
        problems: list[str] = []
        kinds: dict[ObjectId, str] = {}
        sizes: dict[ObjectId, int] = {}
        ids = list(self.objects.ids())
        for i, oid in enumerate(ids):
            try:
                kinds[oid] = self.objects.verify(oid)
                sizes[oid] = self.objects.kind_and_size(oid)[1]
            except VrlError as exc:
                problems.append(f"corrupt object {oid}: {exc}")
            if progress:
                progress(i + 1, len(ids))
        problems += self.objects.check()  # packs: index, truncation, every object
        lazy = self.config.getbool("core", "partial") if self.config.get("core", "partial") \
            else False
        referenced: set[ObjectId] = set()
        pruned_set = self.pruned()
        for oid, kind in kinds.items():
            if kind != "commit":
                continue
            try:
                commit = Commit.from_bytes(self.objects.read(oid)[1])
            except VrlError as exc:
                problems.append(f"bad commit {oid}: {exc}")
                continue
            pruned = oid in pruned_set
            for parent in commit.parents:
                referenced.add(parent)
                if kinds.get(parent) != "commit" and not lazy:
                    problems.append(f"commit {oid[:12]}: parent {parent[:12]} is missing")
            referenced.add(commit.manifest)
            if kinds.get(commit.manifest) != "manifest":
                problems.append(f"commit {oid[:12]}: manifest {commit.manifest[:12]} is missing")
                continue
            try:
                manifest = Manifest.from_bytes(self.objects.read(commit.manifest)[1])
            except VrlError as exc:
                problems.append(f"bad manifest {commit.manifest}: {exc}")
                continue
            for name, entry in manifest.tensors.items():
                referenced.add(entry.id)
                if entry.id not in kinds:
                    if not (pruned or lazy or self.objects.has(entry.id)):  # corrupt: said
                        problems.append(f"commit {oid[:12]}: tensor {name} ({entry.id[:12]}) "
                                        "is missing")
                elif kinds[entry.id] != "tensor" or sizes[entry.id] != entry.nbytes:
                    problems.append(f"commit {oid[:12]}: tensor {name} has the wrong kind "
                                    "or size")
        refs = dict(self.refs.list())
        head_raw = self.refs.read_raw("HEAD")
        if head_raw is None:
            problems.append("HEAD is missing")
        else:
            try:
                head = self.refs.read("HEAD")
                if head:
                    refs["HEAD"] = head
            except VrlError as exc:
                problems.append(str(exc))
        for name, oid in refs.items():
            if kinds.get(oid) != "commit":
                problems.append(f"ref {name} points to {oid[:12]}, which is not a commit here")
            referenced.add(oid)
        dangling = sorted(o for o, k in kinds.items() if k == "commit" and o not in referenced)
        return {"objects": len(ids), "problems": problems, "dangling_commits": dangling,
                "ok": not problems}

    def iter_commits(self: Repo) -> Iterator[ObjectId]:
        """Every commit object in the store, reachable or not."""
        for oid in self.objects.ids():
            try:
                if self.objects.kind_and_size(oid)[0] == "commit":
                    yield oid
            except VrlError:
                continue


def _young_commit(repo: Repo, oid: ObjectId, cutoff: float) -> bool:
    try:
        return repo.objects.mtime(oid) > cutoff and \
            repo.objects.kind_and_size(oid)[0] == "commit"
    except (VrlError, OSError):  # gone meanwhile
        return False
