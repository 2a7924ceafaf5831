"""Repository behaviour through the Python API: history, revisions, refs, diffs, gc."""

import math
import os

import pytest
import torch
from helpers import assert_same, before_ref_moves, edit_object, small_policy

import vrl.repo as repo_module
from vrl import Repo, commit_engine
from vrl.errors import (
    CorruptObjectError,
    InvalidRefNameError,
    NotARepositoryError,
    RefConflictError,
    RevisionError,
    VrlError,
    WorkspaceError,
)


def commits(repo, n, start=0):
    """n commits of a 3-tensor state where each commit changes tensor `a` only."""
    ids = []
    for i in range(start, start + n):
        ids.append(repo.commit({"a": torch.full((4,), float(i)), "b": torch.ones(2),
                                "c": torch.zeros(3)}, message=f"c{i}", step=i))
    return ids


def test_discovers_repository_upwards(tmp_path):
    Repo.init(tmp_path)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert Repo(tmp_path / "a" / "b").vrl_dir == tmp_path / ".vrl"


def test_not_a_repository(tmp_path):
    with pytest.raises(NotARepositoryError, match="vrl init"):
        Repo(tmp_path)


def test_init_is_idempotent(tmp_path):
    r = Repo.init(tmp_path)
    commits(r, 1)
    head = r.head()
    assert Repo.init(tmp_path).head() == head


def test_revisions(repo):
    ids = commits(repo, 4)
    assert repo.resolve("HEAD") == ids[3]
    assert repo.resolve("main") == ids[3]
    assert repo.resolve("HEAD~2") == ids[1]
    assert repo.resolve("HEAD^") == ids[2]
    assert repo.resolve("HEAD^^~1") == ids[0]
    assert repo.resolve("HEAD^0") == ids[3]
    assert repo.resolve(ids[1][:10]) == ids[1]
    assert repo.resolve(ids[2]) == ids[2]
    repo.tag("v1", ids[0])
    assert repo.resolve("v1~0") == ids[0]
    assert repo.resolve("refs/tags/v1") == ids[0]
    with pytest.raises(RevisionError, match="past the first commit"):
        repo.resolve("HEAD~4")
    for bad in ["nope", "HEAD@{9}", "main@{4}", "v1@{1}", "x@{0}", "", "   ", "../x",
                "main~x"]:
        with pytest.raises(RevisionError):
            repo.resolve(bad)


def test_reflog_revisions(repo, capsys):
    """`HEAD@{n}` and `BRANCH@{n}`, numbered as `vrl reflog` prints them."""
    from helpers import vrl

    ids = commits(repo, 3)
    repo.reset("HEAD~2")
    assert repo.resolve("HEAD@{0}") == ids[0]
    assert repo.resolve("HEAD@{1}") == ids[2]
    assert repo.resolve("main@{1}~1") == ids[1]
    assert repo.resolve("@{3}") == ids[0]
    assert repo.resolve("refs/heads/main@{2}") == ids[1]
    with pytest.raises(RevisionError, match="only 4 entries"):
        repo.resolve("HEAD@{4}")
    os.chdir(repo.workdir)
    code, out, _ = vrl(capsys, "reflog")
    printed = {line.split()[1].rstrip(":"): line.split()[0] for line in out.splitlines()}
    assert len(printed) == 4
    for rev, short_id in printed.items():  # every name the reflog prints is a revision
        assert repo.resolve(rev).startswith(short_id)
    code, out, _ = vrl(capsys, "show", "HEAD@{1}", "--json")
    assert code == 0 and f'"id": "{ids[2]}"' in out


def test_ambiguous_prefix(repo):
    """The real lookup: two stored commits share a 4-character prefix (found by hashing
    candidate commits in memory), a tensor object shares it too and must not count."""
    from vrl.objects import Commit, hash_object

    root = commits(repo, 1)[0]
    manifest = repo.read_commit(root).manifest
    by_prefix: dict[str, bytes] = {}
    for i in range(20000):  # ~300 candidates are expected before two ids share 4 chars
        payload = Commit(manifest=manifest, parents=(root,), message=f"m{i}", author="t",
                         time="2026-01-01T00:00:00.000000Z").to_bytes()
        oid = hash_object("commit", payload)
        if oid[:4] in by_prefix:
            break
        by_prefix[oid[:4]] = payload
    else:
        pytest.fail("no two ids shared a prefix")
    first = repo.objects.write("commit", by_prefix[oid[:4]])
    second = repo.objects.write("commit", payload)
    prefix = oid[:4]
    for i in range(200000):  # a tensor object with the same prefix: not a commit
        blob = i.to_bytes(4, "little")
        if hash_object("tensor", blob).startswith(prefix):
            repo.objects.write("tensor", blob)
            break
    with pytest.raises(RevisionError, match="ambiguous") as info:
        repo.resolve(prefix)
    assert first[:12] in str(info.value) and second[:12] in str(info.value)
    assert repo._commits_with_prefix(prefix) == sorted([first, second])
    # one more character tells them apart (unless they share 5: then use the full id)
    for oid in (first, second):
        n = next(n for n in range(5, 65) if oid[:n] != (second if oid == first else first)[:n])
        assert repo.resolve(oid[:n]) == oid


def test_unborn_head(repo):
    assert repo.head() is None
    assert repo.log() == []
    with pytest.raises(RevisionError, match="no commits yet"):
        repo.resolve("HEAD")


def test_nothing_changed_is_refused_unless_allowed(repo):
    state = {"w": torch.ones(3)}
    repo.commit(state)
    with pytest.raises(WorkspaceError, match="nothing changed"):
        repo.commit(state)
    repo.commit(state, allow_empty=True, message="again")
    assert len(repo.log()) == 2


def test_log_order_and_metadata(repo):
    ids = commits(repo, 3)
    log = repo.log()
    assert [e.id for e in log] == ids[::-1]
    assert [e.commit.step for e in log] == [2, 1, 0]
    assert log[0].refs == ("refs/heads/main",)
    assert [e.id for e in repo.log(max_count=2)] == ids[:0:-1]


def test_branches_checkout_and_reset(repo):
    base = commits(repo, 2)
    repo.checkout("main", create_branch="exp")
    assert repo.current_branch() == "exp"
    exp = commits(repo, 1, start=10)
    assert repo.resolve("main") == base[1]
    assert repo.resolve("exp") == exp[0]
    repo.checkout("main")
    assert repo.current_branch() == "main" and repo.head() == base[1]
    repo.checkout(base[0][:8])
    assert repo.current_branch() is None and repo.head() == base[0]
    detached = commits(repo, 1, start=20)[0]
    assert repo.head() == detached and repo.resolve("main") == base[1]
    repo.checkout("main")
    old, new = repo.reset("HEAD~1")
    assert (old, new) == (base[1], base[0]) and repo.resolve("main") == base[0]
    repo.reset(old)  # undo from the reflog
    assert repo.resolve("main") == base[1]
    with pytest.raises(RefConflictError, match="already exists"):
        repo.branch("exp")
    repo.branch("exp", "main", force=True)
    assert repo.resolve("exp") == base[1]
    with pytest.raises(Exception, match="HEAD is on it"):
        repo.delete_branch("main")
    repo.delete_branch("exp")
    assert "exp" not in repo.branches()


@pytest.mark.parametrize("name", ["..", "a..b", "/a", "a/", "a//b", "a\x01b", "a b", "a~1",
                                  "a^", "a:b", "x.lock", ".hidden", "refs/../x", "HEAD",
                                  "@", "a@{1}", "", "a*", "a[1]", "a\\b", "end."])
def test_invalid_ref_names(repo, name):
    commits(repo, 1)
    repo.sync()  # the commit's ref written out (its temp file gone) before the listing
    with pytest.raises(InvalidRefNameError):
        repo.branch(name)
    with pytest.raises(InvalidRefNameError):
        repo.tag(name)
    assert not any(p.name.startswith(".") for p in (repo.vrl_dir / "refs" / "heads").iterdir())
    assert list(repo.branches()) == ["main"]


def test_tags_move_only_with_force(repo):
    ids = commits(repo, 2)
    repo.tag("best", ids[0])
    with pytest.raises(RefConflictError):
        repo.tag("best", ids[1])
    repo.tag("best", ids[1], force=True)
    assert repo.tags() == {"best": ids[1]}
    repo.delete_tag("best")
    assert repo.tags() == {}


def test_reflog_records_every_move(repo):
    ids = commits(repo, 2)
    repo.reset("HEAD~1")
    log = repo.refs.reflog("HEAD")
    assert [(e.old, e.new) for e in log] == [(ids[1], ids[0]), (ids[0], ids[1]), (None, ids[0])]
    assert log[0].reason.startswith("reset")


def test_layer_stats_match_a_hand_computation(repo):
    torch.manual_seed(0)
    old = {"l1.weight": torch.randn(4, 3), "l1.bias": torch.randn(4),
           "l2.weight": torch.randn(2, 4)}
    repo.commit(old)
    new = {k: v.clone() for k, v in old.items()}
    new["l1.weight"][0, 0] += 0.5
    cid = repo.commit(new)
    diff = repo.diff(cid)
    layers = {lc.layer: lc for lc in diff.layers}
    norm_old = math.sqrt(old["l1.weight"].double().square().sum() +
                         old["l1.bias"].double().square().sum())
    assert layers["l1"].rel == pytest.approx(0.5 / norm_old, rel=1e-6)
    assert layers["l1"].max_abs == pytest.approx(0.5, rel=1e-6)
    assert layers["l1"].status == "changed" and layers["l1"].material
    assert layers["l2"].status == "unchanged" and not layers["l2"].material
    assert diff.summary() == "1 of 2 layers changed materially; 48 B of 96 B new"
    # a higher threshold turns the change immaterial; stored stats are re-judged, not redone
    assert repo.diff(cid, threshold=1.0).material == []
    # any pair: computed from objects equals the stored statistics
    computed = repo.diff("HEAD~1", "HEAD")
    assert computed.to_json() == diff.to_json()


def test_diff_statuses_added_removed_reshaped(repo):
    a = repo.commit({"x.w": torch.ones(2), "y.w": torch.ones(2), "z.w": torch.ones(2)})
    b = repo.commit({"x.w": torch.ones(2), "z.w": torch.ones(3), "n.w": torch.ones(1)})
    layers = {lc.layer: lc for lc in repo.diff(a, b).layers}
    assert layers["x"].status == "unchanged"
    assert layers["y"].status == "removed" and layers["y"].material
    assert layers["n"].status == "added"
    assert layers["z"].status == "changed" and layers["z"].rel is None


def store_bytes(repo) -> int:
    return sum(p.stat().st_size for p in (repo.vrl_dir / "objects").rglob("*") if p.is_file())


def test_store_growth_is_changed_tensors_plus_small_metadata(repo):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(10)])
    repo.commit(model, env=False)
    repo.sync()
    before = store_bytes(repo)
    with torch.no_grad():
        model[3].weight.add_(0.01)
    cid = repo.commit(model, env=False)
    repo.sync()
    growth = store_bytes(repo) - before
    changed = 64 * 64 * 4
    assert changed + 64 <= growth <= changed + 64 + 8_000  # + header + manifest + commit
    assert repo.read_commit(cid).stats["bytes_new"] == changed


def test_unchanged_tensors_are_not_rehashed(repo, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(4)])
    repo.commit(model, env=False)
    hashed: list[int] = []
    real = commit_engine.hash_object

    def counting(kind, payload, threads=False):
        if kind == "tensor":
            hashed.append(memoryview(payload).nbytes)
        return real(kind, payload, threads)

    monkeypatch.setattr(commit_engine, "hash_object", counting)
    with torch.no_grad():
        model[1].weight.mul_(1.5)
    repo.commit(model, env=False)
    # only the changed weight (64 kB) and the small biases are hashed
    assert 128 * 128 * 4 in hashed and hashed.count(128 * 128 * 4) == 1
    # a write through .data bypasses the version counter; the probe still catches it
    hashed.clear()
    model[2].weight.data[0, 0] = 123.0
    cid = repo.commit(model, env=False)
    assert hashed.count(128 * 128 * 4) == 1
    assert repo.load(cid)["2.weight"][0, 0] == 123.0


def test_rehash_option_is_a_no_op(repo, monkeypatch):
    # every commit reads every byte (xxh3 pre-check), so rehash=True has nothing to add:
    # unchanged tensors are recognised without a blake3 hash either way
    model = small_policy()
    repo.commit(model)
    seen = []
    real = commit_engine.hash_object
    monkeypatch.setattr(commit_engine, "hash_object",
                        lambda k, p, threads=False: seen.append(k) or real(k, p, threads))
    repo.commit(model, rehash=True, allow_empty=True)
    assert seen.count("tensor") == 0


@pytest.mark.parametrize("journal", [True, False])
def test_concurrent_commit_is_reparented_not_lost(repo, journal):
    repo = Repo(repo.workdir, journal=journal)
    first = repo.commit({"w": torch.zeros(3)})
    other = Repo(repo.workdir, journal=journal)
    raced = []

    def race():
        if not raced:  # another process commits just before our compare-and-swap
            raced.append(other.commit({"w": torch.ones(3)}, message="other"))

    before_ref_moves(repo, race)
    mine = repo.commit({"w": torch.full((3,), 2.0)}, message="mine")
    history = [e.id for e in Repo(repo.workdir).log()]
    assert history == [mine, raced[0], first]
    assert repo.read_commit(mine).stats["parent"] == raced[0]


def test_gc_removes_only_unreachable_and_old(repo):
    ids = commits(repo, 3)
    before = set(repo.objects.ids())
    repo.reset(ids[0])
    assert repo.gc(grace=0) == (0, 0)  # the reflog still reaches the reset commits
    count, freed = repo.gc(grace=3600, expire_reflog=True)
    assert count == 0  # young objects are kept
    count, freed = repo.gc(grace=0)
    assert count > 0 and freed > 0
    assert set(repo.objects.ids()) < before
    assert_same({"a": torch.full((4,), 0.0), "b": torch.ones(2), "c": torch.zeros(3)},
                repo.load("HEAD"))
    assert repo.fsck()["ok"]


def test_gc_keeps_objects_freshened_by_reuse(repo):
    ids = commits(repo, 2)
    repo.reset(ids[0])
    repo.gc(grace=0, expire_reflog=True)
    for p in (repo.vrl_dir / "objects").rglob("*"):
        if p.is_file():
            os.utime(p, (1, 1))  # everything looks ancient
    again = commits(repo, 1, start=1)[0]  # reuses old objects and freshens them
    assert repo.gc(grace=60)[0] == 0
    assert repo.fsck()["ok"] and repo.load(again)["a"][0] == 1.0


def test_fsck_finds_corruption_and_missing_objects(repo):
    commits(repo, 2)
    assert repo.fsck()["ok"]
    victim = repo.read_manifest(repo.read_commit(repo.head()).manifest).tensors["a"].id
    path, offset, length = repo.objects.locate(victim)  # a loose file or its pack
    data = bytearray(path.read_bytes())
    data[offset + length - 1] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))
    report = repo.fsck()
    assert not report["ok"] and any("corrupt" in p for p in report["problems"])
    repo.objects.delete(victim)
    report = Repo(repo.workdir).fsck()
    assert any("missing" in p for p in report["problems"])


def test_checkout_loads_into_model_and_load_is_lazy(repo, monkeypatch):
    model = small_policy()
    cid = repo.commit(model)
    other = small_policy(seed=3)
    repo.checkout(cid, model=other)
    assert_same(model.state_dict(), other.state_dict())
    # lazy: a large tensor is memory-mapped from its file (loose or pack), never read
    big = {"big": torch.randn(256, 256), "small": torch.ones(3)}
    cid = repo.commit(big)
    fresh = Repo(repo.workdir)
    entry = fresh.read_manifest(fresh.read_commit(cid).manifest).tensors["big"]
    read_ids = []
    real_read = fresh.objects.read
    monkeypatch.setattr(fresh.objects, "read", lambda oid: (read_ids.append(oid),
                                                            real_read(oid))[1])
    loaded = fresh.load(cid)
    assert entry.id not in read_ids
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else None
    if maps is not None:
        start = loaded["big"].data_ptr()
        mapped = [line for line in maps.splitlines()
                  if line.endswith(str(fresh.objects.locate(entry.id)[0]))]
        assert any(int(line.split("-")[0], 16) <= start < int(line.split()[0].split("-")[1], 16)
                   for line in mapped), "the tensor is not backed by its object's file"
    assert_same(big, loaded)


def test_workspace_status(repo):
    from vrl.workspace import write_checkpoint

    path = repo.workspace_path
    assert repo.workspace_status()[0] == "missing"
    write_checkpoint(small_policy().state_dict(), path)
    assert repo.workspace_status()[0] == "untracked"
    from vrl.workspace import read_checkpoint

    cid = repo.commit(read_checkpoint(path))
    assert repo.workspace_status()[0] == "clean"
    sd = small_policy().state_dict()
    sd["2.bias"] = sd["2.bias"] + 1
    write_checkpoint(sd, path)
    state, diff = repo.workspace_status()
    assert state == "modified"
    assert [lc.layer for lc in diff.material] == ["2"]
    with pytest.raises(WorkspaceError, match="uncommitted"):
        repo.ensure_clean_workspace()
    repo.write_workspace(cid)
    assert repo.workspace_status()[0] == "clean"


def test_restored_big_tensors_are_private_writable_maps(repo):
    """Big tensors come back memory-mapped copy-on-write: bit-exact, writable in place
    (optimizers do), and a write never reaches the store."""
    big = {"w": torch.randn(512, 512), "b": torch.arange(70_000, dtype=torch.float64),
           "h": torch.randn(300, 300).to(torch.bfloat16)}
    assert all(t.nbytes >= repo_module.MMAP_MIN for t in big.values())
    cid = repo.commit(big, env=False)
    restored = Repo(repo.workdir).load(cid)
    assert_same(restored, big)
    for t in restored.values():
        t.zero_()  # in place, as an optimizer step would
    assert_same(Repo(repo.workdir).load(cid), big)
    assert Repo(repo.workdir).fsck()["ok"]


def test_commit_raced_after_its_statistics_is_reparented(repo, monkeypatch):
    """The commit loop's first attempt uses the parent read for the statistics; another
    commit landing between that read and the compare-and-swap (here: while the big
    tensors are synced) makes the swap fail, and the commit is re-parented onto it with
    its statistics recomputed."""
    first = repo.commit({"w": torch.zeros(3)})
    other = Repo(repo.workdir)  # another Repo object (as another process) moves the ref
    real_sync = repo.objects.sync
    raced = []

    def racing_sync():
        real_sync()
        if not raced:
            raced.append(other.commit({"w": torch.ones(3)}, message="other"))

    monkeypatch.setattr(repo.objects, "sync", racing_sync)
    mine = repo.commit({"w": torch.full((3,), 3.0)}, message="mine")
    assert [e.id for e in Repo(repo.workdir).log()] == [mine, raced[0], first]
    stats = repo.read_commit(mine).stats
    assert stats["parent"] == raced[0]
    assert stats["layers"]["w"]["rel"] == pytest.approx(2.0)  # |3 - 1| / |1|, not / |0|


def test_norms_of_unchanged_tensors_are_per_dtype(repo):
    """An unchanged tensor beside a changed one counts in its layer's norm; the norm is
    remembered by object id and dtype, and the same bytes as another dtype are another
    norm (float32 1.0 is the int32 1065353216)."""
    ones = torch.ones(2)
    repo.commit({"x.w": torch.zeros(2), "x.b": ones}, env=False)
    repo.commit({"x.w": torch.full((2,), 3.0), "x.b": ones}, env=False)  # x.b's norm: 2
    as_int = ones.view(torch.int32)  # the same bytes (the same object id)
    repo.commit({"y.w": torch.zeros(2, dtype=torch.int32), "y.b": as_int}, env=False)
    cid = repo.commit({"y.w": torch.full((2,), 3, dtype=torch.int32), "y.b": as_int},
                      env=False)
    rel = repo.read_commit(cid).stats["layers"]["y"]["rel"]
    b_sq = 2 * 1065353216.0 ** 2
    assert rel == pytest.approx(math.sqrt(18) / math.sqrt(b_sq))


def test_parsed_metadata_kept_in_memory_is_bounded(tmp_path, monkeypatch):
    """A training run commits without end: the commits and manifests a Repo keeps parsed
    are the most recent few; older ones are read again when asked for."""
    monkeypatch.setattr(repo_module, "METADATA_CACHED", 4)
    repo = Repo.init(tmp_path)
    ids = commits(repo, 10)
    assert len(repo._commits) <= 4 and len(repo._manifests) <= 4
    assert [e.id for e in repo.log()] == ids[::-1]
    assert repo.load(ids[0])["a"][0] == 0.0 and repo.read_commit(ids[0]).step == 0
    assert len(repo._commits) <= 4 and len(repo._manifests) <= 4


def test_payloads_kept_for_the_next_statistics_stay_within_their_budget(tmp_path,
                                                                        monkeypatch):
    """Small payloads a commit stored are kept for the next commit's statistics, at most
    RECENT_BYTES in all and half of that per commit; what is not kept is read back from
    the store, with the same statistics."""
    monkeypatch.setattr(commit_engine, "RECENT_BYTES", 4096)
    monkeypatch.setattr(commit_engine, "RECENT_COMMIT_BYTES", 2048)
    repo = Repo.init(tmp_path)
    state = {f"l{i}.w": torch.full((256,), float(i + 1)) for i in range(4)}  # 1 KiB each
    repo.commit(state, env=False)
    assert repo.engine._recent_bytes <= 2048
    for t in state.values():
        t.mul_(2.0)
    cid = repo.commit(state, env=False)
    assert repo.engine._recent_bytes <= 4096
    for i in range(4):
        layer = repo.read_commit(cid).stats["layers"][f"l{i}"]
        assert layer["rel"] == pytest.approx(1.0) and layer["max_abs"] == i + 1


def test_commit_after_another_process_reset_and_collected_its_parent(tmp_path):
    """What a Repo remembers between commits (content fingerprints, payloads for the
    statistics, the pack tables) can go stale when another process moves the ref and
    collects garbage: the next commit still stores every object it needs, records its
    statistics against the ref's new value, and the repository checks clean."""
    repo = Repo.init(tmp_path)
    state = {"l.w": torch.zeros(64, 64), "l.b": torch.ones(64), "m.w": torch.ones(8)}
    first = repo.commit(state, env=False)
    state["l.w"].add_(1.0)
    repo.commit(state, env=False)  # the snapshot the other process makes unreachable
    other = Repo(tmp_path)
    other.reset(first)
    other.gc(grace=0, expire_reflog=True)
    state["m.w"].add_(1.0)  # l.w as in the collected snapshot: known here, gone there
    third = repo.commit(state, env=False)
    assert repo.read_commit(third).parents == (first,)
    stats = repo.read_commit(third).stats
    assert stats["parent"] == first
    assert stats["layers"]["l"]["rel"] == pytest.approx(64 / 8)  # |1 - 0| / |(0, l.b)|
    assert stats["layers"]["m"]["rel"] == pytest.approx(1.0)
    fresh = Repo(tmp_path, verify=True)
    assert fresh.fsck()["ok"]
    assert_same(state, fresh.load(third))


def test_a_snapshot_restored_right_after_its_commit_is_independent_of_it(repo):
    """The payloads a commit keeps for the next one's statistics are never what `load`
    hands out: changing a restored tensor changes neither the store nor a later load."""
    state = {"w": torch.randn(256, 256), "b": torch.randn(8)}  # 256 KiB: packed, mapped
    cid = repo.commit(state, env=False)
    got = repo.load(cid)
    for t in got.values():
        t.add_(1.0)
    again = repo.load(cid)
    assert all(torch.equal(again[k], state[k]) for k in state)
    assert Repo(repo.workdir, verify=True).fsck()["ok"]


def _trained(model, optimizer, seed):
    """One Adam step on `model`, so its weights and the optimizer's moments differ per
    `seed`."""
    torch.manual_seed(seed)
    optimizer.zero_grad()
    model(torch.randn(5, 8)).square().sum().backward()
    optimizer.step()


def test_load_into_moves_nothing(repo):
    model = small_policy()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    saved = []
    for i in range(3):
        _trained(model, optimizer, i)
        repo.commit(model, optimizer, message=f"c{i}", env=False)
        saved.append((_state_copy(model.state_dict()), _state_copy(optimizer.state_dict())))
    head, branch = repo.head(), repo.current_branch()
    reflog, refs = repo.refs.reflog("HEAD"), repo.refs.list()
    target = repo.resolve("HEAD~2")

    other = small_policy(seed=7)
    other_opt = torch.optim.Adam(other.parameters(), lr=0.1)
    assert repo.load_into(other, "HEAD~2", optimizer=other_opt) == target
    assert_same(saved[0][0], other.state_dict())  # bit-exact
    assert_same(saved[0][1]["state"], other_opt.state_dict()["state"])
    assert other_opt.state_dict()["param_groups"] == saved[0][1]["param_groups"]
    # nothing moved: HEAD, its branch, every ref, the reflog; no workspace file written
    assert (repo.head(), repo.current_branch()) == (head, branch)
    assert repo.refs.reflog("HEAD") == reflog and repo.refs.list() == refs
    assert not repo.workspace_path.exists()
    assert repo.resolve("HEAD~2") == target  # relative revisions still mean the same
    # the default is HEAD; an optimizer is optional
    assert repo.load_into(other) == head
    assert_same(saved[2][0], other.state_dict())
    # checkout, git's verb, does move HEAD (documented: load_into is the non-moving way)
    repo.checkout("HEAD~1", model=other)
    assert repo.head() == repo.resolve(f"{head}~1") and repo.current_branch() is None


def _state_copy(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: _state_copy(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_state_copy(v) for v in state]
    return state


def test_load_into_refuses_what_it_cannot_load(repo):
    repo.commit(small_policy(), env=False)
    model = small_policy(seed=1)
    with pytest.raises(VrlError, match="no optimizer state"):
        repo.load_into(model, optimizer=torch.optim.Adam(model.parameters()))
    with pytest.raises(VrlError, match="needs a module or an optimizer"):
        repo.load_into(None)
    with pytest.raises(RevisionError):
        repo.load_into(model, "no-such-rev")


def test_load_into_verifies_and_fetches_a_pruned_snapshot(tmp_path):
    from vrl.remote.config import add_remote, open_named
    from vrl.remote.transfer import push

    repo = Repo.init(tmp_path / "work")
    ids = [repo.commit({"weight": torch.full((4, 3), float(i)), "bias": torch.zeros(4)},
                       env=False) for i in range(3)]
    add_remote(repo, "backup", str(tmp_path / "remote"), create=True)
    store = open_named(repo, "backup")
    push(repo, store, "backup", ["main"])
    store.close()
    repo.prune(keep_last=1)
    repo.gc(grace=0)
    entry = repo.read_manifest(repo.read_commit(ids[0]).manifest).tensors["weight"]
    assert not repo.objects.has(entry.id)
    model = torch.nn.Linear(3, 4)
    assert repo.load_into(model, ids[0]) == ids[0]  # fetched back from the remote
    assert torch.equal(model.weight, torch.zeros(4, 3)) and repo.head() == ids[2]
    # a damaged object fails the load in one error, and the module keeps its weights
    entry = repo.read_manifest(repo.read_commit(ids[2]).manifest).tensors["weight"]
    before = _state_copy(model.state_dict())
    edit_object(repo, entry.id, lambda data: data.__setitem__(-1, data[-1] ^ 0xFF))
    with pytest.raises(CorruptObjectError):
        Repo(repo.workdir).load_into(model, ids[2])
    assert_same(before, model.state_dict())
