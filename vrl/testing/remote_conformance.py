"""The conformance suite every remote backend runs (local, memory, S3, SSH, ...).

A test module subclasses `RemoteConformance` and provides a `remote` fixture returning a
`RemoteCase`: how to reach a fresh, empty remote of that backend. Needs torch and pytest.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from vrl.errors import CorruptObjectError, PrunedError, RefConflictError, VrlError
from vrl.objects import HEADER_SIZE, ObjectId
from vrl.remote import add_remote, clone, fetch, open_named, pull, push
from vrl.remote.base import KeyMissing, RemoteStore, object_key
from vrl.remote.errors import NonFastForwardError, RemoteError
from vrl.repo import Repo


@dataclass
class RemoteCase:
    """A fresh remote: its URL, backend options, and what the backend allows in tests."""

    url: str
    options: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # for pusher subprocesses
    multiprocess: bool = True  # other processes see the same remote (not memory://)
    kill_server: Callable[[], None] | None = None  # really take the endpoint down ...
    restart_server: Callable[[], None] | None = None  # ... and bring it back, state kept


def memory_case() -> RemoteCase:
    """A fresh in-process memory:// remote."""
    import uuid

    return RemoteCase(f"memory://vrl-{uuid.uuid4().hex}/repo", multiprocess=False)


def s3_case(server: Any) -> RemoteCase:
    """A fresh bucket on the test S3 server (vrl.testing.servers.s3_server)."""
    import uuid

    import boto3

    bucket = f"vrl-{uuid.uuid4().hex[:12]}"
    endpoint = f"http://127.0.0.1:{server.port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return RemoteCase(f"s3://{bucket}/team/repo", {"endpoint_url": endpoint})


def gcs_case(server: Any) -> RemoteCase:
    """A fresh bucket on the test GCS emulator (vrl.testing.servers.gcs_server)."""
    import uuid

    from gcsfs.core import GCSFileSystem

    bucket = f"vrl-{uuid.uuid4().hex[:12]}"
    endpoint = f"http://127.0.0.1:{server.port}"
    GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True).mkdir(bucket)
    return RemoteCase(f"gs://{bucket}/team/repo", {"endpoint_url": endpoint, "anon": "true"})


def azure_case(server: Any) -> RemoteCase:
    """A fresh container on the test Azurite (vrl.testing.servers.azurite_server); the
    development key is in AZURE_STORAGE_ACCOUNT_KEY (tests/remote/conftest.py)."""
    import uuid

    from adlfs import AzureBlobFileSystem

    from vrl.testing.servers import AZURITE_ACCOUNT, AZURITE_KEY, azurite_endpoint

    container = f"vrl-{uuid.uuid4().hex[:12]}"
    endpoint = azurite_endpoint(server)
    fs = AzureBlobFileSystem(skip_instance_cache=True, connection_string=(
        f"BlobEndpoint={endpoint};AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"))
    fs.mkdir(container)
    return RemoteCase(f"az://{container}/team/repo", {"endpoint_url": endpoint},
                      {"AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY})


def ssh_case(setup: Any, **extra: Any) -> RemoteCase:
    """A fresh directory on the test SFTP server (vrl.testing.servers.sftp_server)."""
    import uuid

    return RemoteCase(f"ssh://tester@127.0.0.1:{setup.server.port}/{uuid.uuid4().hex}/repo",
                      setup.options(), **extra)


class FailingStore(RemoteStore):
    """Wraps a store; after `after` object uploads it fails (or calls `on_fail`) - a cut
    connection or a server that died mid-push."""

    def __init__(self, inner: RemoteStore, after: int,
                 on_fail: Callable[[], None] | None = None) -> None:
        self.inner, self.after, self.on_fail = inner, after, on_fail
        self.url, self.guarantee = inner.url, inner.guarantee
        self.puts = 0
        self.lock = threading.Lock()

    def _tick(self) -> None:
        with self.lock:
            self.puts += 1
            n = self.puts
        if n > self.after:
            if self.on_fail is not None and n == self.after + 1:
                self.on_fail()
            if self.on_fail is None:
                raise RemoteError(f"{self.url}: connection lost (injected)")

    def get(self, key: str) -> bytes:
        return self.inner.get(key)

    def put(self, key: str, data: bytes) -> None:
        self._tick()
        self.inner.put(key, data)

    def put_file(self, key: str, local: Path) -> None:
        self._tick()
        self.inner.put_file(key, local)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(key, start, end)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def list(self, prefix: str) -> list[str]:
        return self.inner.list(prefix)

    def list_sizes(self, prefix: str) -> dict[str, int]:
        return self.inner.list_sizes(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def read_versioned(self, key: str) -> tuple[bytes | None, Any]:
        return self.inner.read_versioned(key)

    def swap(self, key: str, data: bytes, expected: Any) -> None:
        self._tick()
        self.inner.swap(key, data, expected)


# ------------------------------------------------------------------------------ helpers


def make_history(repo: Repo, commits: int = 3, seed: int = 0, width: int = 64) -> list[ObjectId]:
    """Commits of a small policy + optimizer where one layer changes per commit."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, width), torch.nn.Tanh(),
                                torch.nn.Linear(width, 4))
    extra = {"steps": torch.arange(5, dtype=torch.int64), "mask": torch.tensor([True, False]),
             "half": torch.randn(3, 3).to(torch.bfloat16), "scalar": torch.tensor(2.5)}
    ids = []
    for i in range(commits):
        with torch.no_grad():
            layer = model[2 * (i % 3)]
            layer.weight.add_(0.01 * (i + 1 + seed))
        state = {"model": model.state_dict(), "extra": extra, "step": i}
        ids.append(repo.commit(state, message=f"commit {i} seed {seed}", step=i, env=False,
                               metrics={"return": float(i)}))
    return ids


def make_big_history(repo: Repo, commits: int = 4) -> list[ObjectId]:
    """Commits where two of the tensors are big (sent loose) and one is small (packed):
    each commit changes one big tensor and the small one (4 commits: 5 big tensors)."""
    import torch

    gen = torch.Generator().manual_seed(1)
    big = 300_000  # 1.2 MB: over the remote pack threshold
    state = {"big0": torch.randn(big, generator=gen), "big1": torch.randn(big, generator=gen),
             "small": torch.randn(100, generator=gen)}
    ids = []
    for i in range(commits):
        state = {**state, f"big{i % 2}": state[f"big{i % 2}"] + 1, "small": state["small"] + 1}
        ids.append(repo.commit(state, message=f"big {i}", step=i, env=False))
    return ids


def remote_object(store: RemoteStore, oid: ObjectId) -> tuple[str, int, int]:
    """Where the remote keeps `oid`: (key, offset, length) in a pack, else its loose key."""
    from vrl.remote.packs import RemotePacks

    where = RemotePacks(store).load().where(oid)
    if where is not None:
        return where
    return object_key(oid), 0, len(store.get(object_key(oid)))


def flip_remote_byte(store: RemoteStore, oid: ObjectId, at: int, mask: int = 0xFF) -> None:
    """Damage one byte (`at`: an index into the object's bytes, negative from its end) of
    an object on a remote, wherever it is kept (in a pack, the pack's index stays valid:
    only the object's hash check can notice)."""
    key, offset, length = remote_object(store, oid)
    data = bytearray(store.get(key))
    data[offset + (at % length)] ^= mask
    store.put(key, bytes(data))


def object_files(repo: Repo) -> dict[str, bytes]:
    return {oid: repo.objects.read_raw(oid) for oid in repo.objects.ids()}


def assert_bit_exact(a: Repo, b: Repo, rev: str = "HEAD") -> None:
    """Same commit, and every tensor of its snapshot has the same dtype, shape and bytes."""
    import torch

    oid = a.resolve(rev)
    assert b.resolve(oid) == oid
    ma = a.read_manifest(a.read_commit(oid).manifest)
    mb = b.read_manifest(b.read_commit(oid).manifest)
    assert ma == mb
    for name, entry in ma.tensors.items():
        ta, tb = a.load_entry(entry), b.load_entry(entry)
        assert ta.dtype == tb.dtype and ta.shape == tb.shape, name
        assert torch.equal(ta.reshape(-1).view(torch.uint8), tb.reshape(-1).view(torch.uint8))
        assert b.objects.read_raw(entry.id) == a.objects.read_raw(entry.id)


_PUSHER = """
import json, sys, time
from pathlib import Path
from vrl.repo import Repo
from vrl.remote import open_named, push
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
repo = Repo(sys.argv[1])
store = open_named(repo, "origin")
try:
    push(repo, store, "origin")
    print(json.dumps({"ok": True}))
except Exception as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__, "msg": str(exc)}))
"""


class RemoteConformance:
    """Round trips, incremental pushes, fast-forward rules, races, interruption, integrity
    and lazy tensors: what every remote must get right."""

    @pytest.fixture
    def remote(self) -> RemoteCase:  # pragma: no cover - each backend provides it
        raise NotImplementedError

    def repo_with_remote(self, path: Path, remote: RemoteCase) -> Repo:
        repo = Repo.init(path)
        add_remote(repo, "origin", remote.url, remote.options, create=True)
        return repo

    def store(self, repo: Repo) -> RemoteStore:
        return open_named(repo, "origin")

    # -------------------------------------------------------------- round trips
    def test_push_clone_round_trip_bit_exact(self, tmp_path: Path, remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        ids = make_history(src, 3)
        src.tag("v1", ids[0])
        result = push(src, self.store(src), "origin", tags=True)
        assert {u.status for u in result.updates} == {"new"}
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        assert dst.fsck()["ok"]
        assert dst.current_branch() == "main" and dst.head() == ids[-1]
        assert dst.tags() == {"v1": ids[0]}
        assert dst.workspace_path.exists()
        for oid in ids:
            assert_bit_exact(src, dst, oid)
        assert [e.id for e in dst.log()] == [e.id for e in src.log()]

    def test_fetch_and_pull_fast_forward(self, tmp_path: Path, remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_history(src, 2)
        push(src, self.store(src), "origin")
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        new = make_history(src, 2, seed=1)
        push(src, self.store(src), "origin")
        result = fetch(dst, self.store(dst), "origin")
        assert dst.refs.read("refs/remotes/origin/main") == new[-1]
        assert result.objects["commit"] == 2
        assert dst.head() != new[-1]
        update, _ = pull(dst, self.store(dst), "origin")
        assert update.status == "fast-forward" and dst.head() == new[-1]
        assert_bit_exact(src, dst)
        update, _ = pull(dst, self.store(dst), "origin")
        assert update.status == "up-to-date"

    def test_second_push_sends_no_tensors(self, tmp_path: Path, remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_history(src, 3)
        store = self.store(src)
        first = push(src, store, "origin")
        assert first.objects["tensor"] > 0
        again = push(src, store, "origin")
        assert again.objects == {"tensor": 0, "manifest": 0, "commit": 0}
        assert again.updates[0].status == "up-to-date"
        make_history(src, 1, seed=5)  # one commit where one layer changed (+ its bias)
        step = push(src, store, "origin")
        head = src.read_manifest(src.read_commit(src.head()).manifest)
        parent = src.read_manifest(src.read_commit(src.resolve("HEAD^")).manifest)
        new_tensors = {e.id for e in head.tensors.values()} - \
            {e.id for e in parent.tensors.values()}
        assert step.objects == {"tensor": len(new_tensors), "manifest": 1, "commit": 1}

    # -------------------------------------------------------------- fast-forward rules
    def test_diverged_push_refused_naming_both_heads(self, tmp_path: Path,
                                                     remote: RemoteCase) -> None:
        a = self.repo_with_remote(tmp_path / "a", remote)
        make_history(a, 1)
        push(a, self.store(a), "origin")
        b = clone(remote.url, tmp_path / "b", options=remote.options)
        ours = make_history(a, 1, seed=1)[-1]
        theirs = make_history(b, 1, seed=2)[-1]
        push(b, self.store(b), "origin")
        with pytest.raises(NonFastForwardError) as err:
            push(a, self.store(a), "origin")
        assert ours[:12] in str(err.value) and theirs[:12] in str(err.value)
        assert self.store(a).read_ref("refs/heads/main")[0] == theirs
        fetch(a, self.store(a), "origin")
        with pytest.raises(NonFastForwardError, match="diverged"):
            pull(a, self.store(a), "origin")
        forced = push(a, self.store(a), "origin", force=True)
        assert forced.updates[0].status == "forced"
        assert self.store(a).read_ref("refs/heads/main")[0] == ours

    def test_racing_pushers_exactly_one_wins(self, tmp_path: Path, remote: RemoteCase) -> None:
        base = self.repo_with_remote(tmp_path / "base", remote)
        make_history(base, 1)
        push(base, self.store(base), "origin")
        racers = [clone(remote.url, tmp_path / f"r{i}", options=remote.options)
                  for i in range(2)]
        tips = [make_history(r, 2, seed=10 + i)[-1] for i, r in enumerate(racers)]
        go = tmp_path / "go"
        outcomes: list[dict[str, Any]] = []
        if remote.multiprocess:
            import os

            env = {**os.environ, **remote.env}
            procs = [subprocess.Popen([sys.executable, "-c", _PUSHER, str(r.workdir), str(go)],
                                      stdout=subprocess.PIPE, text=True, env=env)
                     for r in racers]
            time.sleep(0.5)  # both interpreters up and waiting
            go.touch()
            for p in procs:
                out, _ = p.communicate(timeout=120)
                outcomes.append(json.loads(out.strip().splitlines()[-1]))
        else:
            barrier = threading.Barrier(2)

            def run(r: Repo) -> None:
                store = self.store(r)
                barrier.wait()
                try:
                    push(r, store, "origin")
                    outcomes.append({"ok": True, "tip": r.head()})
                except VrlError as exc:
                    outcomes.append({"ok": False, "type": type(exc).__name__, "msg": str(exc)})

            threads = [threading.Thread(target=run, args=(r,)) for r in racers]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert sorted(o["ok"] for o in outcomes) == [False, True], outcomes
        loser = next(o for o in outcomes if not o["ok"])
        assert loser["type"] == "NonFastForwardError", loser
        final = self.store(base).read_ref("refs/heads/main")[0]
        assert final in tips
        # the winner's history is complete on the remote
        check = clone(remote.url, tmp_path / "check", options=remote.options)
        assert check.head() == final and check.fsck()["ok"]

    # -------------------------------------------------------------- interruption
    def test_interrupted_push_resumes_without_resending(self, tmp_path: Path,
                                                        remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_big_history(src, 4)  # 5 big tensors (loose), then one pack with the rest
        total = len(src.reachable(include_reflog=False))
        # cut after 3 of the big tensors; the rerun sends the 2 others, then is cut at the
        # pack; the third run sends only the pack
        store = self.store(src)
        for after in (3, 2):
            failing = FailingStore(store, after=after)
            with pytest.raises(RemoteError):
                push(src, failing, "origin", jobs=1)
            assert failing.puts == after + 1
            assert store.read_ref("refs/heads/main")[0] is None  # no ref to a partial history
            assert store.list_sizes("objects/pack/") == {}  # the pack is all or nothing
        assert len(store.list_sizes("objects/")) == 5
        done = push(src, store, "origin")
        assert sum(done.objects.values()) == total - 5
        assert done.objects == {"tensor": 4, "manifest": 4, "commit": 4}
        assert len(store.list_sizes("objects/pack/")) == 1
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        assert dst.fsck()["ok"] and dst.head() == src.head()

    def test_server_killed_mid_push_then_rerun_completes(self, tmp_path: Path,
                                                         remote: RemoteCase) -> None:
        if remote.kill_server is None or remote.restart_server is None:
            pytest.skip("this backend has no server to kill")
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_big_history(src, 4)
        failing = FailingStore(self.store(src), after=4, on_fail=remote.kill_server)
        start = time.monotonic()
        try:
            with pytest.raises(RemoteError):
                push(src, failing, "origin", jobs=1)
        finally:
            remote.restart_server()
        assert time.monotonic() - start < 60
        store = self.store(src)
        assert store.read_ref("refs/heads/main")[0] is None
        done = push(src, store, "origin")
        assert sum(done.objects.values()) < len(src.reachable(include_reflog=False))
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        assert dst.fsck()["ok"] and dst.head() == src.head()

    # -------------------------------------------------------------- integrity
    def test_corrupted_remote_object_detected_on_fetch(self, tmp_path: Path,
                                                        remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_history(src, 1)
        push(src, self.store(src), "origin")
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        make_history(src, 1, seed=3)
        push(src, self.store(src), "origin")
        head = src.read_manifest(src.read_commit(src.head()).manifest)
        parent = src.read_manifest(src.read_commit(src.resolve("HEAD^")).manifest)
        bad = sorted({e.id for e in head.tensors.values()} -
                     {e.id for e in parent.tensors.values()})[0]
        store = self.store(src)
        flip_remote_byte(store, bad, -1)
        before = set(dst.objects.ids())
        tracking = dst.refs.read("refs/remotes/origin/main")
        with pytest.raises(CorruptObjectError, match=bad):
            fetch(dst, self.store(dst), "origin")
        assert not dst.objects.has(bad)
        assert dst.refs.read("refs/remotes/origin/main") == tracking
        assert set(dst.objects.ids()) - before <= {e.id for e in head.tensors.values()}
        with pytest.raises(CorruptObjectError):
            clone(remote.url, tmp_path / "dst2", options=remote.options)
        assert not (tmp_path / "dst2").exists()

    # -------------------------------------------------------------- lazy tensors
    def test_metadata_only_clone_then_on_demand_checkout(self, tmp_path: Path,
                                                         remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        ids = make_history(src, 3)
        push(src, self.store(src), "origin")
        lazy = clone(remote.url, tmp_path / "lazy", options=remote.options,
                     metadata_only=True)
        kinds = {lazy.objects.kind_and_size(o)[0] for o in lazy.objects.ids()}
        assert kinds == {"commit", "manifest"}
        assert [e.id for e in lazy.log()] == [e.id for e in src.log()]
        assert lazy.diff(ids[-1]).to_json() == src.diff(ids[-1]).to_json()
        assert lazy.fsck()["ok"]
        assert not lazy.workspace_path.exists()
        state = lazy.load(ids[1])  # tensors arrive now
        assert state["step"] == 1
        assert_bit_exact(src, lazy, ids[1])
        reopened = Repo(lazy.workdir)
        reopened.checkout("main")
        reopened.write_workspace(ids[-1])
        assert_bit_exact(src, reopened, ids[-1])
        # without the remote, a missing tensor is a clear error, not a crash
        bare = Repo(lazy.workdir, fetch=False)
        with pytest.raises(PrunedError):
            bare.load(ids[0])

    def test_unknown_remote_ref_and_missing_objects(self, tmp_path: Path,
                                                    remote: RemoteCase) -> None:
        repo = self.repo_with_remote(tmp_path / "src", remote)
        store = self.store(repo)
        assert store.read_ref("refs/heads/nope") == (None, None)
        assert store.list_refs() == {}
        with pytest.raises(KeyMissing):
            store.get(object_key("0" * 64))
        with pytest.raises(RefConflictError):
            store.cas_ref("refs/heads/x", ObjectId("1" * 64), "stale-token")

    # -------------------------------------------------------------- trust
    def test_fetch_repairs_history_a_killed_gc_truncated(self, tmp_path: Path,
                                                         remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        ids = make_history(src, 3)
        push(src, self.store(src), "origin")
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        # an interrupted gc deleted the oldest commit, its manifest and one of its tensors
        first = dst.read_commit(ids[0])
        gone_tensor = sorted(e.id for e in dst.read_manifest(first.manifest).tensors.values())[0]
        for oid in (ids[0], first.manifest, gone_tensor):
            dst.objects.delete(oid)
        dst = Repo(dst.workdir)
        assert not dst.fsck()["ok"]
        new = make_history(src, 1, seed=7)[-1]
        push(src, self.store(src), "origin")
        result = fetch(dst, self.store(dst), "origin")
        assert all(dst.objects.has(o) for o in (ids[0], first.manifest, gone_tensor))
        assert result.objects["commit"] == 2 and result.objects["manifest"] == 2
        assert dst.refs.read("refs/remotes/origin/main") == new
        assert dst.fsck()["ok"]
        assert_bit_exact(src, dst, ids[0])

    def test_remote_ref_naming_a_tensor_is_refused(self, tmp_path: Path,
                                                   remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        make_history(src, 1)
        push(src, self.store(src), "origin")
        dst = clone(remote.url, tmp_path / "dst", options=remote.options)
        manifest = src.read_manifest(src.read_commit(src.head()).manifest)
        tensor = next(iter(manifest.tensors.values())).id
        assert dst.objects.has(tensor)  # present here: nothing to download, still refused
        store = self.store(src)
        store.cas_ref("refs/heads/evil", tensor, None)
        with pytest.raises(CorruptObjectError, match="evil .* is a tensor, not a commit"):
            fetch(dst, self.store(dst), "origin")
        assert dst.refs.read("refs/remotes/origin/evil") is None
        with pytest.raises(CorruptObjectError, match="not a commit"):
            clone(remote.url, tmp_path / "dst2", options=remote.options)
        assert not (tmp_path / "dst2").exists()
        assert dst.fsck()["ok"]

    def test_corrupted_object_fetched_on_demand_is_detected(self, tmp_path: Path,
                                                            remote: RemoteCase) -> None:
        src = self.repo_with_remote(tmp_path / "src", remote)
        ids = make_history(src, 2)
        push(src, self.store(src), "origin")
        lazy = clone(remote.url, tmp_path / "lazy", options=remote.options,
                     metadata_only=True)
        manifest = src.read_manifest(src.read_commit(ids[0]).manifest)
        bad = max(manifest.tensors.values(), key=lambda e: e.nbytes).id
        store = self.store(src)
        flip_remote_byte(store, bad, HEADER_SIZE, 0x01)  # one flipped bit in its bytes
        with pytest.raises(CorruptObjectError, match=bad):
            lazy.load(ids[0])
        assert not lazy.objects.has(bad)
        assert lazy.fsck()["ok"]
        flip_remote_byte(store, bad, HEADER_SIZE, 0x01)  # repaired: the same load now works
        assert_bit_exact(src, lazy, ids[0])

    def test_push_to_nothing_needs_create(self, tmp_path: Path, remote: RemoteCase) -> None:
        repo = Repo.init(tmp_path / "src")
        add_remote(repo, "origin", remote.url, remote.options)
        make_history(repo, 1)
        with pytest.raises(RemoteError, match="--create"):
            push(repo, self.store(repo), "origin")
        assert self.store(repo).state() == "missing"
        with pytest.raises(RemoteError, match="cannot clone"):
            clone(remote.url, tmp_path / "dst", options=remote.options)
        assert not (tmp_path / "dst").exists()
        push(repo, self.store(repo), "origin", create=True)
        assert self.store(repo).state() == "store"
        assert clone(remote.url, tmp_path / "dst", options=remote.options).head() == repo.head()
