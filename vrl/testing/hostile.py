"""The hostile-remote suite: Hypothesis damages a remote, or forges objects and refs on it
(with valid hashes, so only vrl's own checks stand in the way), and every clone, fetch,
pull, checkout and export from it must either work or fail cleanly:

- only a `VrlError` with a one-line message, never another exception or a traceback;
- nothing written outside the repository (a failed clone leaves no directory behind);
- nothing allocated in proportion to a size the remote claims (forged sizes are >= 4 GiB;
  the process's peak virtual memory may not grow by 1 GiB);
- the local repository passes `fsck` afterwards.

A test module subclasses `HostileRemote` and provides the `remote` fixture of
`vrl.testing.remote_conformance` (a fresh, empty remote). The number of examples per
backend is `VRL_HOSTILE_EXAMPLES` (default 30); `test_hostile_remote_long` (marked slow)
runs 10 times more. Counts of trials and outcomes go to `TRIALS`.

The default test draws the same examples on every run (`derandomize`), so a failure in CI
is a failure on replay too; the long test, or `VRL_HOSTILE_RANDOM=1`, draws new examples
each run (new ground), and a failure prints the blob that replays it
(`@reproduce_failure`). Every example starts from the same pristine remote: an attack's
changes, directories included, are undone after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from vrl import pack
from vrl.errors import VrlError
from vrl.objects import (
    HEADER_SIZE,
    ITEMSIZE,
    ObjectId,
    header,
)
from vrl.remote import add_remote, clone, fetch, fetching, open_named, pull, push
from vrl.remote.base import PACK_PREFIX, KeyMissing, RemoteStore, object_key
from vrl.remote.local import LocalRemote
from vrl.remote.stores import FsspecRemote, S3Remote
from vrl.repo import Repo
from vrl.testing.remote_conformance import RemoteCase

BOMB = 1 << 32  # every forged size claim is at least this (4 GiB)
MEMORY_SLACK = 1 << 30
# The default run draws the same examples every time (a CI failure can be replayed); set
# VRL_HOSTILE_RANDOM=1 (or run test_hostile_remote_long) to draw new ones.
RANDOM = os.environ.get("VRL_HOSTILE_RANDOM", "") not in ("", "0")
TRIALS: dict[str, Counter] = {}  # backend -> outcome counts (read by the test session)

# ------------------------------------------------------------------------------ the remote


@dataclass
class Known:
    """The ids of the pristine history on the remote, by role."""

    commits: list[ObjectId]  # c0 .. c3 (the local clone has c0, c1)
    manifests: list[ObjectId]
    new_tensors: list[ObjectId]  # only in c2 / c3
    old_tensors: list[ObjectId]
    sizes: dict[ObjectId, int]  # tensor payload sizes
    empty: ObjectId  # a zero-byte tensor: the base of a size bomb


@dataclass
class Attack:
    """Changes to a remote, undone by `restore` so one pristine remote serves every
    example."""

    store: RemoteStore
    known: Known
    outside: Path  # a private file outside every repository
    notes: list[str] = field(default_factory=list)
    _saved: dict[str, bytes | None] = field(default_factory=dict)
    _links: list[Path] = field(default_factory=list)
    _dirs: set[str] = field(default_factory=set)  # the pristine remote's directories

    def __post_init__(self) -> None:
        self._dirs = _directories(self.store)

    def _save(self, key: str) -> bool:
        """Remember `key`'s bytes before its first change; True if this call did."""
        if key in self._saved:
            return False
        try:
            self._saved[key] = self.store.get(key)
        except KeyMissing:
            self._saved[key] = None
        return True

    def _change(self, key: str, change: Callable[[], None]) -> None:
        first = self._save(key)
        try:
            change()
        except BaseException:
            # A write that failed left the key as it was: nothing to put back. Restoring it
            # anyway broke the suite on SFTP: a ref named `refs/heads/://` makes the write
            # create the directory `refs/heads/:` and fail, and deleting the "absent" key
            # then failed with "Is a directory" (once in ~12 runs, as Hypothesis'
            # FlakyFailure: on replay the directory was there already).
            if first and self._unchanged(key):
                del self._saved[key]
            raise

    def _unchanged(self, key: str) -> bool:
        try:
            return self.store.get(key) == self._saved[key]
        except KeyMissing:
            return self._saved[key] is None
        except (VrlError, OSError):
            return True  # no key can be read there (a directory): nothing to put back

    def put(self, key: str, data: bytes) -> None:
        self._change(key, lambda: self.store.put(key, data))

    def delete(self, key: str) -> None:
        self._change(key, lambda: self.store.delete(key))

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def forge(self, kind: str, payload: bytes, claimed: int | None = None) -> ObjectId:
        """Store an object with a valid hash (its header may lie about the size)."""
        raw = (header(kind, claimed) if claimed is not None else header(kind, len(payload))) \
            + payload
        oid = ObjectId(blake3.blake3(raw).hexdigest())
        self.put(object_key(oid), raw)
        return oid

    def forge_commit(self, manifest: str, parents: list[str], **fields: Any) -> ObjectId:
        data = {"format": 1, "manifest": manifest, "parents": parents, "message": "forged",
                "author": "mallory", "time": "2026-01-01T00:00:00.000000Z", "hparams": {},
                "metrics": {}, "env": {}, "step": None, "stats": {}, "meta": {}}
        data.update(fields)
        return self.forge("commit", _json(data))

    def symlink(self, key: str, target: Path) -> bool:
        """Make `key` a link to `target` (file-system remotes only)."""
        if not isinstance(self.store, LocalRemote):
            return False
        path = self.store.root / key
        self._save(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        os.symlink(target, path)
        self._links.append(path)
        return True

    def restore(self) -> None:
        """Put the remote back as it was, directories included: every example starts from
        the same remote, so Hypothesis can replay and shrink a failure."""
        for path in self._links:
            path.unlink(missing_ok=True)
        for key, data in self._saved.items():
            if data is None:
                self.store.delete(key)
            else:
                self.store.put(key, data)
        self._saved.clear()
        self._links.clear()
        for extra in sorted(_directories(self.store) - self._dirs, key=len, reverse=True):
            _remove_directory(self.store, extra)


def _directories(store: RemoteStore) -> set[str]:
    """The directories of a file-system remote (writes leave them, even failed ones)."""
    if isinstance(store, LocalRemote):
        return {folder for folder, _, _ in os.walk(store.root)}
    if isinstance(store, FsspecRemote) and not isinstance(store, S3Remote):
        found = store.fs.find(store.root, withdirs=True, detail=True)
        return {name for name, info in found.items() if info.get("type") == "directory"}
    return set()  # object stores have no directories


def _remove_directory(store: RemoteStore, path: str) -> None:
    with contextlib.suppress(Exception):  # not empty (not ours), or gone already
        if isinstance(store, LocalRemote):
            os.rmdir(path)
        else:
            store.fs.rmdir(path)  # type: ignore[attr-defined]


def _unpack(store: RemoteStore) -> None:
    """Rewrite the remote's packs as loose objects, each as a pack holds it: these attacks
    edit loose objects (attacks on packs: tests/remote/test_hostile_packs.py)."""
    try:
        for key in store.list(PACK_PREFIX):
            data = store.get(key)
            span = pack.index_span(data[-pack.TRAILER.size:], len(data), key)
            for oid, (offset, length) in pack.parse_tail(data[-span:], len(data), key).items():
                store.put(object_key(oid), data[offset:offset + length])
            store.delete(key)
    finally:
        store.close()


class Deep:
    """JSON nested `depth` levels deep (too deep for Python's json module to write)."""

    def __init__(self, depth: int) -> None:
        self.depth = depth


def _json(value: Any) -> bytes:
    deep: list[Deep] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, Deep):
            deep.append(obj)
            return f"__deep{len(deep) - 1}__"
        return str(obj)

    text = json.dumps(value, default=default, sort_keys=True, separators=(",", ":"))
    for i, d in enumerate(deep):
        text = text.replace(f'"__deep{i}__"', '{"a":' * d.depth + "1" + "}" * d.depth)
    return text.encode()


# ------------------------------------------------------------------------------ attacks
# Each strategy draws a function that applies one attack to an Attack context.

Apply = Callable[[Attack], None]
HOSTILE_TEXT = st.text(st.sampled_from("ab/.\\-_~\x00\x07\x1b[]\n\r\t\u202e\x9bé ;:@"),
                       min_size=0, max_size=40)


def _pick(kind: str) -> st.SearchStrategy[Callable[[Known], ObjectId]]:
    roles = {
        "commit": [lambda k: k.commits[2], lambda k: k.commits[3], lambda k: k.commits[0]],
        "manifest": [lambda k: k.manifests[2], lambda k: k.manifests[3]],
        "tensor": [lambda k: k.new_tensors[0], lambda k: k.new_tensors[-1],
                   lambda k: k.old_tensors[0], lambda k: k.empty],
    }
    return st.sampled_from(roles[kind])


@st.composite
def damaged_object(draw: st.DrawFn) -> Apply:
    """Bytes of a real object flipped, truncated, extended, emptied, swapped or deleted."""
    target = draw(st.one_of(_pick("commit"), _pick("manifest"), _pick("tensor")))
    other = draw(st.one_of(_pick("commit"), _pick("manifest"), _pick("tensor")))
    mode = draw(st.sampled_from(["flip", "truncate", "extend", "empty", "swap", "delete",
                                 "header"]))
    where = draw(st.integers(0, 1 << 20))

    def apply(a: Attack) -> None:
        oid = target(a.known)
        key = object_key(oid)
        raw = bytearray(a.get(key))
        if mode == "flip":
            raw[where % len(raw)] ^= 1 << (where % 8)
        elif mode == "truncate":
            del raw[where % len(raw):]
        elif mode == "extend":
            raw += b"\0" * (1 + where % 4096)
        elif mode == "empty":
            raw = bytearray()
        elif mode == "swap":
            raw = bytearray(a.get(object_key(other(a.known))))
        elif mode == "header":  # a header claiming a huge payload
            kind = raw[5:HEADER_SIZE].split()[0].decode()
            raw[:HEADER_SIZE] = header(kind, BOMB + where)
        if mode == "delete":
            a.delete(key)
        else:
            a.put(key, bytes(raw))
        a.notes.append(f"{mode} {oid[:8]} at {where}")

    return apply


@st.composite
def forged_manifest(draw: st.DrawFn) -> Apply:
    """A manifest (valid hash) whose entries lie: bomb shapes, wrong sizes, ids of other
    kinds or of nothing, traversal or control-character names, broken ties."""
    entries = []
    for _ in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from([*ITEMSIZE, "numpy:<f8", "numpy:O", "float99", "", 7]))
        shape = draw(st.one_of(
            st.lists(st.integers(0, 1 << 34), max_size=4),
            st.just([1 << 30]), st.just([-1]), st.just("x"), st.just([True]),
            st.lists(st.just(1), min_size=65, max_size=70)))
        nbytes = draw(st.one_of(st.integers(0, 64), st.integers(BOMB, 1 << 50),
                                st.just(-8), st.just("16")))
        ident = draw(st.one_of(_pick("tensor"), _pick("commit"), _pick("manifest"),
                               st.just(lambda k: "f" * 64), st.just(lambda k: "../../etc/pw"),
                               st.just(lambda k: "")))
        name = draw(st.one_of(HOSTILE_TEXT, st.just("../../outside"), st.just("/etc/passwd")))
        tie = draw(st.one_of(st.none(), HOSTILE_TEXT, st.just(7)))
        entries.append((name, dtype, shape, nbytes, ident, tie))
    tree = draw(st.one_of(st.just({"$t": entries[0][0]}), st.just({"$zz": 1}),
                          st.just(Deep(5000))))
    as_branch = draw(st.booleans())

    def apply(a: Attack) -> None:
        tensors = {}
        for name, dtype, shape, nbytes, ident, tie in entries:
            entry = {"id": ident(a.known), "dtype": dtype, "shape": shape, "nbytes": nbytes}
            if tie is not None:
                entry["tie"] = tie
            tensors[name] = entry
        mid = a.forge("manifest", _json({"format": 1, "tensors": tensors, "tree": tree}))
        cid = a.forge_commit(mid, [a.known.commits[3]])
        _point(a, "refs/heads/evil" if as_branch else "refs/heads/main", cid)
        a.notes.append(f"manifest {tensors}"[:300])

    return apply


@st.composite
def forged_commit(draw: st.DrawFn) -> Apply:
    """A commit (valid hash) naming the wrong kinds or nothing, with hostile fields,
    deep nesting, a huge message, or a parent chain that loops back through a damaged
    object."""
    manifest = draw(st.one_of(_pick("manifest"), _pick("commit"), _pick("tensor"),
                              st.just(lambda k: "e" * 64), st.just(lambda k: "../x"),
                              st.just(lambda k: 5)))
    parents = draw(st.lists(st.one_of(_pick("commit"), _pick("tensor"), _pick("manifest"),
                                      st.just(lambda k: "d" * 64), st.just(lambda k: None)),
                            max_size=3))
    fields_ = draw(st.fixed_dictionaries({}, optional={
        "message": st.one_of(HOSTILE_TEXT, st.integers(), st.lists(st.integers(), max_size=2),
                             st.just("m" * (1 << 17))),
        "author": st.one_of(HOSTILE_TEXT, st.none(), st.just({"a": 1})),
        "time": st.one_of(HOSTILE_TEXT, st.just([1, 2])),
        "hparams": st.one_of(st.just(Deep(3000)), st.dictionaries(HOSTILE_TEXT,
                                                                     st.integers())),
        "step": st.one_of(st.integers(-1 << 70, 1 << 70), st.just("x")),
        "meta": st.one_of(st.just({"pruned": True}), st.just([1])),
    }))
    cycle = draw(st.booleans())
    target = draw(st.sampled_from(["refs/heads/main", "refs/heads/evil", "refs/tags/t"]))

    def apply(a: Attack) -> None:
        ps = [p(a.known) for p in parents]
        cid = a.forge_commit(manifest(a.known), ps, **fields_)
        if cycle:  # the parent's key now holds its child: a loop, if bytes were trusted
            a.put(object_key(a.known.commits[3]), a.get(object_key(cid)))
            cid = a.forge_commit(a.known.manifests[3], [a.known.commits[3]])
        _point(a, target, cid)
        a.notes.append(f"commit manifest={manifest(a.known)!r:.20} parents={ps} "
                       f"fields={sorted(fields_)} cycle={cycle} -> {target}")

    return apply


@st.composite
def damaged_ref(draw: st.DrawFn) -> Apply:
    """A remote ref (or HEAD) with garbage, a huge body, the id of a non-commit or of
    nothing, an invalid or control-character name, or a link to a private local file."""
    name = draw(st.one_of(
        st.sampled_from(["refs/heads/main", "refs/heads/new", "refs/tags/v1", "HEAD"]),
        st.builds(lambda t: f"refs/heads/{t}", HOSTILE_TEXT.filter(lambda t: t.strip("/."))),
        st.just("refs/heads/" + "n" * 300)))
    body = draw(st.one_of(
        st.binary(max_size=80), st.just(b"ref: refs/heads/../../../etc\n"),
        st.just(b"Z" * 5_000_000), st.sampled_from(["tensor", "manifest", "missing", "link"])))
    return ref_attack(name, body)


def ref_attack(name: str, body: bytes | str) -> Apply:
    """Write `body` (bytes, or "tensor" / "manifest" / "missing" / "link") as ref `name`."""

    def apply(a: Attack) -> None:
        if body == "link":
            if not a.symlink(name, a.outside):
                return
        elif isinstance(body, str):
            oid = {"tensor": a.known.new_tensors[0], "manifest": a.known.manifests[3],
                   "missing": "c" * 64}[body]
            _point(a, name, oid)
        else:
            with contextlib.suppress(VrlError, OSError):  # names the backend refuses
                a.put(name, body)
        a.notes.append(f"ref {name[:60]!r} <- {body if isinstance(body, str) else body[:40]!r}")

    return apply


def _point(a: Attack, ref: str, oid: str) -> None:
    a.put(ref, f"{oid}\n".encode())


ATTACKS = st.one_of(damaged_object(), forged_manifest(), forged_commit(), damaged_ref())


def size_bomb(a: Attack) -> None:
    """A decompression-style bomb, always tried: an empty tensor named as 4 GiB of float32."""
    tensors = {"w": {"id": a.known.empty, "dtype": "float32", "shape": [1 << 30],
                     "nbytes": 0}}
    mid = a.forge("manifest", _json({"format": 1, "tensors": tensors, "tree": {"$t": "w"}}))
    _point(a, "refs/heads/main", a.forge_commit(mid, [a.known.commits[3]]))
    a.notes.append("size bomb")


@contextlib.contextmanager
def _file_size_limit(limit: int) -> Iterator[None]:
    """A regression must fail the suite, not fill the disk: files over `limit` bytes
    cannot be written (EFBIG) while the trials run."""
    try:
        import resource
        import signal
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


# ------------------------------------------------------------------------------ checks


def _vm_peak() -> int:
    """Peak virtual memory of this process (bytes), or 0 where /proc is not there."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmPeak:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _files(root: Path, skip: tuple[Path, ...]) -> dict[str, tuple[int, int]]:
    out = {}
    for folder, dirs, files in os.walk(root):
        if any(Path(folder) == s or s in Path(folder).parents for s in skip):
            dirs[:] = []
            continue
        for name in files:
            p = Path(folder, name)
            with contextlib.suppress(OSError):
                st_ = p.lstat()
                out[str(p)] = (st_.st_size, st_.st_mtime_ns)
    return out


def _clean(what: str, op: Callable[[], Any], outcomes: Counter) -> bool:
    """Run one operation: it works, or raises a one-line VrlError. True if it worked."""
    try:
        op()
    except VrlError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 2000, f"{what}: {text[:300]!r}"
        outcomes[f"{what} refused"] += 1
        return False
    outcomes[f"{what} ok"] += 1
    return True


def _fsck_ok(path: Path, what: str) -> None:
    report = Repo(path).fsck()
    assert report["ok"], f"{what}: fsck after a hostile transfer: {report['problems'][:3]}"


# ------------------------------------------------------------------------------ the suite

# Every trial clones (then checks out and exports); besides, a slow network backend runs
# one of the other operations per trial, a fast one all of them.
OPS = frozenset({"lazy", "fetch", "pull"})
OP_SETS = st.sampled_from([frozenset({"lazy"}), frozenset({"fetch"}), frozenset({"pull"}),
                           OPS])


class HostileRemote:
    """Hypothesis-generated hostile remotes against clone, fetch, pull, checkout, export."""

    examples = int(os.environ.get("VRL_HOSTILE_EXAMPLES", "30"))

    @pytest.fixture
    def remote(self) -> RemoteCase:  # pragma: no cover - each backend provides it
        raise NotImplementedError

    @contextlib.contextmanager
    def _world(self, tmp: Path, remote: RemoteCase) -> Iterator[tuple[Attack, Path]]:
        """A pristine remote with four commits, and a clone that has the first two."""
        import torch

        src = Repo.init(tmp / "src")
        add_remote(src, "origin", remote.url, remote.options, create=True)
        state = {"a": torch.arange(16, dtype=torch.float32).reshape(4, 4),
                 "b": torch.arange(3), "c": torch.ones(2, 2, dtype=torch.bfloat16)}
        commits = []
        for i in range(4):
            state = {**state, "a": state["a"] + 1, "b": state["b"] * (i + 2)}
            if i == 3:
                state["d"] = torch.full((5,), 3.0)
                state["e"] = torch.zeros(0)
            commits.append(src.commit(state, message=f"c{i}", env=False, step=i))
            if i == 1:
                push(src, open_named(src, "origin"), "origin")
                _unpack(open_named(src, "origin"))
                clone(remote.url, tmp / "dst", options=remote.options)
        src.tag("v1", commits[1])
        push(src, open_named(src, "origin"), "origin", tags=True)
        _unpack(open_named(src, "origin"))
        manifests = [src.read_commit(c).manifest for c in commits]
        tensors = [{e.id: e.nbytes for e in src.read_manifest(m).tensors.values()}
                   for m in manifests]
        old = set(tensors[0]) | set(tensors[1])
        new = sorted((set(tensors[2]) | set(tensors[3])) - old)
        empty = src.read_manifest(manifests[3]).tensors["e"].id
        known = Known(commits, manifests, new, sorted(old),
                      {k: v for t in tensors for k, v in t.items()}, empty)
        outside = tmp / "private" / "id_rsa"
        outside.parent.mkdir()
        outside.write_text("-----BEGIN PRIVATE KEY----- TOPSECRET\n")
        store = open_named(src, "origin")
        try:
            yield Attack(store, known, outside), tmp / "dst"
        finally:
            store.close()

    def _trial(self, tmp: Path, remote: RemoteCase, attack: Attack, apply: Apply,
               dst_template: Path, outcomes: Counter, ops: frozenset[str] = OPS) -> None:
        try:
            self._trial_once(tmp, remote, attack, apply, dst_template, outcomes, ops)
        except AssertionError as exc:
            outcomes["failures"] += 1
            raise AssertionError(f"{exc} [attack: {'; '.join(attack.notes)[:600]}]") from None
        except Exception as exc:  # a crash of the suite itself: say which attack, too
            outcomes["failures"] += 1
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"[attack: {'; '.join(attack.notes)[:600]}]")
            raise
        finally:
            attack.notes.clear()

    def _trial_once(self, tmp: Path, remote: RemoteCase, attack: Attack, apply: Apply,
                    dst_template: Path, outcomes: Counter, ops: frozenset[str]) -> None:
        work = tmp / f"w-{uuid.uuid4().hex[:8]}"
        work.mkdir()
        skip = (work, tmp / "src") + ((Path(attack.store.root),)
                                      if isinstance(attack.store, LocalRemote) else ())
        before = _files(tmp, skip)
        peak = _vm_peak()
        try:
            try:
                apply(attack)
            except (VrlError, OSError, ValueError):  # the backend would not store it
                outcomes["attack not storable"] += 1
                return
            # a fresh full clone, then checkout (workspace) and export of every branch tip
            full = work / "full"
            if _clean("clone", lambda: clone(remote.url, full, options=remote.options),
                      outcomes):
                repo = Repo(full)
                for oid in dict.fromkeys(repo.refs.list().values()):
                    _clean("checkout", lambda o=oid: repo.write_workspace(o), outcomes)
                    _clean("export", lambda o=oid: repo.write_workspace(
                        o, work / "export.safetensors"), outcomes)
                _fsck_ok(full, "clone")
            else:
                assert not full.exists(), "a failed clone left its directory behind"
            # a metadata-only clone, whose tensors arrive on demand
            lazy = work / "lazy"
            if "lazy" not in ops:
                pass
            elif _clean("lazy clone", lambda: clone(remote.url, lazy, options=remote.options,
                                                  metadata_only=True), outcomes):
                repo = Repo(lazy)
                for oid in dict.fromkeys(repo.refs.list().values()):
                    _clean("lazy load", lambda o=oid: repo.load(o), outcomes)
                _fsck_ok(lazy, "lazy clone")
            else:
                assert not lazy.exists(), "a failed clone left its directory behind"
            # fetch and pull into an existing clone
            old = work / "old"
            shutil.copytree(dst_template, old, symlinks=True)
            repo = Repo(old)
            refs = repo.refs.list()

            def fetch_once() -> None:
                store = open_named(repo, "origin")
                try:
                    fetch(repo, store, "origin")
                finally:
                    store.close()

            if "fetch" in ops:
                if not _clean("fetch", fetch_once, outcomes):
                    assert repo.refs.list() == refs, "a failed fetch moved refs"
                _fsck_ok(old, "fetch")

            def pull_once() -> None:
                store = open_named(repo, "origin")
                try:
                    pull(repo, store, "origin")
                finally:
                    store.close()

            if "pull" in ops:
                branches = repo.refs.list("refs/heads/")
                if not _clean("pull", pull_once, outcomes):  # its fetch may have worked
                    assert repo.refs.list("refs/heads/") == branches, \
                        "a failed pull moved a branch"
                _fsck_ok(old, "pull")
        finally:
            attack.restore()
        grown = _vm_peak() - peak
        assert grown < MEMORY_SLACK, f"peak memory grew by {grown >> 20} MiB"
        assert _files(tmp, skip) == before, "files outside the repositories changed"
        shutil.rmtree(work, ignore_errors=True)

    def _run(self, tmp: Path, remote: RemoteCase, examples: int, randomised: bool) -> None:
        name = type(self).__name__
        outcomes = TRIALS.setdefault(name, Counter())
        with contextlib.ExitStack() as stack:
            mp = stack.enter_context(pytest.MonkeyPatch.context())
            # small caps, so oversized metadata is cheap to forge on every backend
            mp.setattr(fetching, "MAX_COMMIT_BYTES", 1 << 16)
            mp.setattr(fetching, "MAX_MANIFEST_BYTES", 1 << 16)
            attack, dst = stack.enter_context(self._world(tmp, remote))
            dry = Counter()
            self._trial(tmp, remote, attack, lambda a: None, dst, dry)  # untouched: all ok
            assert not any(k.endswith("refused") for k in dry), dry

            stack.enter_context(_file_size_limit(64 << 20))

            @settings(max_examples=examples, deadline=None, derandomize=not randomised,
                      print_blob=True, suppress_health_check=list(HealthCheck),
                      database=None)
            @given(apply=ATTACKS, ops=OP_SETS)
            @example(apply=size_bomb, ops=OPS)
            # the ref name that once broke the suite on SFTP (see Attack._change)
            @example(apply=ref_attack("refs/heads/://", b"x"), ops=frozenset({"fetch"}))
            def trial(apply: Apply, ops: frozenset[str]) -> None:
                outcomes["trials"] += 1
                self._trial(tmp, remote, attack, apply, dst, outcomes, ops)

            trial()

    def test_hostile_remote(self, tmp_path: Path, remote: RemoteCase) -> None:
        self._run(tmp_path, remote, self.examples, RANDOM)

    @pytest.mark.slow
    def test_hostile_remote_long(self, tmp_path: Path, remote: RemoteCase) -> None:
        self._run(tmp_path, remote, self.examples * 10, randomised=True)


__all__ = ["ATTACKS", "Attack", "HostileRemote", "TRIALS"]
