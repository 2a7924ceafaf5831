"""Merging the packs of a file object store: `consolidate` after commits (packs merged by
size class), `repack` (everything small into one pack), and rewriting a pack without the
objects gc deletes - each crash-safely: the new pack is durable before anything it
replaces is removed.

`PackMerging` is a part of `FileObjectStore` (vrl/object_store.py), as `PackSet` is
(vrl/pack_set.py): it works on that pack set's tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from vrl import pack, pack_set
from vrl.durable import discard
from vrl.errors import storage_error
from vrl.objects import HEADER_SIZE, ObjectId, is_object_id

AUTO_MERGE = 32  # this many packs of one size class are merged after a commit
# called by a step that removes files once what it wrote, and the removal of what that
# replaces, are durable (Journal.maintaining)
Checkpoint = Callable[[], None]
MERGED_MAX = 8 << 20  # packs from this size up are never merged again (but by repack)
FRESH_MAX = 256 << 10  # the size class of one commit's pack of a small policy


class PackMerging:
    """Merges and rewrites of a `FileObjectStore`'s packs (a part of it: see the module's
    docstring)."""

    # ------------------------------------------------------------------ deleting
    def _delete_packed(self, wanted: set[ObjectId], older_than: float | None,
                       dry_run: bool) -> dict[ObjectId, int]:
        """`delete_many` for packed objects: {id: bytes freed}."""
        freed: dict[ObjectId, int] = {}
        self._refresh()
        # every pack holding one (a crash between a rewrite and the removal of the pack it
        # replaced leaves an object in two packs)
        for name, entries in sorted(self._packs.items()):
            drop = [o for o in entries if o in wanted]
            if not drop:
                continue
            try:
                mtime = os.stat(f"{self._pack_dir}/{name}").st_mtime_ns
            except FileNotFoundError:
                continue
            if older_than is not None and mtime > older_than * 1e9:
                continue
            if dry_run or self._rewrite_pack(name, set(drop), mtime):
                freed.update((o, entries[o][1]) for o in drop)
        return freed

    def _rewrite_pack(self, name: str, drop: set[ObjectId], mtime: int | None) -> bool:
        """Replace pack `name` by one without `drop`; False if it changed (was touched or
        removed) meanwhile, in which case nothing is removed."""
        path = f"{self._pack_dir}/{name}"
        entries = self._packs.get(name, {})
        keep = [o for o in entries if o not in drop]
        try:
            if keep:
                with open(path, "rb") as f:
                    objects = [(o, os.pread(f.fileno(), entries[o][1], entries[o][0]))
                               for o in keep]
                new = self.write_pack(objects)
                self.sync()
            else:
                new = None
            if mtime is not None and os.stat(path).st_mtime_ns != mtime:
                return False  # reused meanwhile: keep it (the new pack is a harmless copy)
            if new != name:
                os.unlink(path)
                self._dirty_dirs.add(self._pack_dir)
                self.sync()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, self.root.parent, "rewriting a pack") from exc
        self._refresh()
        return True

    # ------------------------------------------------------------------ maintenance
    def repack(self, checkpoint: Checkpoint | None = None) -> tuple[int, int]:
        """Merge every pack and every small loose object into one pack, crash-safely (the
        new pack is durable before anything it replaces is removed; `checkpoint()` is
        called once the removals are durable too). Returns (objects in the new pack, files
        removed)."""
        self._refresh()
        packs = sorted(self._packs)
        loose = []
        for sub in self.root.iterdir() if self.root.is_dir() else []:
            if len(sub.name) == 2 and sub.is_dir():
                for f in sub.iterdir():
                    oid = sub.name + f.name
                    if is_object_id(oid) and f.stat().st_size < HEADER_SIZE + pack_set.PACK_MAX:
                        loose.append(ObjectId(oid))
        if len(packs) + len(loose) < 2 or (len(packs) == 1 and not loose):
            return len(self._packed), 0
        return self._merge(packs, loose, checkpoint)

    def consolidate(self, checkpoint: Checkpoint | None = None) -> int:
        """Bound the number of packs a reader must index (one per commit otherwise): once
        AUTO_MERGE packs of one size class exist - below FRESH_MAX (commits' own packs), or
        from there to MERGED_MAX (merged ones) - merge them into one. Packs are merged by
        class so that a commit's bytes are rewritten about twice, not once per merge (a
        merged pack merged again with every 32 new ones rewrote it up to four times: most
        of a small commit's mean cost). Bigger packs are left alone. `checkpoint`: as
        for `repack`. Returns the number of packs merged (0 if nothing was due)."""
        self._refresh(force=False)
        merged = 0
        for _ in range(2):  # one merge per class at most
            due = self._due()
            if due is None:
                break
            self._merge(due, [], checkpoint)  # (a merged pack may complete the next)
            merged += len(due)
        return merged

    def merge_due(self) -> bool:
        """Whether `consolidate` has work once the pack being placed in the background
        (if any) is in place: the caller then waits for it (cheap: no system call)."""
        landing = sum(len(raw) for raw in self._landing.values()) if self._landing else None
        return self._due(landing) is not None

    def _due(self, landing: int | None = None) -> list[str] | None:
        """The packs of the first size class with AUTO_MERGE of them (counting a pack of
        `landing` bytes about to be placed), or None."""
        if len(self._packs) + (landing is not None) < AUTO_MERGE:
            return None  # the common case: not even a look at sizes
        # the packs' size classes, kept from the last look and extended by the packs
        # added since (every commit asks, and adds one); worked out afresh when one went
        packs = tuple(self._packs)  # (in the order they came: a new one is appended)
        cached = self._classes
        if cached is not None and packs[:len(cached[0])] == cached[0]:
            classes, added = cached[1], packs[len(cached[0]):]
        else:
            if len(self._pack_sizes) > 2 * len(self._packs) + AUTO_MERGE:  # merged away
                sizes = dict(self._pack_sizes)  # (copied at once: a placing thread adds)
                self._pack_sizes = {n: v for n, v in sizes.items() if n in self._packs}
            classes, added = ([], []), packs
        if added:
            classes = ([*classes[0]], [*classes[1]])
            gone = False
            for name in added:
                size = self._pack_sizes.get(name)
                if size is None:  # (a pack file never changes: its size is looked up once)
                    try:
                        size = self._pack_sizes[name] = \
                            os.stat(f"{self._pack_dir}/{name}").st_size
                    except FileNotFoundError:
                        gone = True  # (the tables are behind: a fresh look next time)
                        continue
                if size < MERGED_MAX:
                    classes[size >= FRESH_MAX].append(name)
            self._classes = None if gone else (packs, classes)
        extra = landing >= FRESH_MAX if landing is not None and landing < MERGED_MAX \
            else None
        for kind, names in enumerate(classes):
            if len(names) + (extra == kind) >= AUTO_MERGE:
                return sorted(names) + ([""] if extra == kind else [])
        return None

    def _merge(self, packs: list[str], loose: list[ObjectId],
               checkpoint: Checkpoint | None = None) -> tuple[int, int]:
        objects: dict[ObjectId, bytes] = {}
        for oid in loose:
            try:
                raw = self.path(oid).read_bytes()
            except FileNotFoundError:
                continue
            if pack.check_raw(oid, raw) is None:  # a damaged file stays for fsck to report
                objects[oid] = raw
        for name in packs:
            try:
                with open(f"{self._pack_dir}/{name}", "rb") as f:
                    for oid, (offset, length) in self._packs[name].items():
                        objects.setdefault(oid, os.pread(f.fileno(), length, offset))
            except FileNotFoundError:  # another repack or gc replaced it: do nothing
                return 0, 0
        new = self.write_pack(objects.items())
        self.sync()
        removed = 0
        for name in packs:
            if name != new:
                discard(Path(f"{self._pack_dir}/{name}"))
                removed += 1
        for oid in objects.keys() & set(loose):
            discard(self.path(oid))
            self._dirty_dirs.add(os.path.dirname(self.fspath(oid)))
            removed += 1
        self._dirty_dirs.add(self._pack_dir)
        self.sync()  # the removals durable: no name of a removed pack comes back empty
        if checkpoint is not None:
            checkpoint()
        self._refresh()
        return len(objects), removed
