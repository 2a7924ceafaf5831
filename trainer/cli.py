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
    data = yaml.safe_load(Path(path).read_text()) or {}
    return data.get("algo") if isinstance(data, dict) else None


def build(env: str, algo: str | None, config_path: str | None, overrides: tuple[str, ...],
          steps: int | None, seed: int | None, device: str, precision: str,
          out: str | None, progress: bool, log_every: int):
    """Create (trainer, dist context) exactly as the command would; used by tests too."""
    from trainer.config import load_config
    from trainer.devices import resolve_device
    from trainer.distributed import init_distributed
    from trainer.envs import make_env
    from trainer.hooks import JSONLLogger, ProgressHook, TensorBoardLogger
    from trainer.train import Trainer

    algo = algo or _load_algo_from_yaml(config_path) or "ppo"
    config = load_config(algo, config_path, overrides)
    if steps is not None:
        config.total_steps = steps
    if seed is not None:
        config.seed = seed
    dev = resolve_device(device)
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
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="override a config field, e.g. --set learning_rate=3e-4 "
                   "--set env.num_agents=10 (repeatable)")
@click.option("--steps", type=int, default=None, help="total agent-steps")
@click.option("--seed", type=int, default=None)
@click.option("--device", default="auto", show_default=True, help="auto|cpu|cuda[:i]|npu[:i]")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32",
              show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="directory for metrics.jsonl, config.yaml and TensorBoard logs")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--log-every", type=int, default=10, show_default=True,
              help="print a metric line every N iterations")
def train(env, algo, config_path, overrides, steps, seed, device, precision, out, progress,
          log_every):
    """Train a shared policy with PPO or GSPO."""
    from trainer.config import ConfigError
    from trainer.distributed import shutdown

    try:
        trainer, dist = build(env, algo, config_path, overrides, steps, seed, device,
                              precision, out, progress, log_every)
    except (ConfigError, ValueError, ImportError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        metrics = trainer.train()
    finally:
        shutdown(dist)
    if dist.is_main:
        summary = {k: metrics[k] for k in ("charts/global_step", "charts/return_last100",
                                           "charts/SPS") if k in metrics}
        click.echo(json.dumps(summary, sort_keys=True))

