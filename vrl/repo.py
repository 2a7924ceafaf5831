"""The repository: objects + refs + config, and the operations users think in.

Importing this module does not import torch or numpy: metadata commands (log, branch,
tag, reflog) stay fast. Tensor work imports them on first use.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vrl.commit_engine import MMAP_MIN, CommitEngine, FlatState
from vrl.config import Config
from vrl.diff import DiffResult, compare
from vrl.durable import fsync, fsync_dir
from vrl.errors import (
    CorruptObjectError,
    NotARepositoryError,
    ObjectNotFoundError,
    PrunedError,
    RefConflictError,
    RevisionError,
    VrlError,
    storage_error,
)
from vrl.gclock import create_lock_files, writes
from vrl.journal import Journal, boot_id, create_journal
from vrl.maintenance import Maintenance
from vrl.object_store import FileObjectStore
from vrl.objects import (
    Commit,
    Manifest,
    ObjectId,
    TensorEntry,
)
from vrl.refs import ANY, RefStore, check_ref_name, short_ref
from vrl.revisions import Revisions
from vrl.safetensors_file import FileSlice, RawTensor
from vrl.tensor_reader import TensorReader
from vrl.workspace import WorkspaceMixin

VRL_DIR = ".vrl"
METADATA_CACHED = 1 << 10  # commits (and as many manifests) kept parsed in memory


class _Bounded(dict):
    """A dict that forgets its oldest entries beyond `limit`: a training run commits
    without end, and every commit and manifest kept would grow the process (and the
    garbage collector's work) for good."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)  # (not super(): every commit sets two)
        if len(self) > self.limit:
            # the oldest quarter at once: one at a time, each look for the oldest walks
            # past the holes every earlier deletion left at the front of the dict
            for old in list(itertools.islice(self, len(self) - self.limit * 3 // 4)):
                del self[old]


@dataclass(frozen=True)
class LogEntry:
    id: ObjectId
    commit: Commit
    refs: tuple[str, ...] = ()


def find_vrl_dir(start: str | Path) -> Path:
    path = Path(start).resolve()
    for candidate in (path, *path.parents):
        if (candidate / VRL_DIR / "HEAD").is_file():
            return candidate / VRL_DIR
    raise NotARepositoryError(f"not a vrl repository (or any parent up to /): {path}; "
                              "run `vrl init` first")


def default_author(config: Config) -> str:
    name = os.environ.get("VRL_AUTHOR") or config.get("user", "name")
    if not name:
        try:
            import getpass

            name = getpass.getuser()
        except (KeyError, OSError):
            name = "unknown"
    email = config.get("user", "email")
    return f"{name} <{email}>" if email else name


REMOTE_LAYER = "vrl.remote"  # the entry-point group that names the remote layer


@functools.cache
def remote_layer() -> Any:
    """vrl's remote layer (`fetch_missing`, `fetch_pruned`), found through its entry point
    (pyproject.toml): the store reaches remotes only on a miss, and never imports them."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=REMOTE_LAYER, name="fetchers"):
        return ep.load()
    raise VrlError("fetching from a remote needs vrl's remote layer, which vrl registers "
                   "when it is installed: reinstall vrl (`pip install -e .` in a checkout)")


class Repo(Maintenance, WorkspaceMixin):
    """A vrl repository (the `.vrl` directory and the workspace around it)."""

    def __init__(self, path: str | Path = ".", *, fsync: bool | None = None,
                 verify: bool | None = None, journal: bool | None = None,
                 direct: bool = False, parallel_hashing: bool = True,
                 fetch: bool = True) -> None:
        """Open the repository at `path` or above. `fsync`, `verify`, `journal`: override
        core.fsync, core.verify, core.journal. `direct`: write big objects with O_DIRECT
        where their payload is laid out for it; `parallel_hashing`: hash a very large
        object on several cores (the Snapshotter's committer turns both). `fetch`: what a
        partial clone lacks (core.promisor) and a pruned snapshot's tensors are downloaded
        from the remotes on demand; False never contacts a remote (the UI's views)."""
        self.vrl_dir = find_vrl_dir(path)
        self.workdir = self.vrl_dir.parent
        self.config = Config(self.vrl_dir / "config")
        fsync = self.config.getbool("core", "fsync") if fsync is None else fsync
        verify = self.config.getbool("core", "verify") if verify is None else verify
        self.author = default_author(self.config)
        self.objects = FileObjectStore(self.vrl_dir / "objects", fsync=fsync,
                                       verify_reads=verify,
                                       fresh_for=self.config.getfloat("gc", "grace") / 2,
                                       direct=direct, parallel_hashing=parallel_hashing)
        self.refs = RefStore(self.vrl_dir, fsync=fsync, who=self.author)
        # The commit journal (vrl/journal.py): durable commits in one fdatasync where a
        # reboot can be recognised. Any repository object honours one (it finishes what a
        # crash left and checkpoints before changing a ref outside it); it commits through
        # it only with fsync on.
        commits = Journal(self.vrl_dir, self.objects, self.refs)
        self.journal = commits if commits.usable else None
        if journal is None:
            journal = self.config.getbool("core", "journal")
        self._journaled = bool(self.journal and fsync and journal)
        if self.journal is not None:
            self.refs.guard = self.journal.exclusive
            self.refs.barrier = self.objects.barrier = self.journal.wait
            self.journal.recover()
        self._commits: dict[ObjectId, Commit] = _Bounded(METADATA_CACHED)
        self._manifests: dict[ObjectId, Manifest] = _Bounded(METADATA_CACHED)
        self.engine = CommitEngine(self, self._commits, self._manifests, self._journaled)
        self.reader = TensorReader(self, self.engine)
        self.fetching = fetch
        # a partial clone: objects not here are downloaded from this remote when read
        self.lazy = fetch and bool(self.config.get("core", "promisor"))

    # ------------------------------------------------------------------ creation
    @classmethod
    def init(cls, path: str | Path = ".", branch: str = "main",
             workspace: str | None = None) -> Repo:
        """Create a repository in `path` (idempotent: an existing one is left as it is)."""
        root = Path(path).resolve()
        vrl_dir = root / VRL_DIR
        if (vrl_dir / "HEAD").is_file():
            return cls(root)
        check_ref_name(branch, "branch")
        created = []  # directories made here (innermost first): their entries made durable
        folder = root
        while not folder.exists():
            created.append(folder)
            folder = folder.parent
        try:
            # the folders every commit needs are made (and made durable) here, once: a
            # first commit then creates no directory, each of which costs it an fsync
            for sub in ("objects/pack", "refs/heads", "refs/tags", "logs/refs/heads"):
                (vrl_dir / sub).mkdir(parents=True, exist_ok=True)
            config = Config(vrl_dir / "config")
            if workspace:
                config.set("core", "workspace", workspace)
            config.save()
            if boot_id() is not None:
                create_journal(vrl_dir)  # here, not in the first commit
            create_lock_files(vrl_dir)  # (as the journal: ~0.2 ms a first commit saves)
            with open(vrl_dir / "HEAD.tmp", "w") as f:
                f.write(f"ref: refs/heads/{branch}\n")
                f.flush()
                fsync(f.fileno())
            # every directory entry durable before HEAD, and HEAD's before the repository's:
            # a power cut never leaves a repository that opens but lost its commits' refs
            for sub in ("objects", "logs/refs", "logs", "refs", "."):
                fsync_dir(vrl_dir / sub)
            os.replace(vrl_dir / "HEAD.tmp", vrl_dir / "HEAD")  # HEAD last: marks it complete
            fsync_dir(vrl_dir)
            fsync_dir(root)
            for new in created:  # a clone into a new directory must not vanish at a cut
                fsync_dir(new.parent)
        except OSError as exc:
            raise storage_error(exc, root, "creating the repository") from exc
        return cls(root)

    # ------------------------------------------------------------------ objects
    def read_commit(self, oid: ObjectId) -> Commit:
        if oid not in self._commits:
            kind, payload = self._read(oid)
            if kind != "commit":
                raise RevisionError(f"{oid[:12]} is a {kind}, not a commit")
            try:
                self._commits[oid] = Commit.from_bytes(payload)
            except CorruptObjectError as exc:
                raise CorruptObjectError(f"commit {oid[:12]}: {exc} (run `vrl fsck`)") \
                    from None
        return self._commits[oid]

    def read_manifest(self, oid: ObjectId) -> Manifest:
        if oid not in self._manifests:
            kind, payload = self._read(oid)
            if kind != "manifest":
                raise CorruptObjectError(f"{oid[:12]} is a {kind}, not a manifest")
            self._manifests[oid] = Manifest.from_bytes(payload)
        return self._manifests[oid]

    def _read(self, oid: ObjectId) -> tuple[str, bytes]:
        try:
            return self.objects.read(oid)
        except ObjectNotFoundError:
            if not self.lazy:
                raise
            self.fetch_missing([oid])
            return self.objects.read(oid)

    def load_entry(self, entry: TensorEntry, verify: bool = False) -> Any:
        """A tensor from the store: memory-mapped (copy-on-write, private) when large.
        `verify`: its bytes are hashed first (CorruptObjectError if they do not match)."""
        return self.reader.load_entry(entry, verify)

    def read_tensor(self, entry: TensorEntry) -> RawTensor:
        """A tensor's raw bytes from the store, without torch (memory-mapped when large);
        for read-only use (statistics, diffs)."""
        return self.reader.read_tensor(entry)

    def tensor_chunk(self, entry: TensorEntry) -> memoryview | FileSlice:
        """A tensor's bytes to write into a file for a person, hashed to its id first."""
        return self.reader.tensor_chunk(entry)

    def read_verified(self, entry: TensorEntry) -> memoryview:
        """A tensor's bytes in memory, hashed to its id first."""
        return self.reader.read_verified(entry)

    def sync(self) -> None:
        """Wait until this process's commits are in their files. A journaled commit is
        durable when `commit` returns; its ref, reflog lines and pack are written just
        after, in the background (every read through vrl, in any process, waits for
        them). Only code that reads `.vrl/`'s files itself needs this."""
        if self.journal is not None:
            self.journal.wait()

    @contextlib.contextmanager
    def maintaining(self) -> Iterator[Callable[[], None]]:
        """Hold the repository for a step that removes files (a pack merge, repack):
        yields `checkpoint()`, to call once what the step wrote is durable and so is the
        removal of what it replaces (`Journal.maintaining`; docs/durability.md)."""
        if self.journal is None:
            yield lambda: None
            return
        with self.journal.maintaining() as checkpoint:
            yield checkpoint

    def fetch_missing(self, ids: list[ObjectId],
                      expect: dict[ObjectId, tuple[str, int]] | None = None) -> None:
        """Download `ids` from the promisor remote of this partial clone. `expect` maps ids
        to the (kind, payload size) a manifest promised: a mismatch is refused before
        anything is written."""
        if not self.lazy:
            raise VrlError("this repository is not a partial clone (or was opened with "
                           "fetch=False): nothing downloads on demand")
        remote_layer().fetch_missing(self, ids, expect)

    def fetch_pruned(self, ids: list[ObjectId],
                     expect: dict[ObjectId, tuple[str, int]] | None = None) -> bool | str:
        """Fetch a pruned snapshot's tensors from the first remote that has them all: True,
        else the names of the remotes tried ("" if none, or opened with fetch=False)."""
        if not self.fetching or not self.config.sections('remote "'):
            return ""
        return remote_layer().fetch_pruned(self, ids, expect)

    # ------------------------------------------------------------------ revisions
    def head(self) -> ObjectId | None:
        return self.refs.read("HEAD")

    def current_branch(self) -> str | None:
        target = self.refs.head_target()
        return short_ref(target) if target and target.startswith("refs/heads/") else None

    def resolve(self, rev: str = "HEAD") -> ObjectId:
        """Turn a revision (id prefix, branch, tag, HEAD, REV~n, REV^n, REF@{n}) into a
        commit id (vrl/revisions.py)."""
        return Revisions(self.objects, self.refs, self.read_commit,
                         lazy=self.lazy).resolve(rev)

    def _commits_with_prefix(self, prefix: str) -> list[ObjectId]:
        return Revisions(self.objects, self.refs, self.read_commit).commits_with_prefix(prefix)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self, state: Any, *, rehash: bool = False, write: bool = True
                 ) -> tuple[ObjectId, Manifest, set[ObjectId]]:
        """Store every tensor of `state` and its manifest; return (id, manifest, new ids).

        `state` may be a safetensors file opened by vrl.workspace.open_checkpoint (hashed
        from its memory map, no torch; its header is kept so checkout gives the file back),
        or a `FlatState` (already flattened, as the Snapshotter's committer sends it). With
        write=False nothing is stored (used to compare a workspace file with HEAD).
        `rehash` is accepted for compatibility and ignored: every byte is always read.
        """
        return self.engine.snapshot(state, write=write)

    @writes
    def commit(self, state: Any, optimizer: Any = None, *, message: str = "",
               hparams: dict[str, Any] | None = None, metrics: dict[str, Any] | None = None,
               step: int | None = None, env: bool | dict[str, Any] = True,
               meta: dict[str, Any] | None = None, allow_empty: bool = False,
               rehash: bool = False, threshold: float | None = None, ref: str = "HEAD",
               author: str | None = None, time: str | None = None) -> ObjectId:
        """Snapshot a model / state dict / checkpoint (plus optimizer) as a new commit.

        The ref (HEAD's branch by default) moves by compare-and-swap; if another process
        committed meanwhile, this commit is re-parented onto theirs (layer statistics are
        recomputed) so neither is lost. Every byte of every tensor is read (a write through
        `.data` is never missed); `rehash` is kept for compatibility and does nothing.
        """
        return self.engine.commit(state, optimizer, message=message, hparams=hparams,
                                  metrics=metrics, step=step, env=env, meta=meta,
                                  allow_empty=allow_empty, threshold=threshold, ref=ref,
                                  author=author, time=time)

    @property
    def threshold(self) -> float:
        return self.config.getfloat("diff", "threshold")

    def load(self, rev: str = "HEAD", *, verify: bool = False) -> Any:
        """The snapshot at `rev` as its original structure, tensors memory-mapped.

        The maps are lazy, as `safetensors.load_file`'s: no byte is read until used. With
        `verify` (or core.verify) every tensor is hashed to its id first, which reads it
        all (~0.1 s per 500 MB); `checkout(model=...)` and `.pt` exports do.
        """
        from vrl.tensors import unflatten

        oid = self.resolve(rev)
        manifest = self.read_manifest(self.read_commit(oid).manifest)
        try:
            return self.load_manifest(manifest, unflatten, verify=verify)
        except PrunedError:  # checked only on a miss: a restore pays no stat per object
            self.require_data(oid, manifest)  # fetches it from a remote, or says why not
            return self.load_manifest(manifest, unflatten, verify=verify)

    def require_data(self, oid: ObjectId, manifest: Manifest) -> None:
        """Make sure every data object of snapshot `oid` is here, fetching what a lazy clone
        or retention left out; raise PrunedError where no remote has it."""
        try:
            self.reader.fetch_or_fail(list(manifest.data_entries().values()))
        except PrunedError:
            if oid not in self.pruned():
                raise
            entries = manifest.data_entries().values()
            tried = self.fetch_pruned([e.id for e in entries],
                                      {e.id: ("tensor", e.nbytes) for e in entries})
            if tried is True:
                return
            where = f"no configured remote ({tried}) has it" if tried else \
                "add a remote that still has it (`vrl remote add`) and retry"
            raise PrunedError(f"snapshot {oid[:12]} was pruned by retention (its commit, "
                              "metrics and layer statistics are kept, its tensors were "
                              f"dropped); {where}") from None

    def load_manifest(self, manifest: Manifest, unflatten: Callable | None = None, *,
                      verify: bool = False) -> Any:
        if unflatten is None:
            from vrl.tensors import unflatten
        if self.lazy:  # fetch what is missing in one batch
            missing = [e for e in manifest.tensors.values() if not self.objects.has(e.id)]
            if missing:
                self.reader.fetch_or_fail(missing)
        tensors: dict[str, Any] = {}
        for name, entry in manifest.tensors.items():
            if not entry.tie:
                tensors[name] = self.load_entry(entry, verify=verify)
        for name, entry in manifest.tensors.items():  # ties may sort before their target
            if entry.tie:
                tensors[name] = tensors[entry.tie]
        return unflatten(manifest.tree, tensors)

    def load_into(self, module: Any, rev: str = "HEAD", optimizer: Any = None) -> ObjectId:
        """Load snapshot `rev` into `module` (and `optimizer`) in place; return its id.

        Unlike `checkout`, nothing moves: HEAD, branches, the reflog and the workspace
        checkpoint stay as they are (an evaluation or a warm start from an old snapshot).
        Every tensor is hashed to its id before it is copied (a damaged object is a
        CorruptObjectError), and a snapshot pruned by retention is fetched back from a
        remote that has it, as `checkout` does. `module` may be None to restore only the
        optimizer; a snapshot without optimizer state is a VrlError when one is given.
        """
        if module is None and optimizer is None:
            raise VrlError("load_into needs a module or an optimizer to load into")
        oid = self.resolve(rev)
        # every byte is copied into the module anyway: hashing it costs little more
        load_into(self.load(oid, verify=True), module, optimizer)
        return oid

    @writes
    def checkout(self, rev: str, model: Any = None, optimizer: Any = None,
                 create_branch: str | None = None, workspace: bool = False) -> ObjectId:
        """Load `rev` into `model`/`optimizer` (and the workspace checkpoint), then move HEAD
        (attached when `rev` is a branch), as `git checkout` does; `load_into` loads
        without moving anything.

        Data first, refs last: a snapshot that cannot be loaded or written (pruned, missing,
        a full disk) leaves HEAD and every branch where they were.
        """
        oid = self.resolve(rev)
        branch_ref = None
        if create_branch:
            check_ref_name(create_branch, "branch")
            if self.refs.read_raw(f"refs/heads/{create_branch}") is not None:
                raise RefConflictError(f"branch {create_branch!r} already exists; use "
                                       "another name")
        elif self._is_branch(rev):
            # HEAD attaches to the branch, so its tip is what is checked out, even where a
            # tag of the same name resolves elsewhere (as `git checkout` does)
            branch_ref = f"refs/heads/{rev}"
            oid = self.refs.read(branch_ref) or oid
        if workspace:  # loading fetches a pruned snapshot from a remote where it can
            self.write_workspace(oid)
        if model is not None or optimizer is not None:
            # every byte is copied into the model anyway: hashing it costs little more
            load_into(self.load(oid, verify=True), model, optimizer)
        self.ensure_restorable(oid, "check out")
        self.engine.forget_parent()  # (HEAD moves: the next commit reads where to)
        if create_branch:
            self.branch(create_branch, oid)
            self.refs.set_head(f"refs/heads/{create_branch}",
                               reason=f"checkout: moving to new branch {create_branch}")
        elif branch_ref:
            self.refs.set_head(branch_ref, reason=f"checkout: moving to {rev}")
        else:
            self.refs.set_head(oid, reason=f"checkout: moving to {rev}")
        return oid

    def _is_branch(self, name: str) -> bool:
        try:
            return self.refs.read(f"refs/heads/{check_ref_name(name, 'branch')}") is not None
        except VrlError:
            return False

    @writes
    def reset(self, rev: str, workspace: bool = False) -> tuple[ObjectId | None, ObjectId]:
        """Point the current branch (or detached HEAD) at `rev`; return (old, new).

        With `workspace`, the workspace checkpoint is rewritten first; if that fails, no
        ref moves.
        """
        oid = self.resolve(rev)
        branch = self.current_branch()
        self.ensure_restorable(oid, "reset to", keep=branch is not None)
        if workspace:
            self.write_workspace(oid)
        self.engine.forget_parent()
        old = self.refs.update("HEAD", oid, reason=f"reset: moving to {rev}")
        return old, oid

    # ------------------------------------------------------------------ history
    def log(self, rev: str = "HEAD", max_count: int | None = None) -> list[LogEntry]:
        """Commits reachable from `rev`, newest first."""
        try:
            start = self.resolve(rev)
        except RevisionError:
            if rev == "HEAD" and self.head() is None:
                return []
            raise
        decorations: dict[ObjectId, list[str]] = {}
        for name, oid in self.refs.list().items():
            decorations.setdefault(oid, []).append(name)
        out: list[LogEntry] = []
        seen = {start}
        heap = [(_neg_time(self.read_commit(start).time), start)]
        while heap and (max_count is None or len(out) < max_count):
            _, oid = heapq.heappop(heap)
            commit = self.read_commit(oid)
            out.append(LogEntry(oid, commit, tuple(decorations.get(oid, ()))))
            for parent in commit.parents:
                if parent not in seen:
                    seen.add(parent)
                    try:
                        heapq.heappush(heap, (_neg_time(self.read_commit(parent).time),
                                              parent))
                    except ObjectNotFoundError:
                        continue  # shallow history
        return out

    def diff(self, a: str, b: str | None = None, threshold: float | None = None
             ) -> DiffResult:
        """Layer changes from `a` to `b` (with one revision: from its first parent to it)."""
        threshold = self.threshold if threshold is None else threshold
        if b is None:
            new_id = self.resolve(a)
            new = self.read_commit(new_id)
            old_id = new.parents[0] if new.parents else None
        else:
            old_id, new_id = self.resolve(a), self.resolve(b)
            new = self.read_commit(new_id)
        if new.stats.get("layers") is not None and new.stats.get("parent") == old_id:
            try:
                result = DiffResult.from_json(new.stats).with_threshold(threshold)
                result.summary()
                return result
            except (KeyError, TypeError, ValueError, AttributeError):
                pass  # statistics of a hand-made or foreign commit: recompute them
        old_manifest = self.read_manifest(self.read_commit(old_id).manifest) if old_id else None
        return compare(old_manifest, self.read_manifest(new.manifest), self.read_tensor,
                       threshold=threshold)

    # ------------------------------------------------------------------ branches and tags
    def branches(self) -> dict[str, ObjectId]:
        return {short_ref(k): v for k, v in self.refs.list("refs/heads/").items()}

    def tags(self) -> dict[str, ObjectId]:
        return {short_ref(k): v for k, v in self.refs.list("refs/tags/").items()}

    @writes
    def branch(self, name: str, rev: str | ObjectId = "HEAD", force: bool = False) -> ObjectId:
        check_ref_name(name, "branch")
        oid = self.resolve(rev)
        ref = f"refs/heads/{name}"
        if not force and self.refs.read_raw(ref) is not None:
            raise RefConflictError(self.refs.problem(ref) or f"branch {name!r} already "
                                   "exists; use another name or --force")
        self.ensure_restorable(oid, "branch", keep=True)
        self.engine.forget_parent()
        try:
            self.refs.update(ref, oid, expected=ANY if force else None,
                             reason=f"branch: created from {rev}")
        except RefConflictError:
            if self.refs.read_raw(ref) is None:
                raise  # not a race with its creation: a name clash, a lock
            raise RefConflictError(f"branch {name!r} already exists; use another name or "
                                   "--force") from None
        return oid

    def delete_branch(self, name: str) -> ObjectId | None:
        """Delete a branch; return where it pointed (None for a damaged ref file)."""
        check_ref_name(name, "branch")
        if self.current_branch() == name:
            raise VrlError(f"cannot delete branch {name!r}: HEAD is on it; check out another "
                           "branch first")
        return self._delete_ref(f"refs/heads/{name}", f"branch {name!r}", "branch: deleted")

    @writes
    def tag(self, name: str, rev: str = "HEAD", force: bool = False) -> ObjectId:
        check_ref_name(name, "tag")
        oid = self.resolve(rev)
        ref = f"refs/tags/{name}"
        if not force and self.refs.read_raw(ref) is not None:
            raise RefConflictError(self.refs.problem(ref) or f"tag {name!r} already exists; "
                                   "use --force to move it")
        self.ensure_restorable(oid, "tag", keep=True)
        self.engine.forget_parent()
        try:
            self.refs.update(ref, oid, expected=ANY if force else None, reason=f"tag: {rev}")
        except RefConflictError:
            if self.refs.read_raw(ref) is None:
                raise
            raise RefConflictError(f"tag {name!r} already exists; use --force to move it") \
                from None
        return oid

    def delete_tag(self, name: str) -> ObjectId | None:
        """Delete a tag; return where it pointed (None for a damaged ref file)."""
        check_ref_name(name, "tag")
        return self._delete_ref(f"refs/tags/{name}", f"tag {name!r}", "tag: deleted")

    def _delete_ref(self, ref: str, what: str, reason: str) -> ObjectId | None:
        self.engine.forget_parent()
        damaged = self.refs.problem(ref) is not None
        old = None if damaged else self.refs.read(ref)
        if old is None and not damaged:
            raise RevisionError(f"{what} not found")
        # a damaged file holds no value to compare with: it is removed as it is
        self.refs.update(ref, None, expected=ANY if damaged else old, reason=reason)
        return old


def _neg_time(time: str) -> str:
    # heapq is a min-heap; invert the ISO timestamp so the newest pops first
    return "".join(chr(0x10FFFF - ord(c)) for c in time)


def load_into(state: Any, model: Any = None, optimizer: Any = None) -> None:
    """Copy a loaded snapshot into a model and/or optimizer (in place)."""
    if isinstance(state, dict) and "model" in state and ("optimizer" in state or
                                                         optimizer is not None):
        if model is not None:
            model.load_state_dict(state["model"])
        if optimizer is not None:
            if "optimizer" not in state:
                raise VrlError("this snapshot holds no optimizer state")
            optimizer.load_state_dict(state["optimizer"])
        return
    if optimizer is not None:
        raise VrlError("this snapshot holds no optimizer state")
    if model is not None:
        model.load_state_dict(state)


__all__ = ["Repo", "LogEntry", "FlatState", "RawTensor", "load_into", "MMAP_MIN"]
