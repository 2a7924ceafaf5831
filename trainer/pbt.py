"""``vrl pbt``: population-based training, each member a run on its own branch.

A population of K members (branches ``pbt/NAME/m<i>``, trainer seeds S..S+K-1 for
``--first-seed S``, default 1) trains in rounds of N agent-steps: round r is ``vrl train
--from pbt/NAME/m<i> --steps r*N`` for every member (an exact resume), run with the trial
runner of ``vrl sweep``. After every round but the last, the members are ranked by the
*mean* of the metric over the round's snapshots (the mean, not the last value: one
iteration's return is noisy, and a member that only got lucky at the end should not
win); those in the bottom quantile *exploit* a member of the top quantile and *explore*
its hyperparameters:

* exploit: the member's branch is moved to the source's head (reflog reason
  ``pbt: exploit m2 <- m0 round 1``) and a commit is added on top of it holding the
  source's snapshot unchanged (same tensors, so no bytes are stored twice) with the
  explored hyperparameters and ``meta["pbt"] = {"round", "exploit": {"from", "id"},
  "explore": {key: [old, new]}}``: the genealogy is in the history itself, and the next
  round continues from that commit with ``--from`` (whose parent is the source snapshot);
* explore: each ``--explore`` key is multiplied by a factor drawn from its list, or (a
  ``resample:`` key, or any key with ``--resample-probability``) drawn afresh.

The controller's state (round, the members' hyperparameters, the decisions of the round
and its RNG) is ``.vrl/pbt/NAME/state.json``, replaced atomically after each step, so the
same command again continues after a crash: members that finished the round are skipped,
those mid-round continue with ``--from``, decisions made but not applied are applied
(once: an applied exploit is recognised by its commit). Every random choice comes from
``random.Random(--seed)``, whose state is saved with the rest: the same command in two
stores makes the same decisions.

Nothing here imports torch except an exploit, which re-commits a snapshot.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trainer.cli import HELP, RUN_OPTIONS, dirty_overrides, one_line_errors
from trainer.sweep import (
    DISTRIBUTIONS,
    SIGNIFICANT,
    SweepError,
    SweepStore,
    _draw,
    _restore_head,
    check_env,
    check_ray_options,
    given,
    parse_train_args,
    split_values,
)
from trainer.trials import Job, Trial, run_jobs
from vrl.returns import RETURN_METRIC

PBT_DIR = "pbt"
"""Under the repository's .vrl directory: one folder per population (state, logs)."""
META = "pbt"
"""Commit metadata key of an exploit commit."""


class PbtError(SweepError):
    """A bad PBT definition or state: one line, exit code 1."""


# ---------------------------------------------------------------------------- definition


@dataclass(frozen=True)
class Explore:
    """How one hyperparameter is explored: perturbed by a factor, or resampled."""

    key: str
    factors: tuple[float, ...] = ()
    dist: str | None = None  # resample distribution (sweep's DISTRIBUTIONS)
    args: tuple[str, ...] = ()


def parse_explore(specs: tuple[str, ...] | list[str]) -> list[Explore]:
    """``KEY=factors:0.8,1.2`` or ``KEY=resample:DIST:ARGS`` (DIST as in ``vrl sweep
    --random``); a key may be given twice, once of each kind."""
    usage = ("give KEY=factors:F1,F2,... or KEY=resample:DIST:ARGS (uniform:LOW,HIGH, "
             "loguniform:LOW,HIGH, int:LOW,HIGH, choice:A,B,...)")
    out: dict[str, Explore] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        kind, colon, rest = raw.partition(":")
        if not sep or not key or not colon or kind not in ("factors", "resample"):
            raise PbtError(f"--explore {spec!r}: {usage}")
        old = out.get(key, Explore(key))
        if kind == "factors":
            try:
                factors = tuple(float(f) for f in split_values(rest))
            except ValueError:
                raise PbtError(f"--explore {spec!r}: factors are numbers, e.g. "
                               "factors:0.8,1.2") from None
            if not factors or any(not math.isfinite(f) or f <= 0 for f in factors):
                raise PbtError(f"--explore {spec!r}: factors must be positive numbers")
            if old.factors:
                raise PbtError(f"--explore {key}: factors are given twice")
            out[key] = Explore(key, factors, old.dist, old.args)
            continue
        dist, colon, args_text = rest.partition(":")
        args = split_values(args_text)
        if not colon or dist not in DISTRIBUTIONS or any(a == "" for a in args):
            raise PbtError(f"--explore {spec!r}: {usage}")
        if dist != "choice":
            try:
                low, high = (int(a) if dist == "int" else float(a) for a in args)
            except ValueError:
                raise PbtError(f"--explore {spec!r}: {usage}") from None
            if not (math.isfinite(low) and math.isfinite(high) and low <= high) or \
                    dist == "loguniform" and low <= 0:
                raise PbtError(f"--explore {spec!r}: need LOW <= HIGH"
                               + (" and LOW > 0" if dist == "loguniform" else ""))
        if old.dist:
            raise PbtError(f"--explore {key}: resample is given twice")
        out[key] = Explore(key, old.factors, dist, tuple(args))
    return list(out.values())


def _round_value(value: float, like: Any) -> float | int:
    """A perturbed value, kept to SIGNIFICANT digits (the --set text is the value trained
    with) and an int where the original was one (at least 1: sizes and counts)."""
    if isinstance(like, int) and not isinstance(like, bool):
        return max(1, round(value))
    return float(f"{value:.{SIGNIFICANT}g}")


def _typed(text: str) -> Any:
    """A drawn value's text as `--set` reads it (YAML 1.2: ``1e-4`` is a float)."""
    from trainer.config import parse_override

    return parse_override(f"value={text}")[1]


def explore(rng: random.Random, hparams: dict[str, Any], rules: list[Explore],
            resample_probability: float) -> dict[str, Any]:
    """New values of the explored keys, in the order given: a key with a resample rule is
    drawn afresh with the probability, else multiplied by one of its factors (a key with
    no factors keeps its value)."""
    out: dict[str, Any] = {}
    for rule in rules:
        old = hparams[rule.key]
        resample = rule.dist is not None and rng.random() < resample_probability
        if resample:
            out[rule.key] = _resample(rng, rule, old)
        elif rule.factors:
            if not isinstance(old, (int, float)) or isinstance(old, bool):
                raise PbtError(f"--explore {rule.key}=factors: its value {old!r} is not a "
                               "number")
            out[rule.key] = _round_value(old * rng.choice(rule.factors), old)
        else:
            out[rule.key] = old
    return out


def _resample(rng: random.Random, rule: Explore, old: Any) -> Any:
    """A fresh draw of the rule's distribution, typed as `--set` reads it; the "0" of
    choice:0,0.01 for a float field is 0.0, as the trainer stores it."""
    assert rule.dist is not None
    value = _typed(_draw(rng, rule.dist, list(rule.args)))
    if isinstance(old, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _text(value: Any) -> str:
    """A value as `--set KEY=VALUE` text (JSON reads back unchanged as YAML)."""
    return json.dumps(value)


# ---------------------------------------------------------------------------- members


@dataclass
class Member(Trial):
    """A member of the population: a Trial whose branch is ``pbt/NAME/m<i>``."""

    @property
    def name(self) -> str:
        return self.config

    @property
    def branch(self) -> str:
        return f"pbt/{self.sweep}/{self.config}"


def members_of(name: str, state: dict[str, Any]) -> list[Member]:
    return [Member(m, info["seed"], {k: _text(v) for k, v in info["hparams"].items()}, name)
            for m, info in state["members"].items()]


def round_score(repo: Any, branch: str, since_step: int, metric: str) -> float | None:
    """The mean of ``metric`` over the snapshots of this round: first-parent history from
    the branch head back to the last round's end (``since_step``) or to an exploit commit
    (the source's snapshots before it are not this member's round). None: no value."""
    values: list[float] = []
    oid = repo.branches().get(branch)
    while oid is not None:
        commit = repo.read_commit(oid)
        if commit.step is not None and commit.step <= since_step or META in commit.meta:
            break
        value = commit.metrics.get(metric)
        if isinstance(value, (int, float)) and math.isfinite(value):
            values.append(float(value))
        oid = commit.parents[0] if commit.parents else None
    return sum(values) / len(values) if values else None


def decide(rng: random.Random, scores: dict[str, float | None], quantile: float,
           minimize: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """(ranking best first, [(loser, source)]): the bottom quantile (at least one member
    when there are two, never more than half) each exploit a member of the top quantile,
    chosen by the RNG. Members without a score rank last; ties by member order."""
    order = list(scores)

    def key(m: str) -> tuple[float, int]:
        s = scores[m]
        value = -math.inf if s is None else (-s if minimize else s)
        return (-value, order.index(m))

    ranking = sorted(order, key=key)
    n = min(len(ranking) // 2, math.ceil(len(ranking) * quantile))
    if n == 0:
        return ranking, []
    top, bottom = ranking[:n], ranking[-n:]
    return ranking, [(loser, rng.choice(top)) for loser in bottom]


# ---------------------------------------------------------------------------- state


class PbtStore(SweepStore):
    """``.vrl/pbt/NAME/``: state.json (definition, round, members, decisions, RNG) and a
    log per member (``m<i>.log``, appended to each round)."""

    def __init__(self, repo: Any, name: str) -> None:
        self.dir = Path(repo.vrl_dir) / PBT_DIR / name
        self.path = self.dir / "state.json"


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(saved: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((saved[0], tuple(saved[1]), saved[2]))
    return rng


# ---------------------------------------------------------------------------- exploit


def apply_exploit(repo: Any, name: str, round_: int, loser: str, source: str,
                  source_id: str, old: dict[str, Any], new: dict[str, Any]) -> str:
    """Move ``loser``'s branch to the source's snapshot and commit that snapshot again on
    it with the explored hyperparameters and the ``pbt`` record; returns the new commit.
    Idempotent: a branch whose head already is this exploit is left as it is."""
    ref = f"refs/heads/pbt/{name}/{loser}"
    head = repo.refs.read(ref)
    if head is not None:
        meta = repo.read_commit(head).meta.get(META) or {}
        if meta.get("round") == round_ and (meta.get("exploit") or {}).get("id") == source_id:
            return head  # applied before a crash
    src = repo.read_commit(source_id)
    changed = {k: [old[k], new[k]] for k in new}
    record = {"round": round_, "exploit": {"from": source, "id": source_id},
              "explore": changed}
    reason = f"pbt: exploit {loser} <- {source} round {round_}"  # why the branch jumped
    moved = head == source_id and next(
        (e.reason for e in repo.refs.reflog(ref)), None) == reason
    if not moved:  # (moved before a crash: its old line is tagged already, keep that tag)
        if head is not None:  # the line it leaves stays reachable (and in `log --all`)
            repo.tag(f"pbt/{name}/r{round_}/{loser}", head, force=True)
        repo.refs.update(ref, source_id, expected=head, reason=reason)
    shown = ", ".join(f"{k} {_text(a)} -> {_text(b)}" for k, (a, b) in changed.items()
                      if a != b)
    return repo.commit(repo.load(source_id), allow_empty=True, ref=ref,
                       message=f"pbt: {loser} exploits {source} (round {round_})"
                               + (f"; {shown}" if shown else ""),
                       hparams={**src.hparams, **new}, metrics={}, step=src.step,
                       env=dict(src.env), meta={**src.meta, META: record})


# ---------------------------------------------------------------------------- command


@click.command("pbt", context_settings={**HELP, "ignore_unknown_options": True})
@click.argument("name")
@click.option("--population", type=int, default=None,
              help="Members of the population [default: 4].")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help="Rounds of training; members exploit and explore after each but the "
                   "last [default: 4].")
@click.option("--steps-per-round", type=click.IntRange(min=1), default=None,
              help="Agent-steps each member trains per round (best a multiple of its "
                   "iteration) [required for a new population].")
@click.option("--explore", "explore_specs", multiple=True, metavar="KEY=SPEC",
              help="A hyperparameter to explore: KEY=factors:0.8,1.2 (multiply by one) or "
                   "KEY=resample:DIST:ARGS as in `vrl sweep --random` (repeatable).")
@click.option("--resample-probability", type=click.FloatRange(0, 1), default=None,
              help="Chance that a key with a resample rule is drawn afresh instead of "
                   "perturbed [default: 0.25].")
@click.option("--quantile", type=click.FloatRange(0, 0.5, min_open=True), default=None,
              help="Fraction of the population that exploits (the bottom) and is copied "
                   "(the top) [default: 0.25].")
@click.option("--metric", default=None,
              help=f"The metric members are ranked by, its mean over the round "
                   f"[default: {RETURN_METRIC}].")
@click.option("--minimize", is_flag=True, default=None,
              help="Rank by the lowest metric (a loss) instead of the highest.")
@click.option("--seed", type=int, default=None,
              help="Seeds the controller's choices (the same seed makes the same decisions) "
                   "[default: 0].")
@click.option("--first-seed", type=click.IntRange(min=0), default=None,
              help="The trainer seed of member m0; m<i> trains with FIRST_SEED + i (repeat a "
                   "population with other seeds) [default: 1].")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Members training at a time (each a `vrl train` process).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run the members as Ray tasks on this cluster (auto: the running one; "
                   "needs pip install 'vrl[ray]').")
@click.option("--remote", default=None, metavar="NAME",
              help="With --ray: each task trains in a clone of this remote and pushes its "
                   "branch to it.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def pbt(name: str, population: int | None, rounds: int | None, steps_per_round: int | None,
        explore_specs: tuple[str, ...], resample_probability: float | None,
        quantile: float | None, metric: str | None, minimize: bool | None, seed: int | None,
        first_seed: int | None, workers: int, ray_address: str | None, remote: str | None,
        train_args: tuple[str, ...]) -> None:
    """Population-based training: K members on branches pbt/NAME/m<i> train in rounds;
    after each round the worst copy the best and perturb their hyperparameters.

    Members are `vrl train` processes, --workers at a time; other options (--preset,
    --set, --env, --device, ...) go to every one of them. The same command again (or
    `vrl pbt NAME`) continues after a crash.

    \b
    vrl pbt lr --population 4 --rounds 5 --steps-per-round 20480 \\
        --explore learning_rate=factors:0.8,1.2 --explore ent_coef=resample:choice:0,0.01
    vrl log --graph --oneline 'pbt/lr/*'
    """
    from vrl import Repo

    with one_line_errors():
        repo = Repo(".")
    if "/" in name or name.startswith(".") or not name:
        raise PbtError(f"population name {name!r}: one word, no '/'")
    with one_line_errors():
        from vrl.refs import check_ref_name

        check_ref_name(f"pbt/{name}/m0", "branch")
    if population is not None and population < 2:
        raise PbtError(f"--population must be at least 2, got {population}")
    check_ray_options(ray_address, remote)
    store = PbtStore(repo, name)
    stored = store.load()
    given_definition = {"population": population, "rounds": rounds,
                        "steps_per_round": steps_per_round,
                        "explore": list(explore_specs) or None,
                        "resample_probability": resample_probability,
                        "quantile": quantile, "metric": metric, "minimize": minimize,
                        "seed": seed, "first_seed": first_seed,
                        "train_args": list(train_args) or None}
    if stored is not None:
        definition = stored["definition"]
        definition.setdefault("first_seed", 1)  # a population from before --first-seed
        # a rerun may repeat the definition or leave it out; only --rounds may grow
        for key, value in given_definition.items():
            if value is not None and key != "rounds" and value != definition[key]:
                raise PbtError(f"population {name!r} exists with another {key} (see "
                               f"{store.path}); continue it with `vrl pbt {name}`, or pick "
                               "another NAME")
        if rounds is not None:
            definition["rounds"] = rounds
    else:
        if steps_per_round is None:
            raise PbtError("give --steps-per-round N (agent-steps per member and round)")
        if not explore_specs:
            raise PbtError("give at least one --explore KEY=factors:0.8,1.2 or "
                           "KEY=resample:DIST:ARGS")
        definition = {k: v for k, v in given_definition.items()}
        for key, default in (("population", 4), ("rounds", 4), ("resample_probability", 0.25),
                             ("quantile", 0.25), ("metric", RETURN_METRIC),
                             ("minimize", False), ("seed", 0), ("first_seed", 1),
                             ("train_args", [])):
            if definition[key] is None:
                definition[key] = default
    rules = parse_explore(definition["explore"])
    ctx = parse_train_args(definition["train_args"], owner="PBT")
    from click.core import ParameterSource

    if ctx.get_parameter_source("steps") == ParameterSource.COMMANDLINE:
        raise PbtError("--steps is set by PBT for every round (give --steps-per-round); "
                       "leave it out")
    base = _base_config(ctx, rules)
    if stored is None:
        stored = _initial_state(name, definition, rules, base)
        _check_values(ctx, stored)
    run_args = given(ctx, names=RUN_OPTIONS)
    with store.running():
        _execute(repo, store, stored, rules, ctx, run_args, workers, ray_address, remote)


def _base_config(ctx: click.Context, rules: list[Explore]) -> dict[str, Any]:
    """The config every member starts from (defaults, preset, --config, --set), as
    `vrl train` builds it: the explored keys must be in it."""
    from trainer.cli import _from_yaml
    from trainer.config import config_to_dict, load_config
    from trainer.presets import preset_algo

    p = ctx.params
    with one_line_errors(ValueError):
        algo = (p["algo"] or _from_yaml(p["config_path"], "algo")
                or preset_algo(p["preset"]) or "ppo")
        config = config_to_dict(load_config(algo, p["config_path"],
                                            tuple(p["overrides"]) + dirty_overrides(p),
                                            preset=p["preset"]))
    for rule in rules:
        if rule.key not in config:
            raise PbtError(f"--explore {rule.key}: not a {algo} config key")
        value = config[rule.key]
        if rule.factors and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise PbtError(f"--explore {rule.key}=factors: its value {value!r} is not a "
                           "number (give resample:choice:A,B)")
    return config


def _initial_state(name: str, definition: dict[str, Any], rules: list[Explore],
                   base: dict[str, Any]) -> dict[str, Any]:
    """Round 0: member m0 starts at the config's values, the others at a perturbation of
    them (resample keys: a fresh draw), so the population is diverse from the start."""
    rng = random.Random(definition["seed"])
    start = {r.key: base[r.key] for r in rules}
    members = {}
    for i in range(definition["population"]):
        hparams = dict(start)
        if i > 0:
            for rule in rules:
                if rule.dist is not None:
                    hparams[rule.key] = _resample(rng, rule, start[rule.key])
                else:
                    hparams[rule.key] = explore(rng, start, [rule], 0.0)[rule.key]
        members[f"m{i}"] = {"seed": definition["first_seed"] + i, "hparams": hparams, "step": 0}
    return {"name": name, "definition": definition, "round": 0, "members": members,
            "applied": True,
            "decisions": [], "history": [], "rng": _rng_state(rng),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _check_values(ctx: click.Context, state: dict[str, Any]) -> None:
    """Every member's starting config, built as `vrl train` will: a bad value is one
    line before anything starts."""
    from trainer.cli import _from_yaml
    from trainer.config import load_config
    from trainer.presets import preset_algo

    p = ctx.params
    check_env(ctx)
    with one_line_errors():
        algo = (p["algo"] or _from_yaml(p["config_path"], "algo")
                or preset_algo(p["preset"]) or "ppo")
        for m, info in state["members"].items():
            sets = tuple(f"{k}={_text(v)}" for k, v in info["hparams"].items())
            try:
                load_config(algo, p["config_path"], tuple(p["overrides"])
                            + dirty_overrides(p) + sets, preset=p["preset"])
            except ValueError as exc:
                raise PbtError(f"member {m}: {exc}") from None


def _jobs(repo: Any, store: PbtStore, members: list[Member], ctx: click.Context,
          run_args: list[str], target: int) -> tuple[list[Job], list[Member]]:
    """This round's runs: a new member starts on its branch, the others continue theirs
    to ``target`` steps with their (possibly explored) values; finished ones are skipped."""
    base = [sys.executable, "-m", "vrl", "train", "--no-progress", "--json"]
    config_args = given(ctx, skip=(*RUN_OPTIONS, "progress"))
    overrides = {s.partition("=")[0] for s in ctx.params["overrides"]}
    # annealing would decay the learning rate to 0 at the end of every round (each round's
    # --steps is the total so far), and PBT explores the rate itself: off unless asked for
    anneal = [] if "anneal_lr" in overrides else ["--set", "anneal_lr=false"]
    jobs: list[Job] = []
    done: list[Member] = []
    branches = repo.branches()
    for number, member in enumerate(members, 1):
        sets = [w for s in member.sets() for w in ("--set", s)]
        steps = ["--steps", str(target)]
        oid = branches.get(member.branch)
        if oid is None:
            args = [*base, *config_args, *anneal, *sets, "--seed", str(member.seed), *steps,
                    *run_args, "--branch", member.branch]
        else:
            commit = repo.read_commit(oid)
            if commit.step is not None and commit.step >= target:
                done.append(member)
                continue
            # the snapshot holds the config; the explored values again, as --set (the
            # exploit commit holds them too: this checks them as a fresh run would)
            args = [*base, "--from", member.branch, *sets, *steps, *run_args]
        jobs.append(Job(member, args, store.log(member), oid is not None, number))
    return jobs, done


def _execute(repo: Any, store: PbtStore, state: dict[str, Any], rules: list[Explore],
             ctx: click.Context, run_args: list[str], workers: int,
             ray_address: str | None, remote: str | None) -> None:
    """Rounds from the last complete one to the end: train, rank, exploit and explore,
    saving the state after each step."""
    name = state["name"]
    d = state["definition"]
    rng = _rng_from(state["rng"])
    store.save(state)
    logs = os.path.relpath(store.dir)
    click.echo(f"pbt {name}: {d['population']} members, {d['rounds']} rounds of "
               f"{d['steps_per_round']} steps, {workers} at a time; logs in "
               f"{store.dir if logs.startswith('..') else logs}")
    head_before = repo.refs.read_raw("HEAD")
    members = members_of(name, state)
    try:
        if not state["applied"]:  # decisions of a round made before a crash
            _apply(repo, state, rng)
            store.save(state)
        history = state["history"]
        if history and history[-1].get("final") and state["round"] < d["rounds"]:
            # the population's last round had no exploit; a larger --rounds goes on: now
            entry = history.pop()
            _decide(repo, store, state, rules, rng, entry["round"], entry["scores"],
                    last=False)
        while state["round"] < d["rounds"]:
            round_ = state["round"] + 1
            target = round_ * d["steps_per_round"]
            members = members_of(name, state)
            if remote is not None:
                from trainer.ray_runner import fetch_branches, push_branches

                with one_line_errors():
                    # behind the remote (a crash mid-round): catch up; ahead (the last
                    # round's exploit commits): send them before the tasks clone
                    fetch_branches(repo, remote, f"pbt/{name}/")
                    push_branches(repo, remote, [m.branch for m in members])
            jobs, done = _jobs(repo, store, members, ctx, run_args, target)
            click.echo(f"round {round_}/{d['rounds']}: members to {target} steps"
                       + (f" ({', '.join(m.name for m in done)} there already)"
                          if done else ""))
            if ray_address is not None:
                from trainer.ray_runner import fetch_branches, run_jobs_ray

                stopped = run_jobs_ray(jobs, workers, len(members), ray_address, remote,
                                       repo)
                if remote is not None:
                    with one_line_errors():
                        fetch_branches(repo, remote, f"pbt/{name}/")
            else:
                stopped = run_jobs(jobs, workers, len(members))
            failed = [j for j in jobs if j.rc not in (0, None) and not j.stopped]
            if stopped:
                click.echo(f"vrl: pbt interrupted in round {round_}; continue it with: "
                           f"vrl pbt {name}", err=True)
                raise click.exceptions.Exit(130 if stopped[0] == signal.SIGINT
                                            else 128 + signal.SIGTERM)
            if failed:
                raise PbtError(f"round {round_}: {', '.join(j.trial.name for j in failed)} "
                               f"failed (see the logs); fix it and continue with `vrl pbt "
                               f"{name}`")
            scores = {m.name: round_score(repo, m.branch, state["members"][m.name]["step"],
                                          d["metric"]) for m in members}
            _decide(repo, store, state, rules, rng, round_, scores,
                     last=round_ == d["rounds"])
    finally:
        _restore_head(repo, head_before, {m.branch for m in members})
    best = state["history"][-1]["ranking"][0] if state["history"] else None
    click.echo(f"pbt {name}: {state['round']} of {d['rounds']} rounds done"
               + (f"; best member {best} (pbt/{name}/{best})" if best else ""))
    click.echo(f"genealogy: vrl log --graph --oneline 'pbt/{name}/*'")


def _decide(repo: Any, store: PbtStore, state: dict[str, Any], rules: list[Explore],
            rng: random.Random, round_: int, scores: dict[str, float | None],
            last: bool) -> None:
    """Rank the members by their round's scores, decide who exploits whom with which
    explored values (none after the last round: nothing trains after it), save that, and
    apply it."""
    name, d = state["name"], state["definition"]
    ranking, pairs = decide(rng, scores, d["quantile"], d["minimize"])
    if last:
        pairs = []  # nothing trains after the last round: keep what each reached
    decisions = []
    for loser, source in pairs:
        new = explore(rng, state["members"][source]["hparams"], rules,
                      d["resample_probability"])
        decisions.append({"member": loser, "from": source,
                          "id": repo.branches()[f"pbt/{name}/{source}"],
                          "old": state["members"][loser]["hparams"],
                          "source_hparams": state["members"][source]["hparams"], "new": new})
    shown = "  ".join(f"{m} {_score(scores[m])}" for m in ranking)
    click.echo(f"round {round_}: {d['metric']} (round mean), best first: {shown}")
    for m in state["members"]:
        state["members"][m]["step"] = repo.read_commit(
            repo.branches()[f"pbt/{name}/{m}"]).step or 0
    state.update(round=round_, decisions=decisions, applied=False, rng=_rng_state(rng))
    state["history"].append({"round": round_, "scores": scores, "ranking": ranking,
                             "exploits": [{k: x[k] for k in ("member", "from", "id", "new")}
                                          for x in decisions], "final": last})
    store.save(state)  # decided: a crash from here on applies the same decisions
    _apply(repo, state, rng)
    store.save(state)


def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _apply(repo: Any, state: dict[str, Any], rng: random.Random) -> None:
    """Apply the round's decisions (those already applied are recognised and skipped)."""
    name = state["name"]
    for x in state["decisions"]:
        with one_line_errors():
            new = apply_exploit(repo, name, state["round"], x["member"], x["from"], x["id"],
                                x["source_hparams"], x["new"])
        state["members"][x["member"]].update(hparams=x["new"],
                                             step=repo.read_commit(new).step or 0)
        changed = ", ".join(f"{k} {_text(x['source_hparams'][k])} -> {_text(v)}"
                            for k, v in x["new"].items()
                            if v != x["source_hparams"][k]) or "values unchanged"
        click.echo(f"  {x['member']} <- {x['from']} ({x['id'][:12]}): {changed}")
    state["applied"] = True

