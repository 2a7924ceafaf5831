"""Evaluate a training snapshot: ``vrl eval REV``.

The snapshot's commit says which env, algorithm and config it was trained with
(:func:`trainer.store_hook.read_run`); its policy tensors come through the store
(memory-mapped raw bytes, never unpickled). Episodes are run on fresh envs built from the
stored spec and seeded by ``seed``: the warehouse runs one world per episode in one batch
(its episodes all have the same length); other envs run one copy, episode after episode,
so short episodes are not over-represented. For the warehouse the classical
shortest-path controller (:mod:`trainer.envs.baseline`) runs on the same worlds.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.envs.base import action_mask_of, continuous_of
from trainer.store_hook import SnapshotMismatchError, StoredRun, check_policy_fits, read_run
from vrl import Repo
from vrl.errors import VrlError

MAX_STEPS = 1_000_000  # per evaluation: an env whose episodes never end is an error
MAX_GIF_FRAMES = 1000


class EvalError(VrlError, ValueError):
    """The evaluation cannot run as asked (a one-line CLI error)."""


@dataclass
class EvalResult:
    rev: str
    commit: str
    env_spec: str
    algo: str
    iteration: int | None
    step: int | None
    episodes: int
    greedy: bool
    seed: int
    policy: dict[str, float]
    baseline: dict[str, float] | None = None
    gif: str | None = None
    per_episode: list[dict[str, float]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _summary(episodes: list[dict[str, float]]) -> dict[str, float]:
    """Mean of every episode statistic, plus the spread of the return."""
    keys = list(episodes[0]) if episodes else []
    out = {k: float(np.mean([ep[k] for ep in episodes])) for k in keys}
    if episodes:
        out["return_std"] = float(np.std([ep["return"] for ep in episodes]))
    return out


def _env_kwargs(spec: str, config: Any) -> dict[str, Any]:
    kwargs = dict(config.env)
    if spec == "warehouse":
        kwargs.setdefault("gamma", config.gamma)
    return kwargs


ObsFn = Callable[[torch.Tensor], torch.Tensor]


def frozen_obs_normalizer(state: dict[str, Any], config: Any, device: torch.device) -> ObsFn:
    """What the snapshot's policy saw: with ``norm_obs``, observations normalised by the
    running statistics stored with it (frozen: evaluation does not update them); else
    the env's observations as they are. A snapshot without statistics (``norm_obs`` but
    saved before any observation) normalises nothing."""
    from trainer.normalize import normalize_obs

    stats = (state.get("normalizer") or {}).get("obs") if config.norm_obs else None
    if not isinstance(stats, dict):
        return lambda obs: obs
    mean = torch.as_tensor(stats["mean"]).to(device, torch.float64)
    var = torch.as_tensor(stats["var"]).to(device, torch.float64)
    return lambda obs: normalize_obs(obs, mean, var, config.clip_obs)


def load_policy(repo: Repo, rev: str, env: Any, env_spec: str, run: StoredRun,
                device: torch.device) -> tuple[torch.nn.Module, ObsFn]:
    """The snapshot's actor-critic, checked against ``env`` and loaded from the store,
    and the observation normalisation it was trained with (:func:`frozen_obs_normalizer`)."""
    from trainer.agent import Agent
    from trainer.config import config_from_dict

    config = config_from_dict(run.algo, run.config)
    state = repo.load(run.commit)
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise SnapshotMismatchError(f"{rev} ({run.commit[:12]}) holds no policy")
    agent = Agent(env.obs_dim, env.num_actions, config.hidden_sizes,
                  continuous=continuous_of(env))
    check_policy_fits(state["model"], agent.state_dict(), run, rev, env, env_spec)
    agent.load_state_dict({k: torch.as_tensor(v) for k, v in state["model"].items()})
    return agent.to(device).eval(), frozen_obs_normalizer(state, config, device)


def _actor(agent: torch.nn.Module, greedy: bool, seed: int, device: torch.device,
           obs_fn: ObsFn | None = None):
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)

    @torch.no_grad()
    def act(obs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # masked logits: greedy and sampled actions are both legal where the env masks
        mask = None if mask is None else mask.to(device)
        obs = obs.to(device)
        action, _, _, _, logits = agent.get_action_and_value(
            obs if obs_fn is None else obs_fn(obs), generator=generator, action_mask=mask)
        if not greedy:
            return action
        # deterministic: the most likely action, or the Gaussian's mean (continuous)
        return logits if agent.continuous else logits.argmax(-1)

    return act


def run_episodes(env: Any, act: Any, episodes: int, seed: int) -> list[dict[str, float]]:
    """Step ``env`` with ``act`` until ``episodes`` episodes finished; their statistics."""
    obs = env.reset(seed=seed)
    done: list[dict[str, float]] = []
    for _ in range(MAX_STEPS):
        obs, _, _, _, info = env.step(act(obs, action_mask_of(env)))
        done.extend(info.get("episodes", ()))
        if len(done) >= episodes:
            return done[:episodes]
    raise EvalError(f"only {len(done)} of {episodes} episodes finished in {MAX_STEPS} steps")


def check_options(episodes: int, gif: str | None) -> None:
    """What can be refused before anything is read or run."""
    if episodes < 1:
        raise EvalError(f"--episodes must be at least 1, got {episodes}")
    if gif is not None and importlib.util.find_spec("PIL") is None:
        raise EvalError("--gif needs pillow: pip install 'vrl[plots]'")


def evaluate(repo: Repo, rev: str, *, episodes: int = 10, greedy: bool = False,
             seed: int = 0, device: str = "cpu", gif: str | None = None,
             env_spec: str | None = None, baseline: bool = True) -> EvalResult:
    """Run ``episodes`` episodes of snapshot ``rev``'s policy on its stored env."""
    from trainer.config import config_from_dict
    from trainer.envs import make_env

    check_options(episodes, gif)
    run = read_run(repo, rev)
    spec = env_spec or run.env_spec or "warehouse"
    if gif is not None and spec != "warehouse" and not spec.startswith("gym:"):
        raise EvalError(f"--gif renders the warehouse and Gymnasium envs, not {spec!r}")
    config = config_from_dict(run.algo, run.config)
    # the stored env options belong to the stored env
    kwargs = _env_kwargs(spec, config) if spec == (run.env_spec or "warehouse") else {}
    dev = torch.device(device)
    warehouse = spec == "warehouse"
    env = _make(make_env, spec, episodes if warehouse else 1, dev, seed, kwargs)
    agent, obs_fn = load_policy(repo, rev, env, spec, run, dev)
    per_episode = run_episodes(env, _actor(agent, greedy, seed, dev, obs_fn), episodes, seed)
    result = EvalResult(rev=rev, commit=run.commit, env_spec=spec, algo=run.algo,
                        iteration=run.iteration, step=run.step, episodes=episodes,
                        greedy=greedy, seed=seed, policy=_summary(per_episode),
                        per_episode=per_episode)
    if warehouse and baseline:
        from trainer.envs.baseline import run_baseline

        worlds = _make(make_env, spec, episodes, dev, seed, kwargs)
        result.baseline = _summary(run_baseline(worlds, seed=seed, episodes=1)[:episodes])
    if gif is not None:
        title = (f"{rev} ({run.commit[:12]}): {spec}, {run.algo}, "
                 f"{'greedy' if greedy else 'sampled'}")
        _write_gif(make_env, spec, kwargs, agent, greedy, seed, dev, gif, obs_fn, title)
        result.gif = gif
    return result


def _make(make_env: Any, spec: str, n: int, dev: torch.device, seed: int,
          kwargs: dict[str, Any]) -> Any:
    try:
        return make_env(spec, n, device=dev, seed=seed, env_kwargs=kwargs)
    except VrlError:
        raise
    except Exception as exc:  # third-party env code: any error type
        first = (str(exc).strip().splitlines() or [""])[0]
        raise EvalError(f"cannot create env {spec!r}: {type(exc).__name__}: {first}") from exc


def _write_gif(make_env: Any, spec: str, kwargs: dict[str, Any], agent: torch.nn.Module,
               greedy: bool, seed: int, dev: torch.device, path: str,
               obs_fn: ObsFn | None = None, title: str | None = None) -> None:
    """One episode as an animated GIF: the warehouse's renderer (with its legend), or
    Gymnasium's ``rgb_array`` render mode; each frame headed by ``title`` and the step."""
    from trainer.envs.warehouse import annotate, record_episode, save_gif

    act = _actor(agent, greedy, seed, dev, obs_fn)
    if spec == "warehouse":
        env = _make(make_env, spec, 1, dev, seed, kwargs)
        env.reset(seed=seed)
        record_episode(env, act, gif_path=path, title=title)
        return
    if not spec.startswith("gym:"):
        raise EvalError(f"--gif renders the warehouse and Gymnasium envs, not {spec!r}")
    env = _make(make_env, spec, 1, dev, seed, {**kwargs, "render_mode": "rgb_array"})
    envs = getattr(env, "envs", None)  # the adapter's Gymnasium env copies (one here)

    def frame() -> np.ndarray:
        try:
            image = envs[0].render() if envs else None
        except Exception as exc:  # e.g. gymnasium's DependencyNotInstalled (pygame)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise EvalError(f"cannot render {spec}: {first}") from exc
        if isinstance(image, (tuple, list)):
            image = image[0] if image else None
        if image is None:
            raise EvalError(f"{spec} has no rgb_array renderer, so --gif cannot draw it")
        return np.asarray(image, dtype=np.uint8)

    obs = env.reset(seed=seed)
    frames = [frame()]
    while len(frames) < MAX_GIF_FRAMES:
        obs, _, _, _, info = env.step(act(obs, action_mask_of(env)))
        if info.get("episodes"):
            break  # the env has already reset itself: the next frame is a new episode
        frames.append(frame())
    if title is not None:  # the step counter needs the episode's length: known only now
        frames = [annotate(f, title, f"step {t}/{len(frames) - 1}")
                  for t, f in enumerate(frames)]
    save_gif(frames, path, fps=30)
    env.close()
