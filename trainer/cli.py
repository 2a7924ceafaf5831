"""``vrl train`` (plugin entry point) and ``python -m trainer``: a thin layer over
:class:`trainer.train.Trainer` that turns known errors into a short message."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import yaml


def _load_algo_from_yaml(path: str | None) -> str | None:
    if path is None:
        return None
    from trainer.config import load_yaml

    data = load_yaml(path) or {}
    return data.get("algo") if isinstance(data, dict) else None


def build(env: str, algo: str | None, config_path: str | None, overrides: tuple[str, ...],
          steps: int | None, seed: int | None, device: str, precision: str,
          out: str | None, progress: bool, log_every: int,
          base: dict | None = None, threads: int | None = None, preset: str | None = None):
    """Create (trainer, dist context) exactly as the command would; used by tests too.

    ``base`` is a stored config (``vrl train --from``) that --config and --set override."""
    import torch

    from trainer.config import load_config
    from trainer.devices import resolve_device
    from trainer.distributed import init_distributed
    from trainer.envs import make_env
    from trainer.hooks import JSONLLogger, ProgressHook, TensorBoardLogger
    from trainer.presets import preset_algo
    from trainer.train import Trainer

    algo = (algo or _load_algo_from_yaml(config_path) or preset_algo(preset)
            or (base or {}).get("algo") or "ppo")
    config = load_config(algo, config_path, overrides, base=base, preset=preset)
    if steps is not None:
        config.total_steps = steps
    if seed is not None:
        config.seed = seed
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
            (out_dir / "config.yaml").write_text(
                yaml.safe_dump({"algo": algo, **dataclasses.asdict(config)}, sort_keys=False))
            hooks.append(JSONLLogger(out_dir))
            try:
                hooks.append(TensorBoardLogger(out_dir / "tb"))
            except ImportError:
                pass  # TensorBoard is optional
    trainer = Trainer(vec, config, device=dev, precision=precision, hooks=hooks,
                      eval_env=eval_env, dist=dist)
    return trainer, dist


@click.command("train")
@click.option("--env", "env", default="warehouse", show_default=True,
              help="warehouse | gym:ID | pettingzoo:module:factory")
@click.option("--algo", type=click.Choice(["ppo", "gspo"]), default=None,
              help="algorithm (default: the config file's 'algo', else ppo)")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="YAML file of config fields")
@click.option("--preset", default=None, metavar="NAME",
              help="a shipped configuration (trainer/presets/NAME.yaml) that reproduces a "
                   "published run, e.g. warehouse, gspo, cleanrl; --config and --set "
                   "override it")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a config field, e.g. --set learning_rate=3e-4 "
                   "--set env.num_agents=10 (repeatable)")
@click.option("--steps", type=int, default=None, help="total agent-steps of the run")
@click.option("--iterations", type=int, default=None,
              help="stop after this many iterations (resume later with --from)")
@click.option("--seed", type=int, default=None)
@click.option("--device", default="auto", show_default=True, help="auto|cpu|cuda[:i]|npu[:i]")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="directory for metrics.jsonl, config.yaml and TensorBoard logs")
@click.option("--threads", type=int, default=None,
              help="CPU threads for torch [default: 1 on CPU; wide models may gain from more]")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--log-every", type=int, default=10, show_default=True,
              help="print a metric line every N iterations")
@click.option("--store/--no-store", default=None,
              help="commit snapshots to the vrl repository around the current directory "
                   "[default: when there is one]")
@click.option("--from", "from_rev", default=None, metavar="REV",
              help="start from this snapshot (exact resume; its config is the base)")
@click.option("--branch", default=None,
              help="branch to commit on [a new one per run: <algo>-<date>-<time>]")
@click.option("--snapshot-every", type=int, default=1, show_default=True,
              help="commit a snapshot every K iterations")
@click.option("--keep-last", type=int, default=None,
              help="retention: keep the tensors of the last N snapshots (and tagged ones)")
@click.option("--best-metric", default="charts/return_last100", show_default=True,
              help="the snapshot best by this metric carries tag best/<branch>")
@click.option("--dirty-layers/--no-dirty-layers", default=False, show_default=True,
              help="freeze layers whose change over recent snapshots is not material")
@click.option("--dirty-threshold", type=float, default=0.02, show_default=True)
@click.option("--dirty-window", type=int, default=3, show_default=True)
@click.option("--dirty-refresh", type=int, default=10, show_default=True)
@click.option("--dirty-criterion", type=click.Choice(["threshold", "plasticity"]),
              default="threshold", show_default=True,
              help="threshold: one global relative change; plasticity: a layer's recent "
              "movement over its own earlier movement (from commit statistics)")
@click.option("--dirty-prefix-only/--no-dirty-prefix-only", default=False, show_default=True,
              help="freeze only input-side layers (the backward pass stops before them)")
def train(env, algo, config_path, preset, overrides, steps, iterations, seed, device,
          precision, out, threads, progress, log_every, store, from_rev, branch,
          snapshot_every, keep_last, best_metric, dirty_layers, dirty_threshold, dirty_window,
          dirty_refresh, dirty_criterion, dirty_prefix_only):
    """Train a shared policy with PPO or GSPO, committing snapshots as it trains."""
    from trainer.config import ConfigError
    from trainer.distributed import shutdown
    from vrl import Repo
    from vrl.errors import NotARepositoryError

    repo = start = None
    if store or from_rev:
        repo = Repo(".")  # a VrlError ("not a vrl repository ...") is reported by vrl
    elif store is None:
        try:
            repo = Repo(".")
        except NotARepositoryError:
            pass
    untracked = store is None and repo is None
    store = repo is not None and store is not False
    if from_rev:
        start = repo.resolve(from_rev)
    base = repo.load(start)["config"] if start else None
    try:
        trainer, dist = build(env, algo, config_path, overrides, steps, seed, device,
                              precision, out, progress, log_every, base=base,
                              threads=threads, preset=preset)
    except (ConfigError, ValueError, ImportError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    if untracked and dist.is_main:
        click.echo("vrl: not in a vrl repository, so no snapshots are kept "
                   "(`vrl init` first to keep them)", err=True)
    if start is not None:
        trainer.load_state_dict(repo.load(start))
        # the run's length comes from this config (--steps), not from the snapshot's
        trainer.num_iterations = max(1, trainer.config.total_steps //
                                     trainer.steps_per_iteration)
    hook = None
    if store and dist.is_main:
        hook, branch = _store_hooks(trainer, repo, start, branch, snapshot_every, keep_last,
                                    best_metric, dirty_layers, dirty_threshold,
                                    dirty_window, dirty_refresh,
                                    dirty_criterion, dirty_prefix_only)
    try:
        metrics = trainer.train(iterations)
    finally:
        if hook is not None:
            hook.close()  # flushes pending snapshots (also on Ctrl-C)
        shutdown(dist)
    if dist.is_main:
        summary = {k: metrics[k] for k in ("charts/global_step", "charts/return_last100",
                                           "charts/SPS") if k in metrics}
        if hook is not None:
            summary["vrl/branch"] = branch
            summary["vrl/snapshots"] = len(hook.commits)
            summary["vrl/head"] = hook.commits[-1][:12] if hook.commits else None
        click.echo(json.dumps(summary, sort_keys=True))


def _store_hooks(trainer, repo, start, branch, every, keep_last, best_metric, dirty,
                 threshold, window, refresh, criterion="threshold", prefix_only=False):
    """Create the run's branch, attach HEAD to it, and add the store (and dirty-layer)
    hooks in front of the others, so they see each iteration first."""
    import time

    from trainer.dirty_layers import DirtyLayerConfig, DirtyLayerController
    from trainer.store_hook import StoreHook
    from vrl.errors import RefConflictError

    if branch is None:
        stem = f"{trainer.config.algo}-{time.strftime('%Y%m%d-%H%M%S')}"
        branch, n = stem, 1
        while branch in repo.branches():
            n += 1
            branch = f"{stem}-{n}"
    if start is not None:
        try:
            repo.branch(branch, start)
        except RefConflictError:
            raise click.ClickException(f"branch {branch!r} already exists; pick another "
                                       "--branch for the new run") from None
    elif branch in repo.branches():
        raise click.ClickException(f"branch {branch!r} already exists; continue it with "
                                   f"--from {branch}, or pick another --branch")
    repo.refs.set_head(f"refs/heads/{branch}", reason=f"train: run on {branch}")
    hook = StoreHook(repo, every=every, branch=branch, best_metric=best_metric or None,
                     best_tag=f"best/{branch}", keep_last=keep_last)
    hooks = [hook]
    if dirty:
        hooks.append(DirtyLayerController(hook, DirtyLayerConfig(
            threshold=threshold, window=window, refresh=refresh, criterion=criterion,
            prefix_only=prefix_only)))
    trainer.hooks[:0] = hooks
    click.echo(f"vrl: committing snapshots to branch {branch}"
               + (f" (from {start[:12]})" if start else ""), err=True)
    return hook, branch
