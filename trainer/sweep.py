"""``vrl sweep``: a grid or random search over trainer config values x seeds.

Every trial is one ``vrl train`` run on its own branch, ``sweep/NAME/<values>-s<seed>``,
started as a local subprocess (``python -m vrl train``), K at a time; all of them commit
into the one store (commits to different branches from several processes are safe).
The sweep's definition and the state of its trials are kept in
``.vrl/sweeps/NAME/sweep.json``, next to one log per trial (``<trial>.log``), so the same
command again (or ``vrl sweep NAME --resume``) skips the finished trials and continues the
unfinished ones in place with ``vrl train --from <branch>`` (an exact resume).

A trial is *finished* when its branch head is at the requested total (``--steps``, or the
``total_steps`` stored with the snapshot when no --steps was given) or beyond it: the
trainer rounds a run up to whole iterations and commits its last iteration before it ends.

Nothing here imports torch: the trials do, in their own processes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click

from trainer.cli import HELP, RUN_OPTIONS, dirty_overrides, given, one_line_errors
from trainer.cli import train as train_command
from trainer.trials import Job, Trial, run_jobs

SWEEPS_DIR = "sweeps"
"""Under the repository's .vrl directory: one folder per sweep (definition, state, logs)."""
DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")
# train options the sweep sets for every trial itself: given to `vrl sweep` they are refused
# (a --config file is fine: its values are part of every trial's config)
OWNED = {"branch": "--branch", "from_rev": "--from", "seed": "--seed",
         "store": "--store/--no-store", "out": "--out", "iterations": "--iterations"}
SIGNIFICANT = 4  # digits of a sampled float: the value trained with is the one in the name
_UNSAFE = re.compile(r"[\x00-\x20\x7f~^:?*\\/,]")  # not in a ref name, or our separators


class SweepError(click.ClickException):
    """A bad sweep definition: one line, exit code 1, and nothing was started."""


# ---------------------------------------------------------------------------- the plan


def split_values(text: str) -> list[str]:
    """``1e-4,3e-4`` -> ["1e-4", "3e-4"]; commas inside brackets belong to the value
    (``[64,64],[128]`` is two lists)."""
    out, depth, current = [], 0, ""
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(current.strip())
            current = ""
        else:
            current += ch
    out.append(current.strip())
    return out


def parse_grid(specs: Sequence[str]) -> dict[str, list[str]]:
    """``--grid KEY=V1,V2`` options as {key: [value texts]} (keys in the order given)."""
    grid: dict[str, list[str]] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        key = key.strip()
        values = split_values(raw) if sep else []
        if not key or not raw.strip() or any(v == "" for v in values):
            raise SweepError(f"--grid {spec!r}: give KEY=V1,V2,... (e.g. --grid "
                             "learning_rate=1e-4,3e-4)")
        if key in grid:
            raise SweepError(f"--grid {key} is given twice; list all its values in one "
                             "--grid")
        if len(set(values)) != len(values):
            raise SweepError(f"--grid {spec!r}: a value is listed twice")
        grid[key] = values
    return grid


def parse_random(specs: Sequence[str]) -> dict[str, tuple[str, list[str]]]:
    """``--random KEY=DIST:ARGS`` options as {key: (dist, [arg texts])}, checked."""
    out: dict[str, tuple[str, list[str]]] = {}
    for spec in specs:
        key, sep, raw = spec.partition("=")
        dist, colon, args_text = raw.partition(":")
        key, dist = key.strip(), dist.strip()
        usage = (f"--random {spec!r}: give KEY=DIST:ARGS with DIST one of "
                 "uniform:LOW,HIGH, loguniform:LOW,HIGH, int:LOW,HIGH, choice:A,B,...")
        if not sep or not key or not colon or dist not in DISTRIBUTIONS:
            raise SweepError(usage)
        args = split_values(args_text)
        if dist == "choice":
            if len(args) < 1 or any(a == "" for a in args):
                raise SweepError(usage)
        else:
            try:
                low, high = (int(a) if dist == "int" else float(a) for a in args)
            except ValueError:
                raise SweepError(usage) from None
            if not (math.isfinite(low) and math.isfinite(high) and low <= high) or \
                    dist == "loguniform" and low <= 0:
                raise SweepError(f"--random {spec!r}: need LOW <= HIGH"
                                 + (" and LOW > 0" if dist == "loguniform" else ""))
        if key in out:
            raise SweepError(f"--random {key} is given twice")
        out[key] = (dist, args)
    return out


def _draw(rng: random.Random, dist: str, args: list[str]) -> str:
    if dist == "choice":
        return rng.choice(args)
    if dist == "int":
        return str(rng.randint(int(args[0]), int(args[1])))
    low, high = float(args[0]), float(args[1])
    value = (math.exp(rng.uniform(math.log(low), math.log(high))) if dist == "loguniform"
             else rng.uniform(low, high))
    return f"{value:.{SIGNIFICANT}g}"


def _label(value: str) -> str:
    """A value's text as part of a ref name: brackets and spaces dropped, characters a
    ref may not hold (and our ',' separator) as '_', no '..'."""
    text = re.sub(r"[\[\](){} ]", "", value)
    text = _UNSAFE.sub("_", text)
    while ".." in text:
        text = text.replace("..", ".")
    return text or "_"


def plan(name: str, grid: dict[str, list[str]], rand: dict[str, tuple[str, list[str]]],
         trials: int, sampler_seed: int, seeds: list[int]) -> list[Trial]:
    """Every trial of the sweep, configurations in grid order (the last key fastest), each
    with every seed. Random values are drawn from ``random.Random(sampler_seed)``: the same
    definition gives the same trials."""
    from vrl.refs import check_ref_name

    points = [dict(zip(grid, combo, strict=True))
              for combo in itertools.product(*grid.values())] or [{}]
    draws: list[dict[str, str]] = [{}]
    if rand:
        rng = random.Random(sampler_seed)
        draws = [{key: _draw(rng, dist, args) for key, (dist, args) in rand.items()}
                 for _ in range(trials)]
    out: list[Trial] = []
    configs: set[str] = set()
    for index, (point, draw) in enumerate(itertools.product(points, draws)):
        values = {**point, **draw}
        label = ",".join(f"{k}={_label(v)}" for k, v in values.items()) or "default"
        if rand:  # sampled values may repeat: the trial's number keeps names apart
            label = f"t{index % len(draws) + 1}-{label}"
        if label in configs:  # two values with the same label ("[64]" and "64")
            label = f"c{index + 1}-{label}"
        configs.add(label)
        for seed in seeds:
            trial = Trial(label, seed, values, name)
            try:
                check_ref_name(trial.branch, "branch")
            except ValueError:  # too long, most likely: number it instead
                trial.config = f"c{index + 1}"
                check_ref_name(trial.branch, "branch")
            out.append(trial)
    return out


def parse_seeds(text: str) -> list[int]:
    """``3`` -> seeds 1, 2, 3 (the trainer's default seed is 1); ``0,7,42`` -> those."""
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            count = int(text)
            if count < 1:
                raise ValueError
            seeds = list(range(1, count + 1))
    except ValueError:
        raise SweepError(f"--seeds {text!r}: give a count (3: seeds 1, 2, 3) or a list "
                         "of seeds (0,7,42)") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise SweepError(f"--seeds {text!r}: give distinct seeds >= 0")
    return seeds


# ---------------------------------------------------------------------------- train options


def parse_train_args(args: Sequence[str], owner: str = "the sweep") -> click.Context:
    """The pass-through options, parsed by `vrl train` itself (so a typo or an option that
    `vrl train` does not know fails here, before anything starts); ``owner`` sets the
    options of OWNED itself."""
    if args and not args[0].startswith("-"):
        raise SweepError(f"unexpected argument {args[0]!r}: NAME comes first, train "
                         "options after it")
    try:
        ctx = train_command.make_context("vrl train", list(args))
    except click.UsageError as exc:
        raise SweepError(f"train options: {exc.format_message()}") from None
    from click.core import ParameterSource

    for key, flag in OWNED.items():
        if ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE:
            hint = " (give --seeds)" if key == "seed" else ""
            raise SweepError(f"{flag} is set by {owner} for every trial{hint}; leave it out")
    return ctx




def check_trials(ctx: click.Context, trials: list[Trial], steps: int | None) -> None:
    """Build every trial's config as `vrl train` will (defaults, preset, --config, --set,
    the trial's values, seed, steps): a bad key or value fails here, in one line, before
    anything starts, as does an env spec that names no env. (What needs the env made, e.g.
    minibatches that do not divide the rollout, fails in its trial.)"""
    from trainer.cli import _from_yaml
    from trainer.config import load_config
    from trainer.presets import preset_algo

    p = ctx.params
    check_env(ctx)
    with one_line_errors():
        algo = (p["algo"] or _from_yaml(p["config_path"], "algo")
                or preset_algo(p["preset"]) or "ppo")
        base = tuple(p["overrides"]) + dirty_overrides(p)
        load_config(algo, p["config_path"], base, preset=p["preset"])  # errors of no trial
        for trial in trials:
            extra = (f"seed={trial.seed}",) + ((f"total_steps={steps}",) if steps else ())
            try:
                load_config(algo, p["config_path"], base + tuple(trial.sets()) + extra,
                            preset=p["preset"])
            except ValueError as exc:
                where = f"trial {trial.config}: " if trial.values else ""
                raise SweepError(f"{where}{exc}") from None


def check_ray_options(ray_address: str | None, remote: str | None) -> None:
    """--remote only with --ray, and Ray there when asked for: before anything starts."""
    if remote is not None and ray_address is None:
        raise SweepError("--remote is for --ray tasks: give --ray ADDRESS too")
    if ray_address is not None:
        from trainer.ray_runner import require_ray

        require_ray()


def check_env(ctx: click.Context) -> None:
    """The env of the trials (--env, or the --config file's env_spec) is one `vrl train`
    can make: an unknown spec or Gymnasium ID is one line before anything starts, not a
    failure in every trial."""
    from trainer.cli import _from_yaml
    from trainer.env_specs import check_spec

    p = ctx.params
    with one_line_errors():
        spec = p["env"] or _from_yaml(p["config_path"], "env_spec")
        if spec:
            check_spec(spec)


# ---------------------------------------------------------------------------- state


class SweepStore:
    """``.vrl/sweeps/NAME/``: sweep.json (definition and trial states) and the logs."""

    def __init__(self, repo: Any, name: str) -> None:
        self.dir = Path(repo.vrl_dir) / SWEEPS_DIR / name
        self.path = self.dir / "sweep.json"

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise SweepError(f"cannot read {self.path}: {exc}") from None

    def save(self, data: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".tmp-{os.getpid()}-sweep.json")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)  # readers never see half a file

    def log(self, trial: Trial) -> Path:
        return self.dir / f"{trial.name}.log"

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Held while the sweep runs: a second `vrl sweep NAME` would start the same trials
        on the same branches. (An advisory lock, released with the process however it
        ends.)"""
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "a+") as lock:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                pid = lock.read().strip() or "?"
                raise SweepError(f"sweep {self.dir.name!r} is running in another process "
                                 f"(pid {pid})") from None
            lock.seek(0)
            lock.truncate()
            lock.write(f"{os.getpid()}\n")
            lock.flush()
            yield


def trial_status(repo: Any, trial: Trial, steps: int | None) -> tuple[str, str]:
    """("new" | "finished" | "unfinished" | "foreign", why) of a trial's branch."""
    oid = repo.branches().get(trial.branch)
    if oid is None:
        return "new", ""
    commit = repo.read_commit(oid)
    hparams = commit.hparams or {}
    if hparams.get("seed") != trial.seed or commit.step is None:
        return "foreign", (f"branch {trial.branch} exists but is not this trial's run "
                           f"(seed {hparams.get('seed')!r}, step {commit.step!r})")
    target = steps if steps is not None else hparams.get("total_steps")
    if isinstance(target, int) and commit.step >= target:
        return "finished", f"{commit.step} of {target} steps"
    return "unfinished", f"at step {commit.step} of {target}"


# ---------------------------------------------------------------------------- command


@click.command("sweep", context_settings={**HELP, "ignore_unknown_options": True})
@click.argument("name")
@click.option("--grid", "grid_specs", multiple=True, metavar="KEY=V1,V2",
              help="Config values to try, in every combination with every other --grid "
                   "(repeatable).")
@click.option("--random", "random_specs", multiple=True, metavar="KEY=DIST:ARGS",
              help="A value drawn per trial: uniform:LOW,HIGH, loguniform:LOW,HIGH, "
                   "int:LOW,HIGH or choice:A,B,... (repeatable; with --trials).")
@click.option("--trials", type=click.IntRange(min=1), default=None,
              help="Random configurations to draw [with --random: 8].")
@click.option("--sampler-seed", type=int, default=0, show_default=True,
              help="Seeds the draws of --random (the same seed draws the same trials).")
@click.option("--seeds", "seeds_text", default="1", show_default=True, metavar="N|A,B",
              help="Seeds of every configuration: a count (3: seeds 1, 2, 3) or a list.")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Agent-steps of every trial (a larger total on a finished sweep "
                   "continues its trials).")
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Trials running at a time (each a `vrl train` process).")
@click.option("--resume", is_flag=True,
              help="Continue sweep NAME as it was defined: skip finished trials, continue "
                   "unfinished ones.")
@click.option("--dry-run", is_flag=True, help="Print the trials and their commands only.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run the trials as Ray tasks on this cluster (auto: the running one; "
                   "needs pip install 'vrl[ray]').")
@click.option("--remote", default=None, metavar="NAME",
              help="With --ray: each task trains in a clone of this remote and pushes its "
                   "branch to it.")
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED)
def sweep(name: str, grid_specs: tuple[str, ...], random_specs: tuple[str, ...],
          trials: int | None, sampler_seed: int, seeds_text: str, steps: int | None,
          workers: int, resume: bool, dry_run: bool, ray_address: str | None,
          remote: str | None, train_args: tuple[str, ...]) -> None:
    """Train every combination of --grid values (or draws of --random values) with
    every seed, one run per branch sweep/NAME/<values>-s<seed>.

    Trials are `vrl train` processes, --workers at a time; other options (--preset,
    --set, --env, --algo, --device, ...) go to every one of them.

    \b
    vrl sweep lr --grid learning_rate=1e-4,3e-4 --seeds 3 --steps 100000
    vrl sweep lr --resume                  skip finished trials, continue the others
    vrl compare 'sweep/lr/*' --group-by learning_rate
    """
    from vrl import Repo

    with one_line_errors():
        repo = Repo(".")
    with one_line_errors():
        check_ref_name_of(name)
    check_ray_options(ray_address, remote)
    store = SweepStore(repo, name)
    stored = store.load()
    if resume:
        if stored is None:
            raise SweepError(f"no sweep {name!r} to resume (none in {store.dir.parent})")
        if grid_specs or random_specs or trials or train_args:
            raise SweepError("--resume continues the stored definition: give no --grid, "
                             "--random, --trials or train options")
        d = stored["definition"]
        grid_specs, random_specs = tuple(d["grid"]), tuple(d["random"])
        trials, sampler_seed, seeds_text = d["trials"], d["sampler_seed"], d["seeds"]
        train_args = tuple(d["train_args"])
        steps = steps if steps is not None else stored.get("steps")
    if not grid_specs and not random_specs:
        raise SweepError("give at least one --grid KEY=V1,V2 or --random KEY=DIST:ARGS")
    grid, rand = parse_grid(grid_specs), parse_random(random_specs)
    both = sorted(set(grid) & set(rand))
    if both:
        raise SweepError(f"{both[0]} is both a --grid and a --random key")
    if trials is not None and not rand:
        raise SweepError("--trials counts --random draws: give a --random KEY=DIST:ARGS")
    trials = trials or (8 if rand else None)
    seeds = parse_seeds(seeds_text)
    ctx = parse_train_args(train_args)
    todo = plan(name, grid, rand, trials or 1, sampler_seed, seeds)
    check_trials(ctx, todo, steps)
    definition = {"grid": list(grid_specs), "random": list(random_specs), "trials": trials,
                  "sampler_seed": sampler_seed, "seeds": seeds_text,
                  "train_args": list(train_args),
                  "config": given(ctx, skip=(*RUN_OPTIONS, "progress"))}
    if stored is not None and not resume and \
            _defining(stored["definition"]) != _defining(definition):
        raise SweepError(f"sweep {name!r} exists with another definition (see "
                         f"{store.path}); continue it with `vrl sweep {name} --resume`, or "
                         "pick another NAME")
    run_args = given(ctx, names=RUN_OPTIONS)
    if dry_run:
        jobs, skipped, foreign = _jobs(repo, store, todo, ctx, run_args, steps)
        for job in jobs:
            click.echo(f"{job.trial.branch}: {shlex.join(['vrl', *job.args[3:]])}")
        for trial, why in skipped:
            click.echo(f"{trial.branch}: finished ({why})")
        for _, why in foreign:
            click.echo(f"error: {why}")
        return
    with store.running():  # from here on, this process is the only one running NAME
        _execute(repo, store, stored, todo, ctx, run_args, steps, workers, definition,
                 ray_address, remote)


def _execute(repo: Any, store: SweepStore, stored: dict[str, Any] | None, todo: list[Trial],
             ctx: click.Context, run_args: list[str], steps: int | None, workers: int,
             definition: dict[str, Any], ray_address: str | None = None,
             remote: str | None = None) -> None:
    """Skip the finished trials, run the others, report, and exit non-zero if any failed
    (1) or the sweep was stopped (130 / 143)."""
    name = store.dir.name
    if remote is not None:  # the trials' branches live on the remote: where are they?
        from trainer.ray_runner import fetch_branches

        with one_line_errors():
            fetch_branches(repo, remote, f"sweep/{name}/")
    jobs, skipped, foreign = _jobs(repo, store, todo, ctx, run_args, steps)
    seeds = sorted({t.seed for t in todo})
    configs = len(todo) // len(seeds)
    logs = os.path.relpath(store.dir)
    click.echo(f"sweep {name}: {len(todo)} trials ({configs} configurations x {len(seeds)} "
               f"seeds), {workers} at a time; logs in "
               f"{store.dir if logs.startswith('..') else logs}")
    state = {"name": name, "definition": definition, "steps": steps,
             # a trial not run this time keeps what an earlier run recorded of it
             "trials": {t.name: {**((stored or {}).get("trials") or {}).get(t.name, {}),
                                 "branch": t.branch, "seed": t.seed, "values": t.values}
                        for t in todo},
             **{k: stored[k] for k in ("created",) if stored}}
    state.setdefault("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for trial, why in skipped:
        state["trials"][trial.name]["status"] = "finished"
        click.echo(f"[{todo.index(trial) + 1}/{len(todo)}] {'skip':<8}{trial.branch}  "
                   f"(finished: {why})")
    for trial, why in foreign:
        state["trials"][trial.name]["status"] = "failed"
        click.echo(f"[{todo.index(trial) + 1}/{len(todo)}] {'FAILED':<8}{trial.branch}: {why}")
    store.save(state)
    head_before = repo.refs.read_raw("HEAD")

    def record(job: Job) -> None:
        entry = state["trials"][job.trial.name]
        entry.update(rc=job.rc, log=job.log.name, seconds=round(job.ended - job.started, 3),
                     started=job.started, ended=job.ended,
                     status="finished" if job.rc == 0 else
                     "interrupted" if job.stopped else "failed")
        store.save(state)

    try:
        if ray_address is not None:
            from trainer.ray_runner import run_jobs_ray

            stopped = run_jobs_ray(jobs, workers, len(todo), ray_address, remote, repo,
                                   on_end=record)
            if remote is not None:
                from trainer.ray_runner import fetch_branches

                with one_line_errors():
                    fetch_branches(repo, remote, f"sweep/{name}/")
        else:
            stopped = run_jobs(jobs, workers, len(todo), on_end=record)
    finally:
        _restore_head(repo, head_before, {t.branch for t in todo})
    failed = [j for j in jobs if j.rc not in (0, None) and not j.stopped]
    done = [j for j in jobs if j.rc == 0]
    click.echo(f"sweep {name}: {len(done)} done, {len(skipped)} skipped (finished), "
               f"{len(failed) + len(foreign)} failed"
               + (f", {len(jobs) - len(done) - len(failed)} not finished" if stopped else ""))
    if stopped:
        click.echo(f"vrl: sweep interrupted; continue it with: vrl sweep {name} --resume",
                   err=True)
        raise click.exceptions.Exit(130 if stopped[0] == signal.SIGINT
                                    else 128 + signal.SIGTERM)
    click.echo(f"compare: vrl compare 'sweep/{name}/*' --group-by sweep")
    if failed or foreign:
        raise click.exceptions.Exit(1)


def check_ref_name_of(name: str) -> None:
    from vrl.refs import check_ref_name

    check_ref_name(f"sweep/{name}/x", "branch")
    if "/" in name or name.startswith("."):
        raise SweepError(f"sweep name {name!r}: one word, no '/'")


def _defining(definition: dict[str, Any]) -> dict[str, Any]:
    """What makes two sweeps the same sweep: the trials and the config options, not the
    run options (--device, --threads, ...) nor the steps, which may change on a resume."""
    return {k: definition.get(k) for k in ("grid", "random", "trials", "sampler_seed",
                                           "seeds", "config")}


def _jobs(repo: Any, store: SweepStore, todo: list[Trial], ctx: click.Context,
          run_args: list[str], steps: int | None
          ) -> tuple[list[Job], list[tuple[Trial, str]], list[tuple[Trial, str]]]:
    """The trials to run (new ones start, unfinished ones continue from their branch),
    those already finished, and those whose branch belongs to something else."""
    # --json: the run ends with a JSON line, whose return the sweep shows
    base = [sys.executable, "-m", "vrl", "train", "--no-progress", "--json"]
    config_args = given(ctx, skip=(*RUN_OPTIONS, "progress"))
    steps_args = ["--steps", str(steps)] if steps is not None else []
    jobs: list[Job] = []
    skipped: list[tuple[Trial, str]] = []
    foreign: list[tuple[Trial, str]] = []
    for number, trial in enumerate(todo, 1):
        status, why = trial_status(repo, trial, steps)
        if status == "finished":
            skipped.append((trial, why))
            continue
        if status == "foreign":
            foreign.append((trial, why))
            continue
        if status == "unfinished":
            # the snapshot holds the config: only the total and the run options again
            args = [*base, "--from", trial.branch, *steps_args, *run_args]
        else:
            sets = [w for s in trial.sets() for w in ("--set", s)]
            args = [*base, *config_args, *sets, "--seed", str(trial.seed), *steps_args,
                    *run_args, "--branch", trial.branch]
        jobs.append(Job(trial, args, store.log(trial), status == "unfinished", number))
    return jobs, skipped, foreign


def _restore_head(repo: Any, before: str | None, branches: set[str]) -> None:
    """Every `vrl train` attaches HEAD to its branch; put HEAD back where it was before the
    sweep (unless something other than a trial moved it since)."""
    target = repo.refs.head_target()
    if before is None or target is None or target.removeprefix("refs/heads/") not in branches:
        return
    with contextlib.suppress(Exception):  # HEAD is a convenience: never fail the sweep here
        if before.startswith("ref: "):
            repo.refs.set_head(before[5:].strip(), reason="sweep: back to where HEAD was")
        else:
            repo.refs.set_head(before.strip(), reason="sweep: back to where HEAD was")
