"""Revisions: the names a user gives a commit, and the commit each names.

`HEAD` (or `@`), a branch, a tag, a remote-tracking branch, a full id or a unique prefix of
4 or more hex digits; then any of `~n` (the n-th first-parent ancestor), `^n` (the n-th
parent) and `REF@{n}` (where REF was n moves ago, as `vrl reflog` numbers them), as in git.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from vrl.errors import ObjectNotFoundError, RevisionError, VrlError
from vrl.object_store import FileObjectStore
from vrl.objects import Commit, ObjectId, is_object_id
from vrl.refs import RefStore, check_ref_name, short_ref

_REV = re.compile(r"^(?P<base>.*?)(?P<ops>(?:[~^]\d*)*)$")
_REFLOG_REV = re.compile(r"^(?P<ref>.*)@\{(?P<n>\d+)\}$")


class Revisions:
    """Resolves revisions against one repository's objects and refs. `lazy`: objects may
    be fetched on demand (a partial clone), so an id not here yet is taken as it is."""

    def __init__(self, objects: FileObjectStore, refs: RefStore,
                 read_commit: Callable[[ObjectId], Commit], lazy: bool = False) -> None:
        self.objects, self.refs, self.read_commit, self.lazy = objects, refs, read_commit, lazy

    def resolve(self, rev: str) -> ObjectId:
        """Turn a revision (id prefix, branch, tag, HEAD, REV~n, REV^n) into a commit id."""
        if not isinstance(rev, str) or not rev.strip():
            raise RevisionError("empty revision")
        match = _REV.match(rev.strip())
        assert match is not None
        oid = self._base(match["base"], rev)
        for op, num in re.findall(r"([~^])(\d*)", match["ops"]):
            n = int(num) if num else 1
            if op == "~":
                for _ in range(n):
                    oid = self._parent(oid, 1, rev)
            elif n:
                oid = self._parent(oid, n, rev)
        return oid

    def _parent(self, oid: ObjectId, n: int, rev: str) -> ObjectId:
        parents = self.read_commit(oid).parents
        if len(parents) < n:
            raise RevisionError(f"revision {rev!r} goes past the first commit ({oid[:12]} has "
                                f"{len(parents)} parent(s))")
        return parents[n - 1]

    def _base(self, base: str, rev: str) -> ObjectId:
        reflog = _REFLOG_REV.match(base)
        if reflog:
            return self._reflog(reflog["ref"], int(reflog["n"]), rev)
        if base in ("HEAD", "@"):
            head = self.refs.read("HEAD")
            if head is None:
                raise RevisionError("HEAD has no commits yet; commit a snapshot first")
            return head
        if is_object_id(base):
            if not self.objects.has(ObjectId(base)) and not self.lazy:
                try:  # says so when a damaged pack may have held it
                    self.objects.kind_and_size(ObjectId(base))
                except ObjectNotFoundError:
                    raise RevisionError(f"unknown revision {rev!r}: no such commit") from None
            return ObjectId(base)
        if base and not any(c in base for c in " \t\n\x00"):
            for prefix in ("", "refs/", "refs/tags/", "refs/heads/", "refs/remotes/"):
                name = prefix + base
                if name.startswith("refs/") and ".." not in name:
                    try:
                        value = self.refs.read(name)
                    except VrlError:
                        value = None
                    if value:
                        return value
        if re.fullmatch(r"[0-9a-f]{4,63}", base):
            matches = self.commits_with_prefix(base)
            if len(matches) == 1:
                return matches[0]
            if len(matches) > 1:
                listed = ", ".join(m[:12] for m in matches[:5])
                raise RevisionError(f"ambiguous revision {rev!r}: matches {listed}; "
                                    "use more characters")
        raise RevisionError(f"unknown revision {rev!r}: not a branch, tag or commit id "
                            "(see `vrl log` and `vrl branch`)")

    def _reflog(self, ref: str, n: int, rev: str) -> ObjectId:
        """`REF@{n}`: where REF was n moves ago, as `vrl reflog` numbers them."""
        if ref in ("", "HEAD", "@"):
            candidates = ["HEAD"]
        elif ref.startswith("refs/"):
            candidates = [ref]
        else:
            candidates = [f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/remotes/{ref}"]
        for name in candidates:
            try:
                entries = self.refs.reflog(check_ref_name(name) if name != "HEAD" else name)
            except VrlError:
                continue
            if not entries:
                continue
            if n >= len(entries):
                raise RevisionError(f"unknown revision {rev!r}: the reflog of "
                                    f"{short_ref(name)} has only {len(entries)} entries "
                                    "(see `vrl reflog`)")
            oid = entries[n].new
            if oid is None:
                raise RevisionError(f"revision {rev!r} names a deletion in the reflog")
            return oid
        raise RevisionError(f"unknown revision {rev!r}: {ref or 'HEAD'} has no reflog "
                            "(see `vrl reflog`)")

    def commits_with_prefix(self, prefix: str) -> list[ObjectId]:
        out = []
        for oid in self.objects.ids_with_prefix(prefix):
            try:
                if self.objects.kind_and_size(oid)[0] == "commit":
                    out.append(oid)
            except VrlError:
                continue
        return sorted(out)
