"""Pack files: a commit's small objects in one file; reads, fsck, gc and repack of them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import assert_same, small_policy

from vrl import Repo
from vrl.cli import main
from vrl.errors import CorruptObjectError
from vrl.object_store import FileObjectStore
from vrl.objects import HEADER_SIZE, hash_object
from vrl.pack import read_index
from vrl.pack_set import PACK_MAX


def state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "small.a": torch.randn(8, 8, generator=g),
        "small.b": torch.randn(30, generator=g).to(torch.bfloat16),
        "small.c": torch.arange(5) + seed,
        "big.w": torch.randn(512, 520, generator=g),  # > 1 MiB: stays loose, mmapped
    }


def entries(repo: Repo, rev: str = "HEAD"):
    return repo.read_manifest(repo.read_commit(repo.resolve(rev)).manifest).tensors


def pack_files(repo: Repo) -> list[Path]:
    repo.sync()  # (a commit's pack is placed in the background)
    return sorted((repo.vrl_dir / "objects" / "pack").glob("pack-*.pack"))


def flip(path: Path, at: int) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def history(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    ids = [repo.commit(state(i), env=False, message=f"s{i}") for i in range(3)]
    return repo, ids


def test_a_commit_writes_one_pack_and_ids_do_not_change(history):
    repo, ids = history
    assert len(pack_files(repo)) == 3  # one per commit
    for i, cid in enumerate(ids):
        assert_same(state(i), Repo(repo.workdir).load(cid))
        for name, entry in entries(repo, cid).items():
            t = state(i)[name]
            raw = bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())
            assert entry.id == hash_object("tensor", raw)  # packing never changes an id
            loose = repo.objects.loose_path(entry.id)
            assert (loose is None) == (entry.nbytes < PACK_MAX), name
    # the manifest and the commit object share the snapshot's pack
    assert repo.objects.locate(repo.read_commit(ids[0]).manifest)[0] == \
        repo.objects.locate(ids[0])[0]
    assert repo.fsck()["ok"]


def test_pack_format_is_self_describing(history):
    repo, _ = history
    path = pack_files(repo)[0]
    index = read_index(str(path))
    data = path.read_bytes()
    assert data.startswith(b"vrlpack 1")
    for oid, (offset, length) in index.items():
        assert offset % 64 == 0  # payloads stay aligned
        assert hash_object(*_split(data[offset:offset + length])) == oid


def _split(raw: bytes):
    kind = raw[:HEADER_SIZE].split()[1].decode()
    return kind, raw[HEADER_SIZE:]


def test_packed_commits_resolve_by_prefix_and_survive_repack(history):
    repo, ids = history
    small = len([o for o in repo.objects.ids() if repo.objects.loose_path(o) is None])
    assert repo.repack() == (small, 3)  # 3 packs merged; the big tensors stay loose
    assert len(pack_files(repo)) == 1
    fresh = Repo(repo.workdir)
    assert fresh.resolve(ids[1][:8]) == ids[1]
    assert [e.id for e in fresh.log()] == ids[::-1]
    for i, cid in enumerate(ids):
        assert_same(state(i), fresh.load(cid))
    assert fresh.fsck()["ok"]
    assert repo.repack()[1] == 0  # nothing left to merge


def test_reader_follows_a_repack_by_another_process(history):
    repo, ids = history
    reader = Repo(repo.workdir)
    assert_same(state(0), reader.load(ids[0]))  # its pack index is now cached
    Repo(repo.workdir).repack()  # the packs it cached are gone
    reader._manifests.clear()
    reader._commits.clear()
    assert_same(state(1), reader.load(ids[1]))


def test_flipped_byte_in_a_pack_is_found_by_fsck_and_verified_reads(history, capsys):
    repo, ids = history
    entry = entries(repo, ids[1])["small.a"]
    path, offset, length = repo.objects.locate(entry.id)
    assert path.parent.name == "pack"
    flip(path, offset + HEADER_SIZE + 3)
    # a second, independent damage in another pack: fsck reports both
    other = entries(repo, ids[2])["small.c"]
    path2, offset2, _ = repo.objects.locate(other.id)
    flip(path2, offset2 + HEADER_SIZE)
    with pytest.raises(CorruptObjectError, match="corrupted"):
        Repo(repo.workdir, verify=True).load(ids[1])
    report = Repo(repo.workdir).fsck()
    assert not report["ok"]
    text = "\n".join(report["problems"])
    assert entry.id in text and other.id in text and path.name in text
    assert_same(state(0), Repo(repo.workdir, verify=True).load(ids[0]))  # unharmed
    assert main(["-C", str(repo.workdir), "fsck"]) == 1
    assert f"corrupt object {entry.id}" in capsys.readouterr().out


@pytest.mark.parametrize("how", ["truncate", "index"])
def test_truncated_or_damaged_index_is_reported(history, how):
    repo, ids = history
    entry = entries(repo, ids[1])["small.a"]
    path = repo.objects.locate(entry.id)[0]
    path.chmod(0o644)
    if how == "truncate":
        os.truncate(path, path.stat().st_size - 100)
    else:
        flip(path, path.stat().st_size - 80)  # inside the index
    fresh = Repo(repo.workdir)
    with pytest.raises(CorruptObjectError, match="damaged") as info:
        fresh.load(ids[1])
    assert "\n" not in str(info.value)
    report = fresh.fsck()
    assert not report["ok"]
    assert any(path.name in p for p in report["problems"])
    assert any(ids[1][:12] in p and "missing" in p for p in report["problems"])  # manifest
    assert_same(state(0), fresh.load(ids[0]))  # other packs still serve their objects
    assert_same(state(2), fresh.load(ids[2]))


def test_gc_drops_unreachable_packed_objects_and_keeps_the_rest(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    keep = repo.commit(state(0), env=False)
    repo.branch("tmp")
    repo.checkout("tmp")
    gone = repo.commit(state(1), env=False)
    repo.checkout("main")
    repo.delete_branch("tmp")
    young = repo.gc(grace=3600, expire_reflog=True)
    assert young == (0, 0)  # everything is young: kept
    dropped = {e.id for e in entries(repo, gone).values()} - \
        {e.id for e in entries(repo, keep).values()}
    count, freed = repo.gc(grace=0)
    assert count == len(dropped) + 2  # + manifest + commit
    assert freed > 0
    for oid in dropped:
        assert not repo.objects.has(oid)
    assert len(pack_files(repo)) == 1  # the dropped commit's pack is gone entirely
    fresh = Repo(repo.workdir)
    assert_same(state(0), fresh.load(keep))
    assert fresh.fsck()["ok"]


def test_gc_rewrites_a_pack_that_holds_live_and_dead_objects(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    a = repo.commit(state(0), env=False)
    b = repo.commit(state(1), env=False)
    repo.repack()  # one pack: both snapshots and their commits
    repo.reset(a)
    assert repo.gc(grace=0, expire_reflog=True)[0] > 0
    (only,) = pack_files(repo)
    fresh = Repo(repo.workdir)
    assert not fresh.objects.has(b)
    assert_same(state(0), fresh.load(a))
    assert len(read_index(str(only))) == len({e.id for e in entries(fresh, a).values()
                                              if e.nbytes < PACK_MAX}) + 2
    assert fresh.fsck()["ok"]


def test_gc_keeps_a_pack_reused_meanwhile(tmp_path, monkeypatch):
    """A commit that reuses a packed object freshens the pack between gc's decision and
    the rewrite: gc must then leave the pack alone. (fresh_for: reuse freshens packs of
    any age here, as it does those younger than half the grace period.)"""
    store = FileObjectStore(tmp_path / "objects", fresh_for=1e12)
    with store.batch():
        ids = [store.write("tensor", bytes([i]) * 100) for i in range(4)]
    path = store.locate(ids[0])[0]
    os.utime(path, (1, 1))
    real = FileObjectStore.write_pack

    def write_pack_then_reuse(self, objects):
        name = real(self, objects)
        self.touch(ids[0])  # a concurrent commit reuses an object of the old pack
        return name

    monkeypatch.setattr(FileObjectStore, "write_pack", write_pack_then_reuse)
    assert store.delete_many(ids[:2], older_than=100) == (0, 0)
    assert path.exists()
    fresh = FileObjectStore(tmp_path / "objects")
    assert all(fresh.read(o)[1] == bytes([i]) * 100 for i, o in enumerate(ids))
    monkeypatch.setattr(FileObjectStore, "write_pack", real)
    os.utime(path, (1, 1))
    assert fresh.delete_many(ids[:2], older_than=100) == (2, 2 * (HEADER_SIZE + 100))
    assert [fresh.has(o) for o in ids] == [False, False, True, True]


def test_repack_cli_and_json(history, capsys):
    repo, ids = history
    assert main(["-C", str(repo.workdir), "repack"]) == 0
    assert "Packed" in capsys.readouterr().out
    assert main(["-C", str(repo.workdir), "repack", "--json"]) == 0
    assert '"files_removed": 0' in capsys.readouterr().out
    assert main(["-C", str(repo.workdir), "repack"]) == 0
    assert capsys.readouterr().out.startswith("Nothing to repack")
    assert Repo(repo.workdir).fsck()["ok"]


def test_small_policy_round_trip_is_bit_exact(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    model = small_policy()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    cid = repo.commit(model, opt, env=False)
    assert len(pack_files(repo)) == 1
    fresh = Repo(repo.workdir, verify=True)
    got = fresh.load(cid)
    assert_same(model.state_dict(), got["model"])
    assert_same(opt.state_dict()["state"], {int(k): v for k, v in
                                            got["optimizer"]["state"].items()})


def test_the_core_never_imports_the_remote_layer(tmp_path):
    code = f"""
import sys, torch
from vrl.repo import Repo
repo = Repo.init({str(tmp_path / 'r')!r})
cid = repo.commit({{"w": torch.ones(3)}}, env=False)
repo.load(cid); repo.log(); repo.fsck(); repo.gc(grace=0); repo.repack()
bad = sorted(m for m in sys.modules if m.startswith("vrl.remote"))
assert not bad, bad
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert res.returncode == 0, res.stderr


def test_a_stale_index_never_claims_an_object_gc_removed(tmp_path):
    """A process whose pack index predates a gc must not believe (touch) an object that
    the gc dropped with the old pack: it must write it again."""
    path = tmp_path / "objects"
    committer = FileObjectStore(path)
    with committer.batch():
        keep, drop = committer.write("tensor", b"keep"), committer.write("tensor", b"drop")
    assert committer.has(drop)  # its index now lists the pack
    os.utime(committer.locate(drop)[0], (1, 1))
    assert FileObjectStore(path).delete_many([drop], older_than=100) == (1, HEADER_SIZE + 4)
    assert not committer.touch(drop)
    assert committer.write("tensor", b"drop") == drop
    assert FileObjectStore(path).read(drop) == ("tensor", b"drop")
    assert committer.read(keep) == ("tensor", b"keep")


def test_commits_merge_their_packs_every_auto_merge_commits(tmp_path, monkeypatch):
    import vrl.pack_merge

    monkeypatch.setattr(vrl.pack_merge, "AUTO_MERGE", 4)
    repo = Repo.init(tmp_path / "repo")
    ids = [repo.commit(state(i), env=False) for i in range(3)]
    assert len(pack_files(repo)) == 3
    ids.append(repo.commit(state(3), env=False))  # the 4th small pack: merged into one
    assert len(pack_files(repo)) == 1
    ids += [repo.commit(state(i), env=False) for i in range(4, 6)]
    assert len(pack_files(repo)) == 3  # the merged one (still small), and 2 new
    ids.append(repo.commit(state(6), env=False))
    assert len(pack_files(repo)) == 1
    fresh = Repo(repo.workdir, verify=True)
    for i, cid in enumerate(ids):
        assert_same(state(i), fresh.load(cid))
    assert fresh.fsck()["ok"]
    monkeypatch.setattr(vrl.pack_merge, "MERGED_MAX", 1)  # every pack counts as big
    for i in range(7, 11):
        repo.commit(state(i), env=False)
    assert len(pack_files(repo)) == 5  # big packs are never merged again


def test_push_sends_packed_objects_and_fetch_packs_what_it_gets(tmp_path):
    from vrl.remote import add_remote, clone, open_named, push

    src = Repo.init(tmp_path / "src")
    ids = [src.commit(state(i), env=False) for i in range(3)]
    add_remote(src, "origin", str(tmp_path / "remote"))
    store = open_named(src, "origin")
    try:
        push(src, store, "origin", ["main"], create=True)
    finally:
        store.close()
    # one pack for the push (big tensors would go loose); each object in it byte-exact
    from vrl.remote.packs import RemotePacks
    from vrl.remote.stores import LocalRemote

    remote = RemotePacks(LocalRemote(tmp_path / "remote")).load(loose=True)
    # tensors of REMOTE_PACK_MAX and more (big.w) go loose, everything else in the pack
    from vrl.remote.transfer import REMOTE_PACK_MAX

    big = {o for o in src.objects.ids() if src.objects.kind_and_size(o)[1] >= REMOTE_PACK_MAX}
    assert len(big) == 3 and len(remote.entries) == 1 and remote.loose == big
    (key, entries), = remote.entries.items()
    data = (tmp_path / "remote" / key).read_bytes()
    assert set(entries) == set(src.objects.ids()) - big
    for oid, (offset, length) in entries.items():
        assert data[offset:offset + length] == src.objects.read_raw(oid)
    dst = clone(str(tmp_path / "remote"), tmp_path / "dst", checkout=False)
    small = [o for o in dst.objects.ids() if dst.objects.kind_and_size(o)[1] < PACK_MAX]
    assert small and all(dst.objects.loose_path(o) is None for o in small)
    assert len(pack_files(dst)) == 2  # the tensors, then the manifests and commits
    for i, cid in enumerate(ids):
        assert_same(state(i), dst.load(cid))
    assert dst.fsck()["ok"]


def test_reuse_from_an_old_pack_writes_the_object_again(tmp_path):
    """Freshening an old pack would revive every unreachable object in it, racing a
    concurrent gc: a reused object from a pack older than half the grace period is written
    again into the new pack instead, and the old pack keeps its age."""
    store = FileObjectStore(tmp_path / "objects", fresh_for=60)
    with store.batch():
        old, other = store.write("tensor", b"old"), store.write("tensor", b"other")
    path = store.locate(old)[0]
    os.utime(path, (1, 1))
    assert not store.touch(old)
    with store.batch():
        store.write("tensor", b"old")
        store.write("tensor", b"new")
    assert path.stat().st_mtime == 1
    assert store.locate(old)[0] != path or len(store.packs()) == 2
    assert store.delete_many([other], older_than=100) == (1, HEADER_SIZE + 5)
    assert FileObjectStore(tmp_path / "objects").read(old) == ("tensor", b"old")
    os.utime(store.locate(old)[0])  # a young pack is simply freshened
    assert store.touch(old)


def test_gc_keeps_what_a_young_unreachable_commit_reaches(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    repo.commit(state(0), env=False)
    first = repo.commit(state(1), env=False, ref="refs/heads/tmp")
    for p in pack_files(repo):
        os.utime(p, (1, 1))  # main's and tmp's first snapshot: long ago
    second = repo.commit(state(2), env=False, ref="refs/heads/tmp")  # young
    repo.refs.update("refs/heads/tmp", None, reason="test")
    repo.gc(grace=600, expire_reflog=True)
    fresh = Repo(repo.workdir)
    assert_same(state(1), fresh.load(first))  # kept: the young commit reaches it
    assert fresh.fsck()["ok"]
    assert fresh.read_commit(second).parents == (first,)


def test_mid_sized_tensors_are_packed_and_restore_memory_mapped(tmp_path):
    """Tensors between the memory-mapping size (64 KiB) and PACK_MAX share the commit's
    pack (no file and fsync each) and still restore memory-mapped, from the pack."""
    from vrl.repo import MMAP_MIN

    repo = Repo.init(tmp_path / "repo")
    g = torch.Generator().manual_seed(3)
    mid = {"w": torch.randn(256, 256, generator=g), "v": torch.randn(64, 256, generator=g)}
    cid = repo.commit(mid, env=False)
    assert len(pack_files(repo)) == 1
    assert not [p for p in (repo.vrl_dir / "objects").iterdir() if p.name != "pack"]
    for entry in entries(repo, cid).values():
        assert MMAP_MIN <= entry.nbytes < PACK_MAX
        assert repo.objects.loose_path(entry.id) is None
    fresh = Repo(repo.workdir)
    got = fresh.load(cid)
    assert_same(mid, got)
    # memory-mapped, copy-on-write: writing to it never reaches the store
    got["w"].add_(1.0)
    assert_same(mid, Repo(repo.workdir).load(cid))
    assert fresh.fsck()["ok"]


def rl_policy() -> dict[str, torch.Tensor]:
    """The benchmark's ~0.7 MB actor-critic (64 -> 256 -> 256 -> actions, twice)."""
    g = torch.Generator().manual_seed(0)
    shapes = {"w1": (256, 64), "b1": (256,), "w2": (256, 256), "b2": (256,), "w3": (5, 256),
              "b3": (5,)}
    return {f"{net}.{k}": torch.randn(*s, generator=g) for net in ("actor", "critic")
            for k, s in shapes.items()}


def test_a_small_policy_commit_creates_no_directory_and_one_file(tmp_path, monkeypatch):
    """A small-policy commit is one pack, the ref and its reflogs: `init` made every
    directory a commit needs (each new one costs a commit an fsync of its parent)."""
    repo = Repo.init(tmp_path / "repo")
    made: list[str] = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (made.append(str(p)),
                                                        real_mkdir(p, *a, **k))[1])
    state = rl_policy()
    repo.commit(state, env=False)
    state["actor.w1"].add_(1.0)
    repo.commit(state, env=False)
    repo.sync()
    assert made == []
    objects = repo.vrl_dir / "objects"
    assert sorted(p.name for p in objects.iterdir()) == ["pack"]
    assert len(pack_files(repo)) == 2


def test_a_batch_finds_what_another_store_packed_before_it_began(tmp_path):
    """`put` in a batch looks for a copy in the pack tables only, refreshed once per batch:
    a pack another process wrote after this store last looked is seen (its object is
    not written again), without a lookup per object."""
    mine = FileObjectStore(tmp_path / "objects")
    with mine.batch():  # this store's tables are filled (and then go stale)
        mine.write("tensor", b"mine-1")
        mine.write("tensor", b"mine-2")
    theirs = FileObjectStore(tmp_path / "objects")
    with theirs.batch():
        shared = theirs.write("tensor", b"shared")
        theirs.write("tensor", b"theirs")
    packs = set(os.listdir(tmp_path / "objects" / "pack"))  # (not through `mine`)
    with mine.batch():
        assert not mine.put("tensor", b"shared", hash_object("tensor", b"shared"))
        new_a = mine.write("tensor", b"new-a")
        mine.write("tensor", b"new-b")
    added = set(mine.packs()) - packs
    assert len(added) == 1  # the new objects only: "shared" was not written again
    index = read_index(str(tmp_path / "objects" / "pack" / added.pop()))
    assert new_a in index and shared not in index


def test_a_loose_small_object_reused_in_a_batch_is_packed_again_harmlessly(tmp_path):
    """A small object that exists only as a loose file is stored again in the batch's pack
    (no lookup of loose files per object); both copies read the same, and gc removes
    both."""
    store = FileObjectStore(tmp_path / "objects")
    loose = store.write("tensor", b"loose")  # outside a batch: a loose file
    assert store.loose_path(loose) is not None
    with store.batch():
        store.write("tensor", b"loose")
        store.write("tensor", b"other")
    assert store.is_packed(loose) and store.loose_path(loose) is not None
    assert FileObjectStore(tmp_path / "objects").read(loose) == ("tensor", b"loose")
    assert store.check() == [] and store.verify(loose) == "tensor"
    assert store.delete_many([loose])[0] == 1
    assert not FileObjectStore(tmp_path / "objects").has(loose)


def test_merged_packs_are_merged_again_only_with_their_own_size_class(tmp_path, monkeypatch):
    """Commits' fresh packs merge among themselves; a merged pack waits for enough merged
    ones before it is rewritten (so a commit's bytes are not rewritten at every merge)."""
    import vrl.pack_merge

    monkeypatch.setattr(vrl.pack_merge, "AUTO_MERGE", 3)
    repo = Repo.init(tmp_path / "repo")
    ids = [repo.commit(state(0), env=False)]
    fresh_size = pack_files(repo)[0].stat().st_size
    monkeypatch.setattr(vrl.pack_merge, "FRESH_MAX", 2 * fresh_size)  # 2+ packs merged
    sizes = []
    for i in range(1, 9):
        ids.append(repo.commit(state(i), env=False))
        sizes.append(sorted(p.stat().st_size for p in pack_files(repo)))
    # after 3 fresh packs: one merged; after 3 more: two merged (the first not rewritten)
    assert len(sizes[1]) == 1 and len(sizes[4]) == 2 and sizes[1][0] in sizes[4]
    # the third merged pack makes the merged class merge: one pack holds everything
    assert len(sizes[7]) == 1
    fresh = Repo(repo.workdir, verify=True)
    for i, cid in enumerate(ids):
        assert_same(state(i), fresh.load(cid))
    assert fresh.fsck()["ok"]


def test_a_pack_freshened_lately_is_freshened_again_without_a_look_at_its_age(
        tmp_path, monkeypatch):
    """A training run reuses one pack's objects at every commit. A pack this process
    freshened a moment ago (under fresh_for/100, at most 1 s) counts as freshened; one it
    freshened less than fresh_for/2 ago is younger than fresh_for still, so it is
    freshened again without a stat. Past that its age is looked at again, and a pack that
    is gone is noticed."""
    store = FileObjectStore(tmp_path / "objects", fresh_for=60)
    with store.batch():
        a = store.write("tensor", b"a")
        store.write("tensor", b"b")
    path = os.fspath(store.locate(a)[0])
    clock = [time.time()]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    assert store.touch(a)  # looked at (young), freshened
    looked = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *args, **kw: (
        looked.append(os.fspath(p)), real_stat(p, *args, **kw))[1])
    os.utime(path, (5, 5))  # (as if: neither looked at nor freshened)
    clock[0] += 0.5
    assert store.touch(a) and path not in looked and real_stat(path).st_mtime == 5
    clock[0] += 0.5  # past 0.6 s: freshened again, its age not looked at
    assert store.touch(a) and path not in looked and real_stat(path).st_mtime > 5
    clock[0] += 31
    os.utime(path, (5, 5))
    assert not store.touch(a) and path in looked  # old: the object is written again
    clock[0] += 31
    os.utime(path, (clock[0], clock[0]))  # young again
    assert store.touch(a)
    os.remove(path)  # (collected by another process)
    clock[0] += 1
    assert not store.touch(a)


def test_every_byte_flipped_in_a_pack_index_is_caught(tmp_path):
    """The index's checksum guards every byte of it, each object's id above all (a
    flipped id bit would pass every other check and name the bytes by a wrong id)."""
    from vrl.errors import CorruptObjectError
    from vrl.pack import ENTRY, TRAILER, read_index

    store = Repo.init(tmp_path / "r").objects
    with store.batch():
        for i in range(3):
            store.write("tensor", bytes([i]) * (100 + i))
    path = Path(store._pack_dir) / store.packs()[0]
    data = path.read_bytes()
    assert len(read_index(str(path))) == 3
    start = len(data) - TRAILER.size - 3 * ENTRY.size
    reserved = range(len(data) - 40, len(data) - 32)  # (the trailer's 8 unused bytes)
    for at in (at for at in range(start, len(data)) if at not in reserved):
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(CorruptObjectError):
            read_index(str(path))
