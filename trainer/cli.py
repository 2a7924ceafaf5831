"""``vrl train`` / ``vrl eval`` (plugin entry points) and ``python -m trainer``: a thin
layer over :class:`trainer.train.Trainer` and :mod:`trainer.eval` that turns every known
error into one line (``VRL_DEBUG=1`` shows the traceback).

Runs are branches: ``--from BRANCH`` continues that branch in place (new commits on it,
same ``best/<branch>`` tag, counters continue); ``--from REV --branch NEW`` forks a new run
from any snapshot. A snapshot stores the env spec, the algorithm and the resolved config,
so ``--from`` needs no other flag; flags given explicitly override the stored values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from trainer.config import DirtyLayerConfig
from vrl.returns import RETURN_METRIC

HELP = {"help_option_names": ["-h", "--help"]}
# options that a snapshot does not store, so a resume command must repeat them
# (the --dirty-* aliases set config keys, which a snapshot stores)
RUN_OPTIONS = ("device", "precision", "threads", "out", "snapshot_every", "keep_last",
               "best_metric", "progress", "log_every", "as_json")
# --dirty-* options: thin aliases of `--set dirty.KEY=VALUE` (trainer.config.DirtyLayerConfig
# holds the defaults; an alias not given sets nothing)
_DIRTY = DirtyLayerConfig()  # for the help texts only


def _onoff(value: bool) -> str:
    return "on" if value else "off"


DIRTY_ALIASES = {"dirty_layers": "enabled", "dirty_threshold": "threshold",
                 "dirty_window": "window", "dirty_refresh": "refresh",
                 "dirty_criterion": "criterion", "dirty_drift": "drift",
                 "dirty_warmup": "warmup", "dirty_prefix_only": "prefix_only",
                 "dirty_max_depth": "max_depth", "dirty_networks": "networks"}


class Terminated(Exception):
    """Raised in the main thread by SIGTERM (after the Snapshotter flushed, if any)."""


@contextlib.contextmanager
def one_line_errors(*known: type[BaseException], phase: str | None = None
                    ) -> Iterator[None]:
    """VrlErrors (and the ``known`` exception types) become a ClickException: one line,
    exit code 1. With ``phase`` ("cannot create env ..."), any exception is reported: env
    constructors are third-party code whose errors (gymnasium.error.NameNotFound, ...)
    share no base class. ``VRL_DEBUG=1`` lets the traceback through."""
    from vrl.errors import VrlError

    try:
        yield
    except click.ClickException:
        raise
    except (VrlError, *known) as exc:
        if os.environ.get("VRL_DEBUG"):
            raise
        raise click.ClickException(_one_line(exc)) from exc
    except Exception as exc:
        if phase is None or os.environ.get("VRL_DEBUG"):
            raise
        raise click.ClickException(f"{phase}: {type(exc).__name__}: {_one_line(exc)}") from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return (text.strip().splitlines() or [type(exc).__name__])[0]


def _from_yaml(path: str | None, key: str) -> str | None:
    """``algo`` or ``env_spec`` of a --config file (as `--out` writes them), if any."""
    if path is None:
        return None
    from trainer.config import ConfigError, load_yaml

    data = load_yaml(path) or {}
    value = data.get(key) if isinstance(data, dict) else None
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{path}: {key} must be a string, got {value!r}")
    return value


def build(env: str, algo: str | None, config_path: str | None, overrides: tuple[str, ...],
          steps: int | None, seed: int | None, device: str, precision: str,
          out: str | None, progress: bool, log_every: int | None,
          base: dict | None = None, threads: int | None = None, preset: str | None = None):
    """Create (trainer, dist context) exactly as the command would; used by tests too.

    ``base`` is a stored config (``vrl train --from``) that --config and --set override."""
    import torch

    from trainer.config import CONFIGS, config_to_dict, fold_flat_dirty, load_config
    from trainer.devices import resolve_device
    from trainer.distributed import init_distributed
    from trainer.envs import make_env
    from trainer.hooks import JSONLLogger, ProgressHook, TensorBoardLogger
    from trainer.presets import preset_algo
    from trainer.train import Trainer

    algo = (algo or _from_yaml(config_path, "algo") or preset_algo(preset)
            or (base or {}).get("algo") or "ppo")
    if base is not None and algo in CONFIGS:
        # a stored config of another algorithm (or an older trainer): keep what still fits
        names = {f.name for f in dataclasses.fields(CONFIGS[algo])}
        base = {k: v for k, v in fold_flat_dirty(base).items() if k in names}
    overrides = tuple(overrides)
    if steps is not None:
        overrides += (f"total_steps={steps}",)  # validated like any other field
    if seed is not None:
        overrides += (f"seed={seed}",)
    config = load_config(algo, config_path, overrides, base=base, preset=preset)
    dev = resolve_device(device)
    if dev.type == "cpu" or threads:
        # RL policies are small: one intra-op thread is fastest, and several spin-waiting
        # OpenMP threads slow down 10x or more when another process shares the cores
        torch.set_num_threads(threads or 1)
    dist = init_distributed(dev)
    env_kwargs = dict(config.env)
    if env == "warehouse":
        env_kwargs.setdefault("gamma", config.gamma)
    rank_seed = config.seed + 7919 * dist.rank
    with one_line_errors(ValueError, ImportError, phase=f"cannot create env {env!r}"):
        vec = make_env(env, config.num_envs, device=dev, seed=rank_seed, env_kwargs=env_kwargs)
        eval_env = None
        if config.eval_interval and dist.is_main:
            eval_env = make_env(env, config.num_envs, device=dev, seed=rank_seed + 1,
                                env_kwargs=env_kwargs)
    hooks = []
    if dist.is_main:
        hooks.append(ProgressHook(every=log_every, bar=progress))
        if out is not None:
            out_dir = Path(out)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "config.yaml").write_text(yaml.safe_dump(
                {"algo": algo, "env_spec": env, **config_to_dict(config)}, sort_keys=False))
            hooks.append(JSONLLogger(out_dir))
            try:
                hooks.append(TensorBoardLogger(out_dir / "tb"))
            except ImportError:
                pass  # TensorBoard is optional
    trainer = Trainer(vec, config, device=dev, precision=precision, hooks=hooks,
                      eval_env=eval_env, dist=dist, env_spec=env)
    return trainer, dist


@click.command("train", context_settings=HELP)
@click.option("--env", "env", default=None,
              help="The env: warehouse, gym:ID, gym:MODULE:ID or pettingzoo:MODULE:FACTORY "
                   "[default: the --config file's env_spec, the snapshot's with --from, "
                   "else warehouse].")
@click.option("--algo", type=click.Choice(["ppo", "gspo"]), default=None,
              help="The algorithm [default: the --config file's algo, the snapshot's with "
                   "--from, else ppo].")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="A YAML file of config fields.")
@click.option("--preset", default=None, metavar="NAME",
              help="A shipped configuration (trainer/presets/NAME.yaml) that reproduces a "
                   "published run, e.g. warehouse, gspo or cleanrl; --config and --set "
                   "override it.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config field, e.g. --set learning_rate=3e-4 "
                   "--set env.num_agents=10 (repeatable).")
@click.option("--steps", type=int, default=None,
              help="The run's total agent-steps, rounded up to whole iterations; with "
                   "--from, the total to reach, counting the steps already done.")
@click.option("--iterations", type=int, default=None,
              help="Stop after this many iterations (resume later with --from).")
@click.option("--seed", type=int, default=None,
              help="Seed the network, the envs and the action sampling [default: the "
                   "config's].")
@click.option("--device", default="auto", show_default=True,
              help="Where to train: auto, cpu, cuda[:i] or npu[:i].")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True, help="Train in full precision or with bf16 / fp16 autocast.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="A directory for metrics.jsonl, config.yaml and TensorBoard logs.")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch [default: 1 on CPU; wide models may gain from "
                   "more].")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="Show a progress bar over the agent-steps.")
@click.option("--log-every", type=int, default=None,
              help="Print a metric line every N iterations (0: none) [default: about 20-40 "
                   "lines a run, from the first iteration on].")
@click.option("--json", "as_json", is_flag=True,
              help="End with a JSON summary for scripts instead of sentences.")
@click.option("--store/--no-store", default=None,
              help="Commit snapshots to the vrl repository around the current directory "
                   "[default: when there is one].")
@click.option("--from", "from_rev", default=None, metavar="REV",
              help="Start from this snapshot with its env, algorithm and config (exact "
                   "resume); a branch name continues that branch in place.")
@click.option("--branch", default=None,
              help="The branch to commit on; with --from REV, the new branch to fork to "
                   "[default: with --from BRANCH, that branch; else a new one per run, "
                   "<algo>-<date>-<time>].")
@click.option("--snapshot-every", type=int, default=1, show_default=True,
              help="Commit a snapshot every K iterations.")
@click.option("--keep-last", type=int, default=None,
              help="Retention: keep the tensors of the last N snapshots (and of tagged "
                   "ones).")
@click.option("--best-metric", default=RETURN_METRIC, show_default=True,
              help="The snapshot best by this metric carries tag best/<branch>.")
@click.option("--dirty-layers/--no-dirty-layers", default=None,
              help="Freeze layers whose change over recent snapshots is not material "
                   "(= --set dirty.enabled=true|false; the other dirty.* keys: "
                   f"trainer.config.DirtyLayerConfig) [default: {_onoff(_DIRTY.enabled)}].")
@click.option("--dirty-threshold", type=float, default=None,
              help="Threshold criterion: a layer trains while its relative change over "
                   f"the window is above X (= --set dirty.threshold=X) "
                   f"[default: {_DIRTY.threshold}].")
@click.option("--dirty-window", type=int, default=None,
              help="The snapshots (or a layer's recent iterations) the criteria look at "
                   f"(= --set dirty.window=N) [default: {_DIRTY.window}].")
@click.option("--dirty-refresh", type=int, default=None,
              help="Every N iterations all layers train, so frozen ones can come back "
                   f"(= --set dirty.refresh=N) [default: {_DIRTY.refresh}].")
@click.option("--dirty-criterion", type=click.Choice(["threshold", "plasticity", "drift"]),
              default=None,
              help="How to decide, from commit statistics: threshold (one global relative "
              "change), plasticity (a layer's recent movement over its own earlier "
              "movement) or drift (net change over path length in the window: still "
              f"travelling or only jittering) (= --set dirty.criterion=NAME) "
              f"[default: {_DIRTY.criterion}].")
@click.option("--dirty-drift", type=float, default=None,
              help="Drift criterion: freeze a layer whose drift is below X "
                   f"(= --set dirty.drift=X) [default: {_DIRTY.drift}].")
@click.option("--dirty-warmup", type=int, default=None,
              help="Iterations of this run (or fork) before any layer is frozen "
                   f"(= --set dirty.warmup=N) [default: {_DIRTY.warmup}].")
@click.option("--dirty-prefix-only/--no-dirty-prefix-only", default=None,
              help="Freeze only input-side layers, so the backward pass stops before them "
                   "(= --set dirty.prefix_only=true|false) "
                   f"[default: {_onoff(_DIRTY.prefix_only)}].")
@click.option("--dirty-max-depth", type=int, default=None,
              help="With --dirty-prefix-only, freeze at most N layers of each network "
                   "(= --set dirty.max_depth=N) [default: no limit].")
@click.option("--dirty-networks", default=None, metavar="NAMES",
              help="Freeze only layers of these networks, comma-separated (e.g. critic: "
              "the policy keeps all its plasticity) (= --set dirty.networks=NAMES) "
              "[default: any network].")
@click.pass_context
def train(ctx: click.Context, **options: Any) -> None:
    """Train a shared policy with PPO or GSPO, committing snapshots as it trains.

    \b
    vrl train --from BRANCH           continue BRANCH in place (Ctrl-C prints this command)
    vrl train --from REV --branch NEW fork a new run from any snapshot
    """
    from vrl.interrupt import InterruptLatch

    # before torch is imported: a Ctrl-C during that import is swallowed (and leaves numpy
    # half-imported); the latch delivers it again at the next check
    latch = ctx.with_resource(InterruptLatch())
    with one_line_errors():
        _train(ctx, latch, **options)


def dirty_overrides(o: dict[str, Any]) -> tuple[str, ...]:
    """The ``--dirty-*`` options given, as ``dirty.KEY=VALUE`` overrides (JSON values, which
    YAML reads back unchanged); options not given add nothing."""
    out = []
    for option, key in DIRTY_ALIASES.items():
        value = o.get(option)
        if value is None:
            continue
        if key == "networks":
            value = [n.strip() for n in value.split(",") if n.strip()]
        out.append(f"dirty.{key}={json.dumps(value)}")
    return tuple(out)


def _check_run_options(o: dict[str, Any]) -> None:
    for name, low in (("iterations", 1), ("snapshot_every", 1), ("keep_last", 1),
                      ("threads", 1), ("log_every", 0)):
        if o[name] is not None and o[name] < low:
            flag = "--" + name.replace("_", "-")
            raise click.ClickException(f"{flag} must be at least {low}, got {o[name]}")
    if o["steps"] is not None and o["steps"] < 1:
        raise click.ClickException(f"--steps must be a positive number of agent-steps, "
                                   f"got {o['steps']}")


def _open_repo(store: bool | None, from_rev: str | None):
    """(repo or None, untracked): --store/--from need a repository; the default uses one
    when the current directory is inside one."""
    from vrl import Repo
    from vrl.errors import NotARepositoryError

    if store or from_rev:
        try:
            return Repo("."), False
        except NotARepositoryError as exc:
            why = "--from" if from_rev else "--store"
            raise click.ClickException(f"{why} needs a vrl repository: {exc}") from None
    if store is None:
        try:
            return Repo("."), False
        except NotARepositoryError:
            return None, True
    return None, False


def _train(ctx: click.Context, latch: Any, **o: Any) -> None:
    from trainer.distributed import shutdown
    from trainer.store_hook import check_fits, read_run
    from trainer.train import whole_iterations

    latch.check()

    _check_run_options(o)
    repo, untracked = _open_repo(o["store"], o["from_rev"])
    run = read_run(repo, o["from_rev"]) if o["from_rev"] else None
    env = (o["env"] or _from_yaml(o["config_path"], "env_spec")
           or (run.env_spec if run else None) or "warehouse")
    if run is not None and run.env_spec is None and env == "warehouse" and not o["env"]:
        click.echo(f"vrl: {o['from_rev']} does not say which env it was trained on; "
                   "assuming --env warehouse (pass --env to say otherwise)", err=True)
    base = {**run.config, "algo": run.algo} if run else None
    if base is not None and env != (run.env_spec or "warehouse"):
        base["env"] = {}  # the stored env options belong to the stored env
    try:
        with one_line_errors(ValueError, ImportError, RuntimeError):  # e.g. --device cuda
            # the --dirty-* aliases come after --set, as --steps and --seed do
            overrides = tuple(o["overrides"]) + dirty_overrides(o)
            trainer, dist = build(env, o["algo"], o["config_path"], overrides,
                                  o["steps"], o["seed"], o["device"], o["precision"],
                                  o["out"], o["progress"], o["log_every"], base=base,
                                  threads=o["threads"], preset=o["preset"])
    except click.ClickException:
        latch.check()  # an import broken by a swallowed Ctrl-C: report the Ctrl-C
        raise
    trainer.hooks.append(_InterruptCheck(latch))
    if untracked and dist.is_main:
        click.echo("vrl: not in a vrl repository, so no snapshots are kept "
                   "(`vrl init` first to keep them)", err=True)
    if trainer.config.dirty.enabled and (repo is None or o["store"] is False) \
            and dist.is_main:
        click.echo("vrl: dirty-layer training decides from the stored snapshots, so it is "
                   "off without a store", err=True)
    if run is not None:
        state = repo.load(run.commit)
        check_fits(trainer, state, run, o["from_rev"])
        cfg, stored = trainer.config, run.config
        same_env = (env == (run.env_spec or "warehouse") and cfg.num_envs ==
                    stored.get("num_envs") and cfg.env == (stored.get("env") or {}))
        trainer.load_state_dict(state, restore_env=same_env)
        if not same_env and dist.is_main:
            click.echo("vrl: the env settings differ from the snapshot's: starting fresh "
                       "episodes", err=True)
        # the run's length is this config's total_steps (--steps), counted from step 0,
        # rounded up to whole iterations as a fresh run's is
        remaining = max(0, cfg.total_steps - trainer.global_step)
        trainer.num_iterations = trainer.iteration + whole_iterations(
            remaining, trainer.steps_per_iteration)
    if run is not None and trainer.iteration >= trainer.num_iterations:
        if dist.is_main:
            click.echo(f"vrl: {o['from_rev']} has finished its run ({trainer.global_step} of "
                       f"{trainer.config.total_steps} agent-steps); to train further, give a "
                       f"larger total: {_resume_command(ctx, o['from_rev'])} "
                       f"--steps {2 * max(trainer.global_step, 1)}", err=True)
        shutdown(dist)
        return
    hook, branch = None, None
    store = repo is not None and o["store"] is not False
    if store and dist.is_main:
        hook, branch = _store_hooks(trainer, repo, run, o)
    # (once nothing can refuse the run any more: an error stays the only line)
    note = rounding_note(trainer, "--steps" if o["steps"] is not None else "total_steps")
    if note and dist.is_main:
        click.echo(f"vrl: {note}", err=True)
    interrupted: BaseException | None = None
    restore, previous = _on_sigterm_raise()
    try:
        metrics = trainer.train(o["iterations"])
    except (KeyboardInterrupt, Terminated) as exc:
        interrupted = exc
    finally:
        try:
            if hook is not None:
                hook.close()  # flushes pending snapshots (also on Ctrl-C / SIGTERM)
        finally:
            restore()
            shutdown(dist)
    if interrupted is not None:
        if dist.is_main:
            _print_resume_hint(ctx, trainer, hook, branch, store, interrupted)
        if isinstance(interrupted, Terminated) and callable(previous):
            previous(signal.SIGTERM, None)  # the embedding program's own handler runs too
        raise click.exceptions.Exit(130 if isinstance(interrupted, KeyboardInterrupt)
                                    else 128 + signal.SIGTERM)
    if dist.is_main:
        _print_summary(trainer, metrics, hook, branch, o["as_json"])


def _print_summary(trainer: Any, metrics: dict[str, float], hook: Any, branch: str | None,
                   as_json: bool) -> None:
    """The run's result on stdout: a sentence, or with --json an object for scripts."""
    from vrl.returns import RETURN_METRIC, SMOOTHED_EPISODES, SMOOTHED_RETURN_METRIC

    smoothed = metrics.get(SMOOTHED_RETURN_METRIC)
    if as_json:
        summary = {k: metrics[k] for k in ("charts/global_step", RETURN_METRIC,
                                           SMOOTHED_RETURN_METRIC, "charts/SPS")
                   if k in metrics}
        if hook is not None:
            summary["vrl/branch"] = branch
            summary["vrl/snapshots"] = len(hook.commits)
            summary["vrl/head"] = hook.commits[-1][:12] if hook.commits else None
        click.echo(json.dumps(summary, sort_keys=True))
        return
    n = len(trainer.episode_returns)
    text = f"trained to iteration {trainer.iteration} ({trainer.global_step:,} agent-steps)"
    text += (f"; mean return of the last {n} episodes {smoothed:.4g}" if smoothed is not None
             and n >= SMOOTHED_EPISODES else
             f"; mean return of the {n} episodes so far {smoothed:.4g}" if smoothed is not None
             else "; no episode has ended yet")
    click.echo(text)
    if hook is not None and hook.commits:
        click.echo(f"{_plural(len(hook.commits), 'snapshot')} on branch {branch}, head "
                   f"{hook.commits[-1][:12]}; `vrl log --metrics {RETURN_METRIC}` lists them")


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def rounding_note(trainer: Any, label: str = "--steps") -> str | None:
    """One line when the run's total steps are not whole iterations and were rounded up
    (None when they are): "--steps 200000 is 48.8 iterations of 4,096 steps: training 49
    iterations (200,704 steps)"."""
    total, per = trainer.config.total_steps, trainer.steps_per_iteration
    # what the run will have done at its last iteration (a resumed run: from where it is)
    planned = trainer.global_step + (trainer.num_iterations - trainer.iteration) * per
    if planned == total or total % per == 0:
        return None
    exact = total / per
    shown = f"{exact:.1f}"
    if shown == f"{round(exact)}.0":  # 48.97 is not "49.0 iterations"
        shown = f"{exact:.3f}"
    return (f"{label} {total} is {shown} iterations of {per:,} steps: training "
            f"{trainer.num_iterations} iterations ({planned:,} steps)")


def _on_sigterm_raise():
    """SIGTERM raises Terminated in the main thread, so the run ends like on Ctrl-C (the
    Snapshotter's own handler, installed on top while training, flushes first and then
    calls this one). Returns the function that puts the previous handler back, and that
    handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return (lambda: None), None

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    return (lambda: signal.signal(signal.SIGTERM, previous)), previous


def _resume_command(ctx: click.Context, branch: str) -> str:
    """The command that continues ``branch``: this command's name, ``--from``, and the
    options given on this command line that a snapshot does not store."""
    words = [ctx.command_path, "--from", branch, *given(ctx, names=RUN_OPTIONS)]
    return " ".join(shlex.quote(w) if i else w for i, w in enumerate(words))


def given(ctx: click.Context, names: Sequence[str] | None = None,
          skip: Sequence[str] = ()) -> list[str]:
    """The options of a parsed ``vrl train`` context given on its command line (those in
    ``names`` only, if given), as arguments again."""
    from click.core import ParameterSource

    words: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None or \
                (names is not None and param.name not in names) or param.name in skip or \
                ctx.get_parameter_source(param.name) != ParameterSource.COMMANDLINE:
            continue
        value = ctx.params.get(param.name)
        if param.is_flag:
            if value:
                words.append(param.opts[0])
            elif param.secondary_opts:
                words.append(param.secondary_opts[0])
        elif param.multiple:
            for item in value or ():
                words += [param.opts[0], str(item)]
        elif value is not None:
            words += [param.opts[0], str(value)]
    return words


def _print_resume_hint(ctx, trainer, hook, branch, store, exc) -> None:
    what = "interrupted" if isinstance(exc, KeyboardInterrupt) else "terminated (SIGTERM)"
    where = f"at iteration {trainer.iteration} (step {trainer.global_step})"
    if not store:
        click.echo(f"vrl: {what} {where}; no snapshots were kept (no repository or "
                   "--no-store), so there is nothing to resume", err=True)
        return
    if hook is not None and hook.commits:
        click.echo(f"vrl: {what} {where}; last snapshot {hook.commits[-1][:12]} is committed "
                   f"on branch {branch}", err=True)
    elif branch is not None and branch in hook.repo.branches():
        click.echo(f"vrl: {what} {where}; no new snapshot was committed, branch {branch} "
                   "is where it started", err=True)
    else:
        click.echo(f"vrl: {what} {where} before the first snapshot; run the same command "
                   "again to start over", err=True)
        return
    click.echo(f"vrl: resume with: {_resume_command(ctx, branch)}", err=True)


class _InterruptCheck:
    """A Ctrl-C swallowed where it landed stops the run at the next iteration boundary."""

    def __init__(self, latch) -> None:
        self.latch = latch

    def on_start(self, trainer) -> None:
        self.latch.check()

    def on_iteration_end(self, trainer, iteration, metrics) -> None:
        self.latch.check()

    def on_evaluation(self, trainer, iteration, metrics) -> None:
        self.latch.check()

    def on_end(self, trainer, metrics) -> None:
        pass


def _store_hooks(trainer, repo, run, o):
    """Pick the run's branch (continue, fork or new), attach HEAD to it, and add the store
    (and dirty-layer) hooks in front of the others, so they see each iteration first."""
    import time

    from trainer.dirty_layers import DirtyLayerController
    from trainer.store_hook import StoreHook
    from vrl.errors import RefConflictError

    from_rev, branch = o["from_rev"], o["branch"]
    branches = repo.branches()
    start = run.commit if run else None
    if branch is None and from_rev is not None:
        # `--from BRANCH` (or `--from HEAD` on a branch, as git commits on HEAD's branch):
        # continue that branch in place
        named = repo.current_branch() if from_rev == "HEAD" else from_rev
        branch = named if named in branches else None
    if branch is None:
        stem = f"{trainer.config.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
        branch, n = stem, 1
        while branch in branches:
            n += 1
            branch = f"{stem}-{n}"
    continuing = start is not None and branches.get(branch) == start
    if branch in branches and not continuing:
        if start is None:
            raise click.ClickException(
                f"branch {branch!r} already exists; continue it with `--from {branch}`, or "
                f"fork it with `--from {branch} --branch NEW`, or pick another --branch")
        raise click.ClickException(
            f"branch {branch!r} already exists and is not at {from_rev} ({start[:12]}); "
            f"continue it with `--from {branch}`, or fork {from_rev} to a new --branch")
    if start is not None and not continuing:
        try:
            repo.branch(branch, start)
        except RefConflictError:
            raise click.ClickException(f"branch {branch!r} was just created by someone "
                                       "else; pick another --branch") from None
    repo.refs.set_head(f"refs/heads/{branch}", reason=f"train: run on {branch}")
    hook = StoreHook(repo, every=o["snapshot_every"], branch=branch,
                     best_metric=o["best_metric"] or None, best_tag=f"best/{branch}",
                     keep_last=o["keep_last"])
    hooks = [hook]
    if trainer.config.dirty.enabled:  # the config's dirty section (--dirty-* / dirty.*)
        hooks.append(DirtyLayerController(hook, trainer.config.dirty))
    trainer.hooks[:0] = hooks
    if continuing:
        note = f" (continuing at iteration {trainer.iteration}, step {trainer.global_step})"
    elif start is not None:
        note = f" (forked from {from_rev} at {start[:12]})"
    else:
        note = ""
    click.echo(f"vrl: committing snapshots to branch {branch}{note}", err=True)
    return hook, branch


AUTO_GIF = "\0auto"  # `--gif` given without a file (no path holds a NUL byte)


@click.command("eval", context_settings=HELP)
@click.argument("rev", default="HEAD")
@click.option("--episodes", type=int, default=10, show_default=True,
              help="Episodes to run (warehouse: one world each, in one batch).")
@click.option("--greedy/--sample", default=False, show_default=True,
              help="Take the most likely action (continuous: the mean), or sample from "
                   "the policy.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed the envs and the action sampling.")
@click.option("--env", "env_spec", default=None,
              help="Run on this env instead of the one stored with the snapshot.")
@click.option("--device", default="cpu", show_default=True,
              help="Where to run: cpu, cuda[:i] or npu[:i].")
@click.option("--gif", is_flag=False, flag_value=AUTO_GIF, default=None, metavar="[FILE]",
              help="Write one episode as an animated GIF (the warehouse, or a Gymnasium "
                   "env with an rgb_array renderer; needs pillow): to FILE, or without "
                   "one to .vrl/eval/ID.gif, where `vrl ui` shows it on the commit's page.")
@click.option("--baseline/--no-baseline", default=True, show_default=True,
              help="Warehouse: also run the shortest-path controller on the same worlds.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def eval_command(rev: str, episodes: int, greedy: bool, seed: int, env_spec: str | None,
                 device: str, gif: str | None, baseline: bool, as_json: bool) -> None:
    """Run a snapshot's policy (any revision, e.g. best/<branch>) on the env it was
    trained on, and print the env's metrics (next to the classical baseline for the
    warehouse)."""
    with one_line_errors(ValueError, ImportError):
        _eval(rev, episodes, greedy, seed, env_spec, device, gif, baseline, as_json)


def _eval(rev, episodes, greedy, seed, env_spec, device, gif, baseline, as_json) -> None:
    import torch

    from trainer.eval import check_options, evaluate
    from vrl import Repo

    check_options(episodes, gif)  # (refused before the repository is even opened)
    repo = Repo(".")
    if gif == AUTO_GIF:  # beside the store, named by the commit: the UI finds it there
        folder = repo.vrl_dir / "eval"
        folder.mkdir(exist_ok=True)
        gif = str(folder / f"{repo.resolve(rev)[:12]}.gif")
    torch.set_num_threads(1)
    result = evaluate(repo, rev, episodes=episodes, greedy=greedy, seed=seed,
                      device=device, gif=gif, env_spec=env_spec, baseline=baseline)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
        return
    from vrl.cli._common import fmt_num, table

    at = ", ".join(x for x in (
        f"iteration {result.iteration}" if result.iteration is not None else "",
        f"step {result.step}" if result.step is not None else "") if x)
    click.echo(f"{rev} ({result.commit[:12]}{', ' + at if at else ''}): {result.env_spec}, "
               f"{result.algo}; {result.episodes} episodes, "
               f"{'greedy' if result.greedy else 'sampled'} actions, seed {result.seed}")
    headers = ["metric", "policy"] + (["baseline"] if result.baseline else [])
    rows = [[key, fmt_num(value)] + ([fmt_num(result.baseline.get(key))]
                                     if result.baseline else [])
            for key, value in result.policy.items()]
    click.echo(table(headers, rows))
    if result.baseline:
        click.echo("baseline: shortest-path controller (trainer/envs/baseline.py) on the "
                   "same worlds")
    if result.gif:
        click.echo(f"wrote {result.gif}")
