"""Merging snapshots (`vrl merge`, `Repo.merge`): one commit whose parents are several
snapshots, first parent first, and whose weights combine theirs by a recipe recorded in
its meta["merge"]. Works on manifests and raw bytes (vrl/merge_math.py: numpy, no torch).

Rules (`--strategy`): ``average`` (the default), ``weighted:W1,...,WN`` (one weight per
parent), ``task-arithmetic:L`` (base + L * sum(xi - base), base the merge base) and
``take:PATTERN=REV`` (a glob on tensor names, tried with and without a training
snapshot's ``model/``; REV one of the parents). Each model tensor takes the last rule
that matches it; a rule that decides no tensor is refused. A tensor with the same object
in every input is kept by reference (so identical parents merge bit-identically); ints,
bools, step counters and everything outside the model (RNG, counters) are the first
parent's; optimizer state is emptied (`drop`) or averaged. Everything is checked and
computed before anything is written; the commit is `CommitEngine.commit(merge=...)`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vrl.commit_engine import FlatState
from vrl.diff import StateLayout, is_counter, layer_of
from vrl.errors import ObjectNotFoundError, VrlError
from vrl.merge_math import combine, computable, floating
from vrl.objects import Commit, Manifest, ObjectId, TensorEntry
from vrl.safetensors_file import RawTensor

OPTIMIZER_MODES = ("drop", "average")
META_DROPPED = ("frozen_layers", "source_file", "merge")  # the first parent's, not ours


class MergeError(VrlError):
    """A merge that cannot be made as asked (nothing is written)."""


class Store(Protocol):
    """What a merge reads (a `Repo` provides it)."""

    def resolve(self, rev: str) -> ObjectId: ...
    def read_commit(self, oid: ObjectId) -> Commit: ...
    def read_manifest(self, oid: ObjectId) -> Manifest: ...
    def read_tensor(self, entry: TensorEntry) -> RawTensor: ...
    def require_data(self, oid: ObjectId, manifest: Manifest) -> None: ...


@dataclass(frozen=True)
class Rule:
    """One `--strategy`: how the tensors it matches are merged."""

    spec: str  # as given
    strategy: str  # "average" | "weighted" | "task-arithmetic" | "take"
    weights: tuple[float, ...] = ()
    lam: float = 1.0
    pattern: str | None = None  # take: the glob
    rev: str | None = None  # take: the revision

    def matches(self, name: str, prefix: str | None) -> bool:
        if self.pattern is None:
            return True
        return fnmatch.fnmatchcase(name, self.pattern) or bool(
            prefix and name.startswith(prefix) and
            fnmatch.fnmatchcase(name[len(prefix):], self.pattern))


def parse_rule(spec: str) -> Rule:
    """A strategy as `vrl merge --strategy` takes it (MergeError if malformed)."""
    kind, sep, arg = spec.partition(":")
    try:
        if kind == "average" and not sep:
            return Rule(spec, kind)
        if kind == "weighted" and arg:
            return Rule(spec, kind, weights=tuple(_finite(w) for w in arg.split(",")))
        if kind == "task-arithmetic" and arg:
            return Rule(spec, kind, lam=_finite(arg))
        if kind == "take":
            pattern, eq, rev = arg.partition("=")
            if pattern and eq and rev:
                return Rule(spec, kind, pattern=pattern, rev=rev)
    except ValueError:
        what = "weights" if kind == "weighted" else "LAMBDA"
        raise MergeError(f"{spec}: {what} must be finite numbers (e.g. weighted:0.7,0.3, "
                         "task-arithmetic:0.5)") from None
    raise MergeError(f"unknown strategy {spec!r}: use average, weighted:W1,W2,..., "
                     "task-arithmetic:LAMBDA or take:PATTERN=REV")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


@dataclass
class MergePlan:
    """A merge computed and checked, ready to commit."""

    state: FlatState
    hparams: dict[str, Any]
    step: int | None
    meta: dict[str, Any]


# ---------------------------------------------------------------------- the commit graph
def ancestors(read_commit: Callable[[ObjectId], Commit], *start: ObjectId) -> set[ObjectId]:
    """`start` and every commit reachable from them (a shallow history's end stops the
    walk)."""
    seen, stack = set(start), list(start)
    while stack:
        try:
            parents = read_commit(stack.pop()).parents
        except ObjectNotFoundError:
            continue
        for p in parents:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def merge_base(read_commit: Callable[[ObjectId], Commit],
               commits: Sequence[ObjectId]) -> ObjectId | None:
    """The best common ancestor of all `commits` (git's octopus merge base): a common
    ancestor that no other common ancestor descends from; of several such, the newest
    (then the greatest id). None when they share no history. Linear in the history."""
    common = set.intersection(*(ancestors(read_commit, c) for c in commits))
    parents: set[ObjectId] = set()  # what they reach is below a common ancestor
    for c in common:
        try:
            parents.update(read_commit(c).parents)
        except ObjectNotFoundError:
            continue
    best = common - ancestors(read_commit, *parents)
    return max(best, key=lambda c: (read_commit(c).time, c)) if best else None


# ---------------------------------------------------------------------- the tree
def _optimizer_states(tree: Any, out: set[str], inside: bool = False) -> Any:
    """Collect the tensor names under every optimizer state dict's `state` (a dict with
    `state` and `param_groups`) into `out`; return the tree with those states emptied."""
    if isinstance(tree, list):
        return [_optimizer_states(v, out, inside) for v in tree]
    if not isinstance(tree, dict) or len(tree) != 1:
        return tree
    (tag, value), = tree.items()
    if tag == "$t" and inside:
        out.add(value)
    elif tag == "$tu":
        return {"$tu": _optimizer_states(value, out, inside)}
    elif tag == "$d":
        optimizer = not inside and {"state", "param_groups"} <= {k for k, _ in value}
        items = [[k, _optimizer_states(v, out, inside or (optimizer and k == "state"))]
                 for k, v in value]
        return {"$d": [[k, {"$d": []} if optimizer and k == "state" else v]
                       for k, v in items]}
    return tree


def _flat_hparams(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat_hparams(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def differing_hparams(commits: Sequence[Commit]) -> list[str]:
    """Dotted names of the hyperparameters that are not the same in every commit."""
    flat = [_flat_hparams(c.hparams) if c.hparams else {} for c in commits]
    missing = object()
    names = set().union(*flat)
    return sorted(n for n in names if len({repr(f.get(n, missing)) for f in flat}) > 1)


# ---------------------------------------------------------------------- the plan
def plan_merge(store: Store, parents: Sequence[tuple[str, ObjectId]],
               rules: Sequence[Rule], optimizer: str = "drop") -> MergePlan:
    """Check and compute the merge of `parents` ((name, id), first parent first): the
    merged state (unchanged tensors as their stored entries), hparams, step and meta."""
    if len(parents) < 2:
        raise MergeError("a merge needs at least two snapshots: name a revision to merge "
                         "into the current branch (or two with --branch)")
    if optimizer not in OPTIMIZER_MODES:
        raise MergeError(f"--optimizer must be drop or average, not {optimizer!r}")
    names = [n for n, _ in parents]
    ids = [oid for _, oid in parents]
    for i, oid in enumerate(ids):
        if oid in ids[:i]:
            raise MergeError(f"{names[i]} and {names[ids.index(oid)]} are the same snapshot "
                             f"({oid[:12]}); merge distinct snapshots")
    rules = list(rules) or [parse_rule("average")]
    for rule in rules:
        if rule.strategy == "weighted":
            if len(rule.weights) != len(ids):
                raise MergeError(f"{rule.spec}: {len(rule.weights)} weights for "
                                 f"{len(ids)} snapshots ({', '.join(names)})")
            if any(w < 0 for w in rule.weights) or sum(rule.weights) <= 0:
                raise MergeError(f"{rule.spec}: weights must be >= 0 with a positive sum")
    takes: dict[str, int] = {}  # take rule -> the parent it takes from
    for rule in rules:
        if rule.strategy == "take":
            oid = store.resolve(rule.rev or "")
            if oid not in ids:
                raise MergeError(f"{rule.spec}: {rule.rev} is not one of the snapshots "
                                 f"merged ({', '.join(names)})")
            takes[rule.spec] = ids.index(oid)
    commits = [store.read_commit(oid) for oid in ids]
    base = merge_base(store.read_commit, ids)
    if base is None and any(r.strategy == "task-arithmetic" for r in rules):
        raise MergeError(f"task arithmetic needs a common ancestor, and "
                         f"{', '.join(names)} share no history")
    manifests = [store.read_manifest(c.manifest) for c in commits]
    base_manifest = store.read_manifest(store.read_commit(base).manifest) \
        if base is not None and any(r.strategy == "task-arithmetic" for r in rules) else None

    first = manifests[0]
    optims: list[set[str]] = [set() for _ in manifests]  # optimizer state's tensor names
    trees = [_optimizer_states(m.tree, found) for m, found in zip(manifests, optims,
                                                                  strict=True)]
    tree = first.tree if optimizer == "average" else trees[0]
    prefix = StateLayout.derive({layer_of(n) for n in first.tensors},
                                commits[0].meta).model_prefix  # model/ of a training snapshot

    def part(j: int, name: str) -> str:
        if name in optims[j]:
            return "optimizer"
        return "model" if prefix is None or name.startswith(prefix) else "other"

    model = [n for n in first.tensors if part(0, n) == "model"]
    for j, m in enumerate(manifests[1:], 1):
        extra = sorted(n for n in m.tensors if part(j, n) == "model" and n not in first.tensors)
        if extra:
            raise MergeError(f"tensor {extra[0]!r} is in {names[j]} but not in {names[0]}, "
                             "whose structure the merge keeps")
    # each model tensor's rule: the last that matches it
    decided: dict[str, Rule] = {}
    for name in model:
        for rule in reversed(rules):
            if rule.matches(name, prefix):
                decided[name] = rule
                break
    used = {id(r) for r in decided.values()}
    for rule in rules:
        if rule.pattern is not None and not any(rule.matches(n, prefix) for n in model):
            raise MergeError(f"{rule.spec}: pattern {rule.pattern!r} matches no tensor "
                             f"(names look like {_example(model, prefix)!r})")
        if id(rule) not in used:
            raise MergeError(f"{rule.spec}: a later --strategy overrides it for every "
                             "tensor it matches; drop it or reorder")

    # every tensor present (a pruned snapshot is fetched from a remote, or refused)
    for oid, m in zip(ids, manifests, strict=True):
        store.require_data(oid, m)
    if base_manifest is not None and base is not None:
        store.require_data(base, base_manifest)

    out: dict[str, Any] = {}
    ties: dict[str, str] = {}
    counts = {"combined": 0, "taken": 0, "kept": 0, "first_parent": 0}
    weights_of = {r.spec: (r.weights or (1.0,) * len(ids)) for r in rules}

    def entry_in(j: int, name: str) -> TensorEntry:
        entry = manifests[j].tensors.get(name)
        if entry is None:
            hint = "; merge with --optimizer drop" if name in optims[0] else ""
            raise MergeError(f"tensor {name!r} is in {names[0]} but not in {names[j]}{hint}")
        return entry

    in_base = f"the merge base {base[:12]}" if base else ""

    def combined(name: str, rule: Rule, weights: Sequence[float]) -> TensorEntry | RawTensor:
        sources = [(names[j], entry_in(j, name)) for j in range(len(ids))]
        if rule.strategy == "task-arithmetic":
            b = base_manifest.tensors.get(name) if base_manifest else None
            if b is None:
                raise MergeError(f"tensor {name!r} is not in {in_base}")
            sources.append((in_base, b))
        e0 = sources[0][1]
        for where, e in sources[1:]:
            if e.shape != e0.shape:
                raise MergeError(f"cannot merge tensor {name!r}: shape {list(e0.shape)} in "
                                 f"{names[0]} but {list(e.shape)} in {where}")
            if e.dtype != e0.dtype:
                raise MergeError(f"cannot merge tensor {name!r}: {e0.dtype} in {names[0]} "
                                 f"but {e.dtype} in {where}")
        if len({e.id for _, e in sources}) == 1:  # the same bytes everywhere: as they are
            counts["kept"] += 1
            return _plain(e0)
        if is_counter(name, e0.shape) or not floating(e0.dtype):
            counts["first_parent"] += 1
            return _plain(e0)
        if not computable(e0.dtype):
            raise MergeError(f"cannot combine tensor {name!r}: vrl cannot compute in "
                             f"{e0.dtype}; take it from one snapshot (take:PATTERN=REV)")
        counts["combined"] += 1
        raws = [store.read_tensor(e) for _, e in sources]
        base_raw = raws.pop() if rule.strategy == "task-arithmetic" else None
        data = combine(raws, weights, base_raw, rule.lam)
        return RawTensor(e0.dtype, e0.shape, data)

    average = parse_rule("average")
    for name, entry in first.tensors.items():
        if entry.tie is not None:
            ties[name] = entry.tie
            continue
        kind = part(0, name)
        if kind == "model":
            rule = decided[name]
            if rule.strategy == "take":
                taken = entry_in(takes[rule.spec], name)
                out[name] = _plain(taken)
                counts["taken"] += 1
            else:
                out[name] = combined(name, rule, weights_of[rule.spec])
        elif kind == "optimizer":
            if optimizer == "average":
                out[name] = combined(name, average, (1.0,) * len(ids))
        else:
            out[name] = _plain(entry)
            counts["first_parent"] += 1
    ties = {n: t for n, t in ties.items() if t in out}  # (a dropped optimizer's: gone)
    for name, target in ties.items():  # tied names last: their targets are stored first
        out[name] = out[target]

    # a snapshot committed from a file keeps that file's header (names, order, metadata)
    # where it still describes the merged tensors: the workspace file stays that file
    layout = first.layout if first.layout is not None and out.keys() == first.tensors.keys() \
        and all((v.dtype, v.shape) == (first.tensors[n].dtype, first.tensors[n].shape)
                for n, v in out.items()) else None
    meta = {k: v for k, v in commits[0].meta.items() if k not in META_DROPPED}
    meta["merge"] = {
        "revs": names, "base": base, "strategy": [r.spec for r in rules],
        "rules": [_rule_json(r, ids, takes) for r in rules], "optimizer": optimizer,
        "hparams_differ": differing_hparams(commits), "tensors": counts,
    }
    return MergePlan(FlatState(out, tree, ties, layout), dict(commits[0].hparams),
                     commits[0].step, meta)


def _plain(entry: TensorEntry) -> TensorEntry:
    """An entry without its tie (its object is stored under the merged name)."""
    return entry if entry.tie is None else \
        TensorEntry(entry.id, entry.dtype, entry.shape, entry.nbytes)


def _example(names: Sequence[str], prefix: str | None) -> str:
    name = names[0] if names else ""
    return name[len(prefix):] if prefix and name.startswith(prefix) else name


def _rule_json(rule: Rule, ids: Sequence[ObjectId], takes: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": rule.strategy}
    if rule.strategy == "weighted":
        out["weights"] = list(rule.weights)
    elif rule.strategy == "task-arithmetic":
        out["lambda"] = rule.lam
    elif rule.strategy == "take":
        out.update(pattern=rule.pattern, rev=rule.rev, commit=ids[takes[rule.spec]])
    return out


# ---------------------------------------------------------------------- the commit
class MergeRepo(Store, Protocol):
    """What `merge` needs beyond reading: a `Repo`."""

    refs: Any
    engine: Any

    def current_branch(self) -> str | None: ...
    def ensure_clean_workspace(self) -> None: ...
    def write_workspace(self, oid: ObjectId) -> Any: ...


def merge(repo: MergeRepo, revs: Sequence[str], strategy: str | Sequence[str] = (), *,
          message: str | None = None, branch: str | None = None, optimizer: str = "drop",
          workspace: bool = False, force: bool = False) -> ObjectId:
    """`Repo.merge`: commit the merge of `revs` into the current branch (first parent: its
    head), or into `branch` (created from the first of `revs` when it does not exist).
    `workspace`: when the merge lands on HEAD's branch (or a detached HEAD), the workspace
    checkpoint is then rewritten, refused beforehand if it has uncommitted changes (unless
    `force`)."""
    from vrl.refs import check_ref_name

    specs = [strategy] if isinstance(strategy, str) else list(strategy)
    rules = [parse_rule(s) for s in specs]
    if branch is not None:
        check_ref_name(branch, "branch")
        ref = f"refs/heads/{branch}"
        on_head = branch == repo.current_branch()
        target = branch
    else:
        ref, on_head = "HEAD", True
        target = repo.current_branch() or "HEAD"
    expected = repo.refs.read(ref)
    if branch is not None and expected is None and len(revs) < 2:
        raise MergeError(f"branch {branch!r} does not exist: a new branch starts from the "
                         "first revision, so name two or more (vrl merge A B --branch "
                         f"{branch})")
    named = [(rev, repo.resolve(rev)) for rev in revs]
    parents = ([(target, expected)] if expected else []) + named
    if workspace and on_head and not force:
        repo.ensure_clean_workspace()
    plan = plan_merge(repo, parents, rules, optimizer)
    if message is None:
        merged = [n for n, _ in (named if expected else named[1:])]
        how = ", ".join(plan.meta["merge"]["strategy"])
        message = f"Merge {', '.join(merged)} into {target} ({how})"
    cid = repo.engine.commit(plan.state, message=message, hparams=plan.hparams,
                             step=plan.step, meta=plan.meta, allow_empty=True, ref=ref,
                             merge=(expected, tuple(oid for _, oid in parents)))
    if workspace and on_head:
        repo.write_workspace(cid)
    return cid
