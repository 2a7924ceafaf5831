"""Layer statistics of a commit: computed from the bytes just hashed, while the big
tensors' writes and fsyncs are in flight, and recomputed if the parent moved meanwhile."""

import torch

from vrl import Repo
from vrl.diff import compare


def state(seed: float) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"layer.weight": torch.randn(1024, 512, generator=g) + seed,  # 2 MiB: loose
            "layer.bias": torch.full((8,), seed)}


def test_new_tensors_are_not_read_back_from_the_store(repo, monkeypatch):
    repo.commit(state(0.0), env=False)
    mapped = []  # objects read back from the store, by either way of opening one
    for name in ("map_payload", "open_payload"):
        real = getattr(repo.objects, name)
        monkeypatch.setattr(repo.objects, name, lambda oid, kind=None, real=real:
                            (mapped.append(oid), real(oid, kind))[1])
    cid = repo.commit(state(1.0), env=False)
    new = repo.read_manifest(repo.read_commit(cid).manifest).tensors["layer.weight"].id
    assert new not in mapped  # read from memory: its file may not be written yet
    assert mapped  # the parent's weight is mapped from the store
    stored = repo.read_commit(cid).stats
    assert numbers(stored) == numbers(recomputed(repo.workdir, stored["parent"], cid))
    assert stored["layers"]["layer"]["rel"] > 0


def numbers(stats):
    return {name: (layer["status"], layer["rel"], layer["max_abs"], layer["material"])
            for name, layer in stats["layers"].items()}


def recomputed(path, parent, cid):
    """The statistics a fresh process computes from the store alone."""
    fresh = Repo(path)
    return compare(fresh.read_manifest(fresh.read_commit(parent).manifest),
                   fresh.read_manifest(fresh.read_commit(cid).manifest), fresh.read_tensor,
                   threshold=fresh.threshold).to_json()


def test_statistics_follow_a_parent_that_moved_during_the_commit(repo, monkeypatch):
    repo.commit(state(0.0), env=False)
    other = Repo(repo.workdir)
    real_sync = repo.objects.sync
    moved = []

    def sync_and_race() -> None:  # another process commits while our fsyncs run
        if not moved:
            moved.append(other.commit(state(5.0), env=False))
        real_sync()

    monkeypatch.setattr(repo.objects, "sync", sync_and_race)
    cid = repo.commit(state(1.0), env=False)
    commit = repo.read_commit(cid)
    assert commit.parents == (moved[0],)
    assert commit.stats["parent"] == moved[0]
    assert numbers(commit.stats) == numbers(recomputed(repo.workdir, moved[0], cid))


def test_the_committer_reads_no_parent_back_and_its_statistics_match_the_store(
        repo, monkeypatch):
    """The Snapshotter's committer keeps the last snapshot's big tensors in memory (its
    shared memory is reused) and lends them to the next snapshot's statistics: with big
    tensors changed, unchanged, resized, retyped and removed, no parent is read back from
    the store, and every commit's statistics are those computed from the store alone."""
    from vrl.hooks import Snapshotter
    from vrl.object_store import FileObjectStore

    mapped: list[str] = []
    for name in ("map_payload", "open_payload", "map_loose_tensor"):
        real = getattr(FileObjectStore, name)
        monkeypatch.setattr(FileObjectStore, name, lambda self, oid, *a, real=real:
                            (mapped.append(oid), real(self, oid, *a))[1])
    g = torch.Generator().manual_seed(1)
    live = {"a.weight": torch.randn(600, 512, generator=g),  # 1.2 MB: loose, kept
            "a.bias": torch.randn(512, generator=g),
            "b.weight": torch.randn(700, 512, generator=g, dtype=torch.float64)}
    steps = [lambda s: s["a.weight"].mul_(1.01),
             lambda s: s["a.bias"].add_(1.0),  # a.weight unchanged in a moved layer
             lambda s: s["b.weight"].add_(s["b.weight"].sign() * 1e-3),
             lambda s: s.update({"b.weight": s["b.weight"].float()}),  # retyped
             lambda s: s.update({"a.weight": torch.randn(601, 512, generator=g)}),
             lambda s: s.pop("b.weight"),
             lambda s: s["a.weight"].sub_(0.5)]
    with Snapshotter(repo, live, include_rng=False, committer="thread") as snap:
        snap.step(0)
        snap.flush()
        for i, change in enumerate(steps, 1):
            with torch.no_grad():
                change(live)
            snap.step(i)
            snap.flush()
    commits = snap.commits
    assert len(commits) == len(steps) + 1
    ids = {e.id for cid in commits
           for e in repo.read_manifest(repo.read_commit(cid).manifest).tensors.values()}
    assert not ids & set(mapped), "a parent was read back from the store"
    for parent, cid in zip(commits[:-1], commits[1:], strict=True):
        stored = repo.read_commit(cid).stats
        assert stored["parent"] == parent
        assert numbers(stored) == numbers(recomputed(repo.workdir, parent, cid))
