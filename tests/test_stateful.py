"""A Hypothesis state machine drives commit / branch / checkout / reset / tag / prune / gc /
repack against a simple in-memory model of the expected history, and after every step checks
that refs, `log`, the reflog-reachable set kept by `gc`, the pruned set, and every snapshot
(or its refusal once pruning freed it) agree with the model. Commits write packs (their
small tensors and manifest) and loose objects (1 MiB tensors); gc rewrites packs; repack
merges them."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vrl import Repo
from vrl.errors import PrunedError, RefConflictError, RevisionError, VrlError, WorkspaceError

# Tensors are shared by every example (so the repo's "unchanged since committed" cache is
# exercised); "a" tensors are big enough (> 1 MiB) to be loose files, memory-mapped.
POOL_A = [torch.randn(512, 520, generator=torch.Generator().manual_seed(k)) for k in range(3)]
POOL_B = [
    torch.tensor(-7, dtype=torch.int8),  # 0-d
    torch.empty(0, 4, dtype=torch.float16),  # empty
    torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
    torch.tensor([True, False, True]),
]
BRANCHES = ["main", "dev", "v1", "feat-x"]
TAGS = ["v1", "dev", "best"]  # "v1" and "dev" can be a branch and a tag at once


def expected_state(key: tuple[int, int, int, int]) -> dict[str, torch.Tensor]:
    a, b, c, live = key
    return {
        "a.weight": POOL_A[a],
        "a.view": POOL_A[a][::2, ::3],  # non-contiguous view of the same storage
        "b.buf": POOL_B[b],
        "c.step": torch.tensor(c),
        "live.weight": torch.full((128, 128), float(live)),
    }


def contents(key: tuple[int, int, int, int]) -> set[tuple[str, int]]:
    """Which tensor objects a snapshot needs: every field's bytes follow from one number."""
    a, b, c, live = key
    return {("a.weight", a), ("a.view", a), ("b.buf", b), ("c.step", c), ("live.weight", live)}


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


class Model:
    """What the repository should look like."""

    def __init__(self) -> None:
        self.commits: dict[str, tuple[str | None, tuple]] = {}  # id -> (parent, state key)
        self.branches: dict[str, str] = {}
        self.tags: dict[str, str] = {}
        self.head_branch: str | None = "main"  # None: detached
        self.detached: str | None = None
        self.logs: dict[str, set[str]] = {}  # reflog name -> ids it mentions
        self.pruned: set[str] = set()  # commits whose tensors retention released
        self.stored: set[tuple[str, int]] = set()  # tensor contents in the store

    def restorable(self, oid: str) -> bool:
        return contents(self.commits[oid][1]) <= self.stored

    def tips(self) -> set[str]:
        return {*self.branches.values(), *self.tags.values(), *filter(None, [self.head()])}

    def prune(self, keep_last: int, only: str | None) -> list[str]:
        """Retention's rule: keep tips, tags, HEAD and each branch's last `keep_last`."""
        kept = self.tips()
        for tip in self.branches.values():
            kept.update(self.chain(tip)[:keep_last])
        targets = [self.branches[only]] if only else [self.branches[b]
                                                       for b in sorted(self.branches)]
        newly: list[str] = []
        for tip in targets:
            for oid in self.chain(tip):
                if oid not in kept and oid not in self.pruned and oid not in newly:
                    newly.append(oid)
        self.pruned.update(newly)
        return newly

    def point_at(self, oid: str, keep: bool) -> bool:
        """A ref is about to move to `oid`: False if vrl must refuse (pruned and freed);
        with `keep` (a branch or tag), a pruned snapshot is un-pruned."""
        if oid in self.pruned and not self.restorable(oid):
            return False
        if keep:
            self.pruned.discard(oid)
        return True

    def head(self) -> str | None:
        return self.branches.get(self.head_branch) if self.head_branch else self.detached

    def chain(self, oid: str | None) -> list[str]:
        out = []
        while oid is not None:
            out.append(oid)
            oid = self.commits[oid][0]
        return out

    def resolve(self, rev: str) -> str:
        """Git's order: HEAD, full id, refs/tags/<name>, refs/heads/<name>, id prefix;
        then ~n / ^."""
        base, _, up = rev.partition("~")
        if base.endswith("^"):
            base, up = base[:-1], "1"
        if base == "HEAD":
            oid = self.head()
        elif base in self.commits:
            oid = base
        elif base in self.tags:
            oid = self.tags[base]
        elif base in self.branches:
            oid = self.branches[base]
        else:
            (oid,) = [c for c in self.commits if c.startswith(base)]
        for _ in range(int(up or 0)):
            oid = self.commits[oid][0]
        assert oid is not None
        return oid

    def log_append(self, name: str, old: str | None, new: str | None) -> None:
        self.logs.setdefault(name, set()).update(x for x in (old, new) if x)

    def move(self, ref: str, new: str | None) -> None:
        """A ref update as RefStore.update does it: the ref's reflog, and HEAD's when HEAD
        is attached to that branch; deleting a ref deletes its reflog."""
        kind, _, name = ref.partition(":")
        table = self.branches if kind == "branch" else self.tags
        full = f"refs/heads/{name}" if kind == "branch" else f"refs/tags/{name}"
        old = table.get(name)
        if new is None:
            del table[name]
            self.logs.pop(full, None)
            return
        table[name] = new
        self.log_append(full, old, new)
        if kind == "branch" and self.head_branch == name:
            self.log_append("HEAD", old, new)

    def live(self) -> set[str]:
        """Commits gc must keep: reachable from refs, HEAD or any reflog entry."""
        roots = {*self.branches.values(), *self.tags.values(), *filter(None, [self.head()])}
        for ids in self.logs.values():
            roots |= ids
        out: set[str] = set()
        for root in roots:
            out.update(self.chain(root))
        return out


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="vrl-stateful-")
        # Commits go through the commit journal (fsync on), with the fsyncs themselves
        # made no-ops for speed (atomicity is unaffected); `reboot` changes the boot id.
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(os, "fsync", lambda fd: None)
        self.patch.setattr(os, "fdatasync", lambda fd: None)
        self.boot = 0
        self.patch.setattr("vrl.journal.boot_id", lambda: f"boot-{self.boot}")
        self.repo = Repo.init(self.dir)
        assert self.repo._journaled
        self.model = Model()
        self.live = torch.zeros(128, 128)  # mutated in place between commits
        self.live_version = 0
        self.counter = 0

    def teardown(self) -> None:
        self.repo.sync()  # (a commit's files are written in the background)
        self.patch.undo()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ---------------------------------------------------------------- helpers
    def revisions(self) -> list[str]:
        m = self.model
        revs = list(m.commits) + [c[:12] for c in m.commits]  # in creation order
        revs += sorted(m.branches) + sorted(m.tags)
        head = m.head()
        if head:
            revs.append("HEAD")
            if m.commits[head][0]:
                revs += ["HEAD~1", "HEAD^"]
        return revs

    def draw_rev(self, data) -> str:
        return data.draw(st.sampled_from(self.revisions()), label="rev")

    def has_commits(self) -> bool:
        return bool(self.model.commits)

    # ---------------------------------------------------------------- rules
    @rule(a=st.integers(0, 2), b=st.integers(0, 3), c=st.integers(0, 2),
          allow_empty=st.booleans())
    def commit(self, a, b, c, allow_empty):
        key = (a, b, c, self.live_version)
        state = expected_state(key)
        state["live.weight"] = self.live
        m = self.model
        parent = m.head()
        self.counter += 1
        # a fixed clock makes ids (and so every draw that picks among them) reproducible
        when = f"2026-01-01T00:00:00.{self.counter:06d}Z"
        if parent is not None and m.commits[parent][1] == key and not allow_empty:
            with pytest.raises(WorkspaceError, match="nothing changed"):
                self.repo.commit(state, env=False, message=f"c{self.counter}", time=when)
            return
        cid = self.repo.commit(state, env=False, message=f"c{self.counter}",
                               allow_empty=allow_empty, time=when)
        assert cid not in m.commits
        m.commits[cid] = (parent, key)
        m.stored |= contents(key)
        if m.head_branch:
            m.move(f"branch:{m.head_branch}", cid)
        else:
            m.log_append("HEAD", m.detached, cid)
            m.detached = cid

    @rule()
    def mutate_live_tensor(self):
        self.live.add_(1)  # in place: the version counter tells the store it changed
        self.live_version += 1

    @precondition(has_commits)
    @rule(name=st.sampled_from(BRANCHES), switch=st.booleans(), data=st.data())
    def create_branch(self, name, switch, data):
        rev = self.draw_rev(data)
        m = self.model
        if name in m.branches:
            with pytest.raises(RefConflictError, match="already exists"):
                if switch:
                    self.repo.checkout(rev, create_branch=name)
                else:
                    self.repo.branch(name, rev)
            return
        oid = m.resolve(rev)
        if not m.point_at(oid, keep=True):
            with pytest.raises(PrunedError, match="freed its tensors"):
                if switch:
                    self.repo.checkout(rev, create_branch=name)
                else:
                    self.repo.branch(name, rev)
            return
        if switch:
            assert self.repo.checkout(rev, create_branch=name) == oid
            old_head = m.head()
            m.move(f"branch:{name}", oid)
            m.head_branch, m.detached = name, None
            m.log_append("HEAD", old_head, oid)
        else:
            assert self.repo.branch(name, rev) == oid
            m.move(f"branch:{name}", oid)

    @rule(name=st.sampled_from(BRANCHES))
    def delete_branch(self, name):
        m = self.model
        if name == m.head_branch:
            with pytest.raises(VrlError, match="HEAD is on it"):
                self.repo.delete_branch(name)
        elif name not in m.branches:
            with pytest.raises(RevisionError, match="not found"):
                self.repo.delete_branch(name)
        else:
            assert self.repo.delete_branch(name) == m.branches[name]
            m.move(f"branch:{name}", None)

    @precondition(has_commits)
    @rule(data=st.data())
    def checkout(self, data):
        rev = self.draw_rev(data)
        m = self.model
        old_head = m.head()
        oid = m.branches[rev] if rev in m.branches else m.resolve(rev)
        if not m.point_at(oid, keep=False):
            with pytest.raises(PrunedError, match="freed its tensors"):
                self.repo.checkout(rev)
            return
        if rev in m.branches:  # a branch name attaches HEAD, even if a tag has that name
            m.head_branch, m.detached = rev, None
        else:
            m.head_branch, m.detached = None, oid
        assert self.repo.checkout(rev) == oid
        m.log_append("HEAD", old_head, oid)

    @precondition(has_commits)
    @rule(data=st.data())
    def reset(self, data):
        rev = self.draw_rev(data)
        m = self.model
        oid = m.resolve(rev)
        if not m.point_at(oid, keep=m.head_branch is not None):
            with pytest.raises(PrunedError, match="freed its tensors"):
                self.repo.reset(rev)
            return
        old, new = self.repo.reset(rev)
        assert (old, new) == (m.head(), oid)
        if m.head_branch:
            m.move(f"branch:{m.head_branch}", oid)
        else:
            m.log_append("HEAD", m.detached, oid)
            m.detached = oid

    @precondition(has_commits)
    @rule(name=st.sampled_from(TAGS), force=st.booleans(), data=st.data())
    def tag(self, name, force, data):
        rev = self.draw_rev(data)
        m = self.model
        if name in m.tags and not force:
            with pytest.raises(RefConflictError, match="already exists"):
                self.repo.tag(name, rev)
            return
        oid = m.resolve(rev)
        if not m.point_at(oid, keep=True):
            with pytest.raises(PrunedError, match="freed its tensors"):
                self.repo.tag(name, rev, force=force)
            return
        assert self.repo.tag(name, rev, force=force) == oid
        m.move(f"tag:{name}", oid)

    @rule(name=st.sampled_from(TAGS))
    def delete_tag(self, name):
        m = self.model
        if name not in m.tags:
            with pytest.raises(RevisionError, match="not found"):
                self.repo.delete_tag(name)
            return
        assert self.repo.delete_tag(name) == m.tags[name]
        m.move(f"tag:{name}", None)

    @rule(name=st.sampled_from(TAGS), a=st.integers(0, 2), b=st.integers(0, 3),
          then_gc=st.booleans())
    def tag_a_side_run(self, name, a, b, then_gc):
        """A run on a branch of its own, its result tagged, the branch deleted: only the tag
        and its reflog reach it; with `then_gc`, every reflog is expired too (gc must keep
        what a tag alone reaches)."""
        m = self.model
        key = (a, b, 2, self.live_version)
        state = expected_state(key)
        state["live.weight"] = self.live
        self.counter += 1
        cid = self.repo.commit(state, env=False, message=f"side {self.counter}",
                               ref="refs/heads/side",
                               time=f"2026-01-01T00:00:00.{self.counter:06d}Z")
        m.commits[cid] = (None, key)
        m.stored |= contents(key)
        m.move("branch:side", cid)
        assert self.repo.tag(name, "side", force=True) == cid
        m.move(f"tag:{name}", cid)
        assert self.repo.delete_branch("side") == cid
        m.move("branch:side", None)
        if then_gc:
            self.gc(expire_reflog=True, other=False)

    @rule(expire_reflog=st.booleans(), other=st.booleans())
    def gc(self, expire_reflog, other):
        """`other`: another process collects, so this one's pack index goes stale."""
        m = self.model
        (Repo(self.dir) if other else self.repo).gc(grace=0, expire_reflog=expire_reflog)
        if expire_reflog:
            m.logs.clear()
        live = m.live()
        assert set(Repo(self.dir).iter_commits()) == live, "gc kept or removed the wrong commits"
        for oid in set(m.commits) - live:
            del m.commits[oid]
        # tensors stay while a kept snapshot, or a ref or HEAD (even on a pruned one), needs them
        tips = m.tips()
        m.stored &= set().union(*(contents(m.commits[c][1]) for c in live
                                  if c not in m.pruned or c in tips))
        m.pruned &= live

    @precondition(has_commits)
    @rule(keep_last=st.integers(1, 2), only=st.sampled_from([None, *BRANCHES]),
          then_gc=st.booleans())
    def prune(self, keep_last, only, then_gc):
        m = self.model
        if only is not None and only not in m.branches:
            return
        refs = [f"refs/heads/{only}"] if only else None
        assert self.repo.prune(keep_last=keep_last, refs=refs) == m.prune(keep_last, only)
        if then_gc:  # free at once, keeping the reflog: later steps meet freed snapshots
            self.gc(expire_reflog=False, other=False)

    @rule(other=st.booleans())
    def repack(self, other):
        """Merge every pack and small loose object (commits too) into one pack."""
        (Repo(self.dir) if other else self.repo).repack()
        assert len(list((self.repo.vrl_dir / "objects" / "pack").glob("pack-*.pack"))) <= 1

    @rule()
    def reopen(self):
        self.repo = Repo(self.dir)  # forget every in-process cache

    @rule()
    def reboot(self):
        """Opened after a reboot: every record still in the commit journal is applied
        again, onto files that are all in place (replay must change nothing)."""
        self.boot += 1
        self.repo = Repo(self.dir)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def repository_matches_model(self):
        m = self.model
        repo = Repo(self.dir, verify=True)
        assert repo.branches() == m.branches
        assert repo.tags() == m.tags
        assert repo.head() == m.head()
        assert repo.current_branch() == m.head_branch
        for name, tip in m.branches.items():
            assert [e.id for e in repo.log(f"refs/heads/{name}")] == m.chain(tip), name
        assert [e.id for e in repo.log()] == m.chain(m.head())
        assert repo.pruned() == m.pruned
        for oid, (parent, key) in m.commits.items():
            commit = repo.read_commit(oid)
            assert commit.parents == ((parent,) if parent else ())
            if not m.restorable(oid):
                assert oid in m.pruned and oid not in m.tips()
                with pytest.raises(PrunedError):
                    repo.load(oid)
                continue
            got = repo.load(oid)
            want = expected_state(key)
            assert list(got) == list(want)
            for name, t in want.items():
                assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
                assert raw(got[name]) == raw(t), (oid[:12], name)
        report = repo.fsck()
        assert report["ok"], report["problems"]


StoreMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow], print_blob=True,
)
test_store_state_machine = StoreMachine.TestCase


def test_checkout_of_a_name_that_is_a_branch_and_a_tag(tmp_path, capsys, monkeypatch):
    """Found by the state machine: `checkout dev` attached HEAD to branch dev but returned
    (and the CLI wrote to the workspace) the snapshot of *tag* dev. Git's rule: a branch
    name given to checkout means the branch."""
    from vrl.cli import main
    from vrl.workspace import read_checkpoint

    repo = Repo.init(tmp_path)
    old = repo.commit({"w": torch.zeros(3)}, env=False, message="old")
    repo.tag("dev")
    new = repo.commit({"w": torch.ones(3)}, env=False, message="new")
    repo.branch("dev")
    repo.checkout(old)
    assert repo.resolve("dev") == old  # a revision resolves tags first, as in git
    assert repo.checkout("dev") == new
    assert (repo.head(), repo.current_branch()) == (new, "dev")
    repo.checkout(old)
    monkeypatch.chdir(tmp_path)
    assert main(["checkout", "dev", "--force"]) == 0
    assert "Switched to branch 'dev'" in capsys.readouterr().out
    assert torch.equal(read_checkpoint(tmp_path / "policy.safetensors")["w"], torch.ones(3))
