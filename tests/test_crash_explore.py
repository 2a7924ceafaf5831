"""Crash testing that explores: generated schedules, crashes at random steps.

test_powercut.py cuts the power at every step of a few fixed scenarios; the hole it missed
(a pack merge removing packs that journal records still needed) needed a scenario nobody
wrote. Here a seeded generator writes the scenarios, in the spirit of ALICE (OSDI '14) and
CrashMonkey/ACE (OSDI '18): commits of random sizes on both sides of every size threshold
(loose objects, external packs, pack size classes, the auto-merge count, the journal's
size - all scaled down, so that a short schedule crosses each several times), tensors
reused or fresh, branches, tags, branches moved back, prune, gc with and without grace,
repack, push to a local remote, fetch from it into a second repository, and reopening.
While a schedule runs under the lazy-fsync layer (tests/lazyfs.py), crashes are taken at
random steps (a quarter of the schedules commit without the journal, in three rounds of
fsync):

- a power cut: the durable tree (what fsync made durable), opened after a reboot (the
  commit journal re-applies every record of its epoch);
- a kill (SIGKILL): the tree as it is on disk at that step - the page cache survives a
  killed process - opened in the same boot (the journal finishes from its materialised
  offset, as the next vrl process would).

At each crash the repository must open, pass fsck, hold on every ref the value of its last
acknowledged move (or of the move in flight), load every acknowledged commit that is not
pruned bit-exactly, keep reflogs that end at their ref's value with no line twice, have
every pushed ref complete on the remote, and take a new commit. Then a torn write (a
loose object, pack, ref or reflog line cut short) is injected, and fsck must report it.

The default run checks a budgeted slice (a few hundred crash points); the `slow` test runs
at least 10,000: `python -m pytest -m slow tests/test_crash_explore.py -n 2`.
"""

from __future__ import annotations

import copy
import os
import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import raw
from lazyfs import LazyFS, rebuild

import vrl.commit_engine as commit_engine
import vrl.direct_io as direct_io
import vrl.journal as journal
import vrl.pack_merge as pack_merge
import vrl.pack_set as pack_set
import vrl.tensor_reader as tensor_reader
from vrl import Repo
from vrl.errors import VrlError
from vrl.remote import pushing, transfer
from vrl.remote.stores import LocalRemote

# every size threshold scaled down (the real ones: MiB), so that schedules of a few dozen
# small commits cross each of them many times
THRESHOLDS = [(pack_set, "PACK_MAX", 8 << 10), (commit_engine, "PACK_MAX", 8 << 10),
              (tensor_reader, "PACK_MAX", 8 << 10),
              (pack_merge, "FRESH_MAX", 4 << 10), (pack_merge, "MERGED_MAX", 48 << 10),
              (pack_merge, "AUTO_MERGE", 3), (direct_io, "DIRECT_MIN", 16 << 10),
              (journal, "EXTERNAL_MIN", 8 << 10), (journal, "JOURNAL_MAX", 48 << 10),
              (journal, "INIT_ROOM", 8 << 10), (journal, "ROOM_MIN", 4 << 10),
              (pushing, "REMOTE_PACK_MAX", 16 << 10), (pushing, "ONE_PACK_MAX", 16 << 10)]
SIZES = [4, 512, 3 << 10, 6 << 10, 12 << 10, 40 << 10]  # bytes of one tensor
NAMES = [f"layer{i}.weight" for i in range(6)]
OPS = {"commit": 20, "branch": 2, "tag": 1, "move-back": 2, "prune": 1, "gc": 1,
       "gc-now": 2, "repack": 1, "push": 2, "fetch": 1, "reopen": 1}


@dataclass
class Model:
    """What has been acknowledged: each ref's value, every commit's state, what was pushed
    and pruned; `inflight` is the operation running (its outcome may or may not stand)."""

    refs: dict[str, str] = field(default_factory=dict)
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    acked: set[str] = field(default_factory=set)  # commits acknowledged (`states` is shared)
    pushed: dict[str, str] = field(default_factory=dict)
    fetched: dict[str, str] = field(default_factory=dict)  # repository b's tracking refs
    pruned: set[str] = field(default_factory=set)
    inflight: tuple[str, Any] | None = None

    def snapshot(self) -> Model:
        return Model(dict(self.refs), self.states, set(self.acked), dict(self.pushed),
                     dict(self.fetched), set(self.pruned), copy.copy(self.inflight))


@dataclass
class Crash:
    kind: str  # "power" or "kill"
    step: int
    op: str
    tree: dict[str, bytes | None]
    model: Model


def real_tree(root: Path) -> dict[str, bytes | None]:
    """The tree as it is on disk (what a killed process leaves)."""
    out: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        for name in dirs:
            out[os.path.normpath(f"{rel}/{name}")] = None
        for name in files:
            with open(f"{folder}/{name}", "rb") as f:
                out[os.path.normpath(f"{rel}/{name}")] = f.read()
    return out


class Schedule:
    """One generated schedule, run under the lazy-fsync layer, taking crashes."""

    def __init__(self, seed: int, work: Path, ops: int, crash_rate: float) -> None:
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.work = work
        self.ops = ops
        self.crash_rate = crash_rate
        self.model = Model()
        self.crashes: list[Crash] = []
        self.branches = ["main"]
        self.last: dict[str, torch.Tensor] = {}
        self.counter = 0
        self._last_power: Any = None

    def state(self) -> dict[str, torch.Tensor]:
        names = self.rng.sample(NAMES, self.rng.randint(1, 4))
        out = {}
        for name in names:
            if name in self.last and self.rng.random() < 0.5:
                out[name] = self.last[name]  # unchanged: stored once
            else:
                numel = max(1, self.rng.choice(SIZES) // 4)
                out[name] = torch.randn(numel, generator=self.gen)
        self.last.update(out)
        return out

    def on_step(self, lazy: LazyFS, op: str) -> None:
        if self.rng.random() >= self.crash_rate:
            return
        if self.rng.random() < 0.5:
            tree = lazy.durable_tree()
            key = (tree, self.model.refs, self.model.inflight)
            if key == self._last_power:
                return  # the same durable state as the last power cut: nothing new
            self._last_power = key
            self.crashes.append(Crash("power", len(lazy.steps), op, tree,
                                      self.model.snapshot()))
        else:
            self.crashes.append(Crash("kill", len(lazy.steps), op, real_tree(self.work),
                                      self.model.snapshot()))

    def run(self, monkeypatch: pytest.MonkeyPatch) -> None:
        repo = Repo.init(self.work / "repo")
        if self.rng.random() < 0.25:  # the three rounds of fsync, without the journal
            repo.config.set("core", "journal", "false")
            repo.config.save()
            repo = Repo(self.work / "repo")
        lazy = LazyFS(self.work)
        lazy.on_step = lambda op: self.on_step(lazy, op)
        with lazy.installed(monkeypatch):
            for _ in range(self.ops):
                op = self.rng.choices(list(OPS), weights=list(OPS.values()))[0]
                try:
                    repo = self.apply(repo, op)
                except VrlError:
                    pass  # refused (not acknowledged): it must have changed nothing
                self.model.inflight = None
            repo.sync()

    def pick_commit(self) -> str | None:
        return self.rng.choice(sorted(self.model.states)) if self.model.states else None

    def apply(self, repo: Repo, op: str) -> Repo:
        model = self.model
        self.counter += 1
        if op == "commit":
            ref = f"refs/heads/{self.rng.choice(self.branches)}"
            state = self.state()
            model.inflight = ("commit", (ref, model.refs.get(ref)))
            cid = repo.commit(state, message=f"c{self.counter}", env=False, ref=ref)
            model.states[cid] = state
            model.acked.add(cid)
            model.refs[ref] = cid
        elif op in ("branch", "tag"):
            cid = self.pick_commit()
            if cid is None:
                return repo
            name = f"{op[0]}{self.counter}"
            ref = f"refs/{'heads' if op == 'branch' else 'tags'}/{name}"
            model.inflight = ("set", (ref, cid))
            (repo.branch if op == "branch" else repo.tag)(name, cid)
            model.refs[ref] = cid
            if op == "branch":
                self.branches.append(name)
        elif op == "move-back":
            branch = self.rng.choice(self.branches)
            ref = f"refs/heads/{branch}"
            chain = repo.first_parent_chain(model.refs[ref]) if ref in model.refs else []
            if len(chain) < 2:
                return repo
            target = chain[self.rng.randint(1, min(3, len(chain) - 1))]
            model.inflight = ("set", (ref, target))
            repo.branch(branch, target, force=True)
            model.refs[ref] = target
        elif op == "prune":
            model.inflight = ("prune", None)
            model.pruned |= set(repo.prune(keep_last=self.rng.randint(1, 3)))
        elif op in ("gc", "gc-now"):
            model.inflight = ("gc", None)
            repo.gc(grace=0 if op == "gc-now" else None)
        elif op == "repack":
            model.inflight = ("repack", None)
            repo.repack()
        elif op == "push":
            heads = sorted(r for r in model.refs if r.startswith("refs/heads/"))
            if not heads:
                return repo
            model.inflight = ("push", {r: model.refs[r] for r in heads})
            transfer.push(repo, LocalRemote(self.work / "remote"), "origin", heads,
                          force=True, jobs=1, create=True)
            model.pushed.update({r: model.refs[r] for r in heads})
            model.refs.update({tracking(r): model.refs[r] for r in heads})
        elif op == "fetch":  # into a second repository, b (made by the first fetch)
            if not model.pushed:
                return repo
            model.inflight = ("fetch", {tracking(r): v for r, v in model.pushed.items()})
            if not (self.work / "b/.vrl").exists():
                Repo.init(self.work / "b")
            transfer.fetch(Repo(self.work / "b"), LocalRemote(self.work / "remote"), "origin",
                           jobs=1)
            model.fetched.update({tracking(r): v for r, v in model.pushed.items()})
        elif op == "reopen":  # as the next process would
            repo.sync()
            repo = Repo(self.work / "repo")
        return repo


def check_crash(crash: Crash, where: Path, rng: random.Random, boot: str | None,
                monkeypatch: pytest.MonkeyPatch, deep: bool) -> list[str]:
    """Rebuild the crash's tree and check it (see the module's docstring); `deep`: also
    fetch the remote whole, commit anew and inject a torn write."""
    rebuild(crash.tree, where)
    if crash.kind == "kill":  # the killed process is this one, still alive: its locks are
        owner = f"{os.getpid()} ".encode()  # a dead process's (pid_max is below this one)
        for lock in where.rglob("*.lock"):
            if lock.read_bytes().startswith(owner):
                lock.write_bytes(b"999999999 " + lock.read_bytes()[len(owner):])
    model = crash.model
    booted = "booted-again" if crash.kind == "power" else boot
    with monkeypatch.context() as patch:
        patch.setattr(journal, "boot_id", lambda: booted)
        try:
            repo = Repo(where / "repo", verify=True)
            report = repo.fsck()
        except Exception as exc:  # noqa: BLE001 - any failure to open is the finding
            return [f"does not open or check: {type(exc).__name__}: {exc}"]
        problems = list(report["problems"])
        problems += _check_refs(repo, model)
        problems += _check_commits(repo, model)
        problems += _check_reflogs(repo)
        problems += _check_fetched(where, model)
        if deep and not problems:
            problems += _check_remote(where, model)
            problems += _check_next_commit(repo)
            problems += _check_torn_write(where / "repo", rng)
    return problems


def tracking(head: str) -> str:
    return f"refs/remotes/origin/{head[len('refs/heads/'):]}"


def _allowed(model: Model, ref: str) -> Callable[[Repo, str | None], bool]:
    """Which values `ref` may hold after the crash."""
    values = {model.refs.get(ref)}
    kind, arg = model.inflight or ("", None)
    if kind == "set" and arg[0] == ref:
        values.add(arg[1])
    if kind == "push":  # its remote-tracking refs move with the remote's
        values |= {value for head, value in arg.items() if tracking(head) == ref}
    if kind == "commit" and arg[0] == ref:  # the commit in flight may have landed
        def landed(repo: Repo, value: str | None) -> bool:
            try:
                parents = repo.read_commit(value).parents if value else []
            except VrlError:
                return False
            return (parents[:1] or [None])[0] == arg[1]
        return lambda repo, value: value in values or landed(repo, value)
    return lambda repo, value: value in values


def _check_refs(repo: Repo, model: Model) -> list[str]:
    problems = []
    names = set(model.refs) | set(repo.refs.list()) | set(repo.refs.damaged())
    for ref in sorted(names):
        try:
            value = repo.refs.read(ref)
        except VrlError as exc:
            problems.append(f"{ref}: {exc}")
            continue
        if not _allowed(model, ref)(repo, value):
            problems.append(f"{ref} holds {str(value)[:12]}, acknowledged "
                            f"{str(model.refs.get(ref))[:12]} (in flight: {model.inflight})")
    return problems


def _check_commits(repo: Repo, model: Model) -> list[str]:
    problems = []
    pruned = repo.pruned()
    prune_inflight = (model.inflight or ("",))[0] == "prune"
    for cid in model.acked:
        if cid in model.pruned or (prune_inflight and cid in pruned):
            continue  # its tensors may be gone by design
        try:
            got = repo.load(cid)
            for name, tensor in model.states[cid].items():
                if raw(got[name]) != raw(tensor):
                    problems.append(f"commit {cid[:12]}: {name} differs")
        except Exception as exc:  # noqa: BLE001
            problems.append(f"acknowledged commit {cid[:12]}: {type(exc).__name__}: {exc}")
    return problems


def _check_reflogs(repo: Repo) -> list[str]:
    problems = []
    for name in repo.refs.all_logs():
        path = repo.refs._log_path(name)
        lines = path.read_bytes().splitlines() if path.exists() else []
        if len(set(lines)) != len(lines):
            problems.append(f"logs/{name} holds a line twice")
        if name == "HEAD":
            continue
        try:
            value = repo.refs.read(name)
        except VrlError:
            continue  # reported with the refs
        log = repo.refs.reflog(name)
        if value and (not log or value not in (log[0].new, log[0].old)):
            problems.append(f"reflog of {name} does not end at its value {value[:12]}")
    return problems


def _check_remote(where: Path, model: Model) -> list[str]:
    """Every ref on the remote names a complete commit (a fresh fetch verifies every
    object behind every ref), and holds what was pushed (or the push in flight)."""
    store = LocalRemote(where / "remote", fsync=False)
    if store.state() != "store":
        return [] if not model.pushed else ["remote: gone after an acknowledged push"]
    fresh = Repo.init(where / "fresh")
    try:
        transfer.fetch(fresh, store, "origin", jobs=1)
    except Exception as exc:  # noqa: BLE001
        return [f"remote: a fresh fetch fails: {type(exc).__name__}: {exc}"]
    problems = []
    kind, arg = model.inflight or ("", None)
    for ref, cid in model.pushed.items():
        got = fresh.refs.read(tracking(ref))
        if got != cid and not (kind == "push" and arg.get(ref) == got):
            problems.append(f"remote {ref} holds {str(got)[:12]}, pushed {cid[:12]}")
        elif got is not None and got in model.states and got not in model.pruned:
            loaded = fresh.load(got)
            if any(raw(loaded[k]) != raw(v) for k, v in model.states[got].items()):
                problems.append(f"remote {ref}: commit {got[:12]} differs")
    return problems


def _check_fetched(where: Path, model: Model) -> list[str]:
    """Repository b: it passes fsck, and each remote-tracking ref a fetch acknowledged
    holds that value (or the fetch's in flight) and loads bit-exactly."""
    if not model.fetched:
        return []
    try:
        other = Repo(where / "b", verify=True)
        problems = [f"b: {p}" for p in other.fsck()["problems"]]
    except Exception as exc:  # noqa: BLE001
        return [f"b: does not open or check: {type(exc).__name__}: {exc}"]
    kind, arg = model.inflight or ("", None)
    for ref, cid in model.fetched.items():
        got = other.refs.read(ref)
        if got != cid and not (kind == "fetch" and arg.get(ref) == got):
            problems.append(f"b's {ref} holds {str(got)[:12]}, fetched {cid[:12]}")
        elif got is not None and got not in model.pruned:
            loaded = other.load(got)
            if any(raw(loaded[k]) != raw(v) for k, v in model.states[got].items()):
                problems.append(f"b's {ref}: commit {got[:12]} differs")
    return problems


def _check_next_commit(repo: Repo) -> list[str]:
    """The repository is not jammed: a new commit lands on main and passes fsck."""
    try:
        before = repo.refs.read("refs/heads/main")
        cid = repo.commit({"next": torch.arange(7.0)}, message="after", env=False,
                          ref="refs/heads/main")
        repo.sync()
        if list(repo.read_commit(cid).parents[:1]) != ([before] if before else []):
            return ["the commit after the crash did not follow main"]
        report = repo.fsck()
        return [f"after a new commit: {p}" for p in report["problems"]]
    except Exception as exc:  # noqa: BLE001
        return [f"a commit after the crash fails: {type(exc).__name__}: {exc}"]


def _check_torn_write(root: Path, rng: random.Random) -> list[str]:
    """Cut one file fsck vouches for short, as a torn write would; fsck must say so."""
    vrl_dir = root / ".vrl"
    def vouched(folder: str) -> list[Path]:  # (not a temporary file a kill left)
        return [p for p in (vrl_dir / folder).rglob("*") if p.is_file() and p.stat().st_size
                and not p.name.startswith(".tmp-") and not p.name.endswith(".lock")]

    files = [p for p in vouched("objects") if p.suffix == ".pack" or len(p.parent.name) == 2]
    refs = vouched("refs")
    files += refs
    logs = vouched("logs")
    target = rng.choice(files + logs)
    data = target.read_bytes()
    if target in logs:  # inside a line: a prefix ending at a line's end is a valid log
        ends = {i + 1 for i, b in enumerate(data) if b == 0x0A}
        cut = rng.choice([i for i in range(1, len(data)) if i not in ends] or [0])
    else:  # (a ref cut before its newline only is whole)
        cut = rng.randrange(len(data.rstrip()) if target in files[-len(refs):] else len(data))
    target.write_bytes(data[:cut])
    report = Repo(root).fsck()
    rel = target.relative_to(vrl_dir).as_posix()
    if report["ok"] and not report["warnings"]:
        return [f"fsck did not notice {rel} cut from {len(data)} to {cut} bytes"]
    return []


def explore(seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ops: int,
            crash_rate: float) -> tuple[Counter, list[str]]:
    """Run one schedule and check its crashes; (counts of what was checked, failures)."""
    for module, name, value in THRESHOLDS:
        monkeypatch.setattr(module, name, value)
    schedule = Schedule(seed, tmp_path / "work", ops, crash_rate)
    (tmp_path / "work").mkdir(parents=True)
    schedule.run(monkeypatch)
    boot = journal.boot_id()
    rng = random.Random(seed ^ 0x5EED)
    counts: Counter = Counter()
    failures = []
    for i, crash in enumerate(schedule.crashes):
        where = tmp_path / f"crash{i}"
        deep = i % 4 == 0
        problems = check_crash(crash, where, rng, boot, monkeypatch, deep=deep)
        shutil.rmtree(where, ignore_errors=True)
        counts[crash.kind] += 1
        counts["torn writes"] += deep and not problems
        counts["acknowledged commits checked"] += len(crash.model.acked)
        if problems:
            counts["failing"] += 1
            failures.append(f"seed {seed}, {crash.kind} before step {crash.step} "
                            f"({crash.op}, in flight {crash.model.inflight}): {problems[:3]}")
    return counts, failures


@pytest.mark.parametrize("seed", range(8))
def test_generated_schedules_lose_nothing_at_any_crash(tmp_path, monkeypatch, seed):
    """The default run's slice: 8 schedules of 40 operations, ~40 crashes each."""
    counts, failures = explore(seed, tmp_path, monkeypatch, ops=40, crash_rate=0.04)
    assert counts["power"] + counts["kill"] >= 10
    assert not failures, "\n".join(failures[:5])


@pytest.mark.slow
@pytest.mark.parametrize("part", range(20))
def test_ten_thousand_crash_points(tmp_path, monkeypatch, part):
    """At least 10,000 crash points over 20 parts of at least 500 (run with -n 2 -s)."""
    counts: Counter = Counter()
    failures: list[str] = []
    seed = 1000 + part * 1000
    while counts["power"] + counts["kill"] < 500:
        found, failed = explore(seed, tmp_path / str(seed), monkeypatch, ops=60,
                                crash_rate=0.08)
        counts += found
        failures += failed
        seed += 1
    print(f"part {part}: {dict(counts)}")
    assert not failures, "\n".join(failures[:5])
