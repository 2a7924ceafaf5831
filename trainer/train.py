"""The training loop: collect a rollout, update, emit events (CleanRL's main loop as a class).

Public surface used by hooks and by the store:

* ``Trainer.state_dict()`` / ``load_state_dict()`` - model, optimizer, scaler, algorithm
  state, every RNG, counters, environment state and the pending observation; restoring
  it continues bit-identically on CPU (Gymnasium/PettingZoo envs cannot be snapshotted
  and are re-seeded instead).
* ``freeze_layers`` / ``unfreeze_layers`` / ``layer_names`` - an external controller
  (dirty-layer training) switches layers off: no gradients, no optimizer update, no
  Hessian work.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from trainer.agent import Agent, layer_params
from trainer.algos import make_algo
from trainer.algos.ppo import RolloutBuffer
from trainer.config import ConfigError, PPOConfig, config_to_dict
from trainer.devices import Precision, manual_seed_all
from trainer.distributed import DistContext
from trainer.envs.base import VecEnv, action_mask_of, alive_of, continuous_of, state_dict_of
from trainer.hooks import Hook
from trainer.normalize import Normalizer
from vrl.rng import rng_state, set_rng_state

STATE_VERSION = 1
RETURN_METRIC = "charts/return"
"""The return shown everywhere: console line, commit message, best tag, run summary."""
RETURN_EPISODES = 10
"""`charts/return` averages at least this many recent episodes (whole batches of num_envs)."""


def check_batch(config: PPOConfig, slots: int, world_size: int = 1) -> None:
    """The checks of ``config`` that need the env's slot count: one-line ConfigErrors."""
    batch = config.num_steps * slots
    if batch % config.num_minibatches:
        divisors = [d for d in range(1, min(batch, 4096) + 1) if batch % d == 0]
        near = min(divisors, key=lambda d: abs(d - config.num_minibatches))
        raise ConfigError(f"num_minibatches {config.num_minibatches} does not divide the "
                          f"rollout of {batch} samples (num_steps {config.num_steps} x "
                          f"{slots} env slots); use a divisor, e.g. num_minibatches={near}")
    per_iteration = batch * world_size
    if config.total_steps < per_iteration:
        raise ConfigError(f"total_steps {config.total_steps} is less than one iteration "
                          f"({per_iteration} agent-steps: num_steps {config.num_steps} x "
                          f"{slots} env slots" + (f" x {world_size} ranks" if world_size > 1
                                                  else "")
                          + f"); use --steps {per_iteration} or more, or lower num_steps")


def whole_iterations(steps: int, per_iteration: int) -> int:
    """The iterations that train at least ``steps`` agent-steps (rounded up)."""
    return -(-steps // per_iteration)


class Trainer:
    """Runs ``config.total_steps`` agent-steps of PPO or GSPO on ``env``, rounded up to
    whole iterations (``total_steps`` is what it plans: ``num_iterations`` of them)."""

    def __init__(
        self,
        env: VecEnv,
        config: PPOConfig,
        *,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        hooks: Iterable[Hook] = (),
        eval_env: VecEnv | None = None,
        dist: DistContext | None = None,
        env_spec: str | None = None,
    ) -> None:
        self.env = env
        self.env_spec = env_spec  # the `--env` value, stored with snapshots (None: unknown)
        self.eval_env = eval_env
        self.config = config
        self.device = torch.device(device)
        self.dist = dist or DistContext()
        self.precision = Precision(precision, self.device)
        self.hooks: list[Hook] = list(hooks)

        manual_seed_all(config.seed)  # network initialisation; identical on every rank
        continuous = continuous_of(env)
        self.agent = Agent(env.obs_dim, env.num_actions, config.hidden_sizes,
                           continuous=continuous).to(self.device)
        self.dist.broadcast_module(self.agent)
        rank_seed = config.seed + 7919 * self.dist.rank
        self.action_generator = torch.Generator(device=self.device)
        self.action_generator.manual_seed(rank_seed)
        self.update_generator = torch.Generator(device=self.device)
        self.update_generator.manual_seed(rank_seed + 1)
        self.algo = make_algo(self.agent, config, self.precision, self.dist,
                              self.update_generator)
        self.steps_per_iteration = config.num_steps * env.num_envs * self.dist.world_size
        check_batch(config, env.num_envs, self.dist.world_size)
        # whole iterations, rounded up: a run trains at least the steps it was asked for
        self.num_iterations = whole_iterations(config.total_steps, self.steps_per_iteration)
        # `charts/return`, the one return figure (console, commit message, best tag): the
        # mean of the last RETURN_EPISODES finished episodes, in whole batches of
        # num_envs (the warehouse's worlds finish their episodes together)
        self.return_window = config.num_envs * -(-RETURN_EPISODES // config.num_envs)
        self.iteration = 0
        self.global_step = 0
        self.episode_returns: deque[float] = deque(maxlen=max(100, self.return_window))
        self.last_metrics: dict[str, float] = {}
        self._frozen: set[str] = set()
        self._stop = False
        self._planned_steps: int | None = None  # set once rows of finished agents appear
        # observation/reward normalisation (off by default); `next_obs` stays the env's raw
        # observation, the policy and the buffer get `normalizer.obs(...)` of it
        self.normalizer = Normalizer(env.num_envs, env.obs_dim, norm_obs=config.norm_obs,
                                     norm_reward=config.norm_reward, gamma=config.gamma,
                                     clip_obs=config.clip_obs, clip_reward=config.clip_reward,
                                     device=self.device, dist=self.dist)
        self.next_obs = env.reset(seed=rank_seed)
        self.normalizer.observe(self.next_obs, alive_of(env))
        masked = action_mask_of(env) is not None and not continuous
        self.buffer = RolloutBuffer.allocate(config.num_steps, env.num_envs, env.obs_dim,
                                             self.device, env.num_actions if masked else None,
                                             env.num_actions if continuous else None)

    # ---------------------------------------------------------------- access
    @property
    def model(self) -> Agent:
        return self.agent

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.algo.optimizer

    @property
    def total_steps(self) -> int:
        return self.num_iterations * self.steps_per_iteration

    def request_stop(self) -> None:
        """Finish after the current iteration (hooks may call this)."""
        self._stop = True

    def _emit(self, event: str, *args: Any) -> None:
        for hook in self.hooks:
            getattr(hook, event)(self, *args)

    # --------------------------------------------------------------- freezing
    def layer_names(self) -> list[str]:
        return list(layer_params(self.agent))

    @property
    def frozen_layers(self) -> frozenset[str]:
        return frozenset(self._frozen)

    def freeze_layers(self, names: Iterable[str]) -> None:
        """Stop training these layers: requires_grad False, so they get no gradient, no
        optimizer update (Adam skips params without grad) and no Hessian probes."""
        groups = layer_params(self.agent)
        for name in names:
            if name not in groups:
                raise KeyError(f"no layer {name!r}; layers: {sorted(groups)}")
            for p in groups[name]:
                p.requires_grad_(False)
                p.grad = None
            self._frozen.add(name)

    def unfreeze_layers(self, names: Iterable[str] | None = None) -> None:
        """Train these layers again (all frozen layers when ``names`` is None)."""
        groups = layer_params(self.agent)
        for name in list(self._frozen if names is None else names):
            for p in groups[name]:
                p.requires_grad_(True)
            self._frozen.discard(name)

    # ------------------------------------------------------------------- loop
    def train(self, iterations: int | None = None) -> dict[str, float]:
        """Run until ``num_iterations`` (or ``iterations`` more); returns the last metrics."""
        stop_at = None if iterations is None else self.iteration + iterations
        self._stop = False
        self._planned_steps = None
        self._emit("on_start")
        cfg = self.config
        # num_iterations is re-read: envs with finished agents extend it (run_iteration)
        while (self.iteration < (self.num_iterations if stop_at is None
                                 else min(self.num_iterations, stop_at))
               and not self._stop):
            metrics = self.run_iteration()
            self._emit("on_iteration_end", self.iteration, metrics)
            if (cfg.eval_interval and self.eval_env is not None
                    and self.iteration % cfg.eval_interval == 0):
                eval_metrics = self.evaluate()
                self._emit("on_evaluation", self.iteration, eval_metrics)
        self._emit("on_end", self.last_metrics)
        return self.last_metrics

    @torch.no_grad()
    def collect_rollout(self) -> list[dict[str, float]]:
        """Fill the buffer with ``num_steps`` steps; returns the finished episodes."""
        buf, env, cfg = self.buffer, self.env, self.config
        norm = self.normalizer
        episodes: list[dict[str, float]] = []
        next_obs = self.next_obs
        for step in range(cfg.num_steps):
            obs = norm.obs(next_obs)
            buf.obs[step] = obs
            alive, mask = alive_of(env), action_mask_of(env)
            buf.alive[step] = True if alive is None else alive.to(self.device)
            if mask is not None:
                mask = mask.to(self.device)
                buf.action_masks[step] = mask
            with self.precision.autocast():
                action, logprob, _, value, _ = self.agent.get_action_and_value(
                    obs, generator=self.action_generator, action_mask=mask)
            buf.values[step] = value
            buf.actions[step] = action
            buf.logprobs[step] = logprob
            next_obs, reward, terminated, truncated, info = env.step(action)
            # the statistics see every observation once, when it arrives (then normalised
            # with them, as Gymnasium's NormalizeObservation does)
            norm.observe(next_obs, alive_of(env))
            reward = reward.to(self.device).float()
            # logged returns (info["episodes"]) stay the env's; the update sees scaled ones
            reward = norm.reward(reward, terminated | truncated, alive)
            if "final_obs" in info:
                # a time limit is not a terminal state: bootstrap with V(final_obs)
                with self.precision.autocast():
                    final_value = self.agent.get_value(norm.obs(info["final_obs"]))
                bootstrap = (truncated & ~terminated).to(self.device)
                reward = reward + cfg.gamma * final_value * bootstrap
            buf.rewards[step] = reward
            buf.dones[step] = (terminated | truncated).to(self.device).float()
            episodes.extend(info.get("episodes", ()))
        self.next_obs = next_obs
        return episodes

    def run_iteration(self) -> dict[str, float]:
        """One rollout plus one update; returns this iteration's metrics."""
        self.iteration += 1
        t0 = time.perf_counter()
        episodes = self.collect_rollout()
        steps = self._count_steps()
        self.global_step += steps
        t1 = time.perf_counter()
        with torch.no_grad(), self.precision.autocast():
            next_value = self.agent.get_value(self.normalizer.obs(self.next_obs))
        progress = (self.iteration - 1) / self.num_iterations
        metrics = self.algo.update(self.buffer, next_value.float(), progress)
        t2 = time.perf_counter()

        metrics["charts/global_step"] = float(self.global_step)
        metrics["charts/SPS"] = steps / (t2 - t0)
        metrics["perf/rollout_s"] = t1 - t0
        metrics["perf/update_s"] = t2 - t1
        metrics["charts/frozen_layers"] = float(len(self._frozen))
        if episodes:
            returns = [ep["return"] for ep in episodes]
            self.episode_returns.extend(returns)
            metrics["charts/episodic_return"] = float(np.mean(returns))
            metrics["charts/episodic_length"] = float(np.mean([ep["length"] for ep in episodes]))
            for key in episodes[0]:
                if key not in ("return", "length"):
                    metrics[f"env/{key}"] = float(np.mean([ep[key] for ep in episodes]))
        if self.episode_returns:
            recent = list(self.episode_returns)[-self.return_window:]
            metrics[RETURN_METRIC] = float(np.mean(recent))
            metrics["charts/return_last100"] = float(np.mean(list(self.episode_returns)[-100:]))
        self.last_metrics = metrics
        return metrics

    def _count_steps(self) -> int:
        """Agent-steps of the rollout just collected, over all ranks: rows of agents that
        had finished are not steps. Once there were such rows, ``num_iterations`` is
        re-estimated from the steps per iteration so far, so that the run still ends
        after the agent-steps it planned (``num_iterations * steps_per_iteration``)."""
        if alive_of(self.env) is None:
            return self.steps_per_iteration
        count = self.buffer.alive.sum().float().reshape(1)
        self.dist.all_reduce_mean([count])  # the same on every rank, so are the iterations
        steps = round(float(count) * self.dist.world_size)
        if steps < self.steps_per_iteration and self._planned_steps is None:
            self._planned_steps = self.num_iterations * self.steps_per_iteration
        if self._planned_steps is not None:
            done = self.global_step + steps
            per_iteration = max(1.0, done / self.iteration)
            self.num_iterations = max(self.iteration, self.iteration
                                      + int((self._planned_steps - done) // per_iteration))
        return steps

    @torch.no_grad()
    def evaluate(self, num_episodes: int | None = None, max_steps: int = 100_000
                 ) -> dict[str, float]:
        """Sample the current policy on ``eval_env`` from a fixed seed, with its own
        generator, so evaluating never changes the training RNG streams."""
        env = self.eval_env
        if env is None:
            raise RuntimeError("no eval_env was given to the Trainer")
        num_episodes = num_episodes or self.config.eval_episodes
        gen = torch.Generator(device=self.device)
        gen.manual_seed(self.config.seed + 104_729)
        obs = env.reset(seed=self.config.seed + 104_729)
        episodes: list[dict[str, float]] = []
        for _ in range(max_steps):
            with self.precision.autocast():  # normalised with the statistics as they are
                action, *_ = self.agent.get_action_and_value(self.normalizer.obs(obs),
                                                             generator=gen,
                                                             action_mask=action_mask_of(env))
            obs, _, _, _, info = env.step(action)
            episodes.extend(info.get("episodes", ()))
            if len(episodes) >= num_episodes:
                break
        returns = np.array([ep["return"] for ep in episodes])
        metrics = {"eval/return": float(returns.mean()) if len(returns) else float("nan"),
                   "eval/return_std": float(returns.std()) if len(returns) else float("nan"),
                   "eval/episodes": float(len(episodes))}
        for key in (episodes[0] if episodes else {}):
            if key != "return":
                metrics[f"eval/{key}"] = float(np.mean([ep[key] for ep in episodes]))
        return metrics

    # -------------------------------------------------------------- snapshot
    def state_dict(self, live: bool = False) -> dict[str, Any]:
        """Everything needed to resume exactly: tensors plus plain Python values.

        The result shares no storage with the live trainer, so it stays valid while
        training continues. With ``live=True`` the model and optimizer tensors are the
        live ones (no copies): for a consumer that copies what it needs, such as
        ``vrl.Snapshotter``, which copies only the tensors that changed."""
        model = self.agent.state_dict()
        algo = self.algo.state_dict()
        if not live:
            model = {k: v.detach().clone() for k, v in model.items()}
            # deep copy: Adam updates its moments in place, and a hook may serialise
            # this snapshot in the background while training goes on
            algo = copy.deepcopy(algo)
        return {
            "version": STATE_VERSION,
            "config": config_to_dict(self.config),
            "iteration": self.iteration,
            "global_step": self.global_step,
            "num_iterations": self.num_iterations,
            "model": model,
            "algo": algo,
            "rng": {"action": self.action_generator.get_state(),
                    "update": self.update_generator.get_state(),
                    "global": rng_state(tensors=True)},
            "env": state_dict_of(self.env),
            "next_obs": self.next_obs.detach().clone(),
            "episode_returns": list(self.episode_returns),
            "frozen_layers": sorted(self._frozen),
            # running statistics of norm_obs/norm_reward (an empty dict: both off)
            "normalizer": self.normalizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], restore_env: bool = True) -> None:
        """Restore a ``state_dict()``. ``restore_env=False`` (the env's settings changed,
        e.g. ``num_envs``) starts fresh episodes instead of restoring the env's state."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported trainer state version {state.get('version')!r}")
        self.iteration = int(state["iteration"])
        self.global_step = int(state["global_step"])
        self.num_iterations = int(state["num_iterations"])
        self.agent.load_state_dict(state["model"])
        self.unfreeze_layers()
        self.freeze_layers(state["frozen_layers"])
        self.algo.load_state_dict(state["algo"])
        for group in self.optimizer.param_groups:
            # the config may have changed on resume (`--from REV --set ...`): its values win
            # over those saved with the optimizer (annealing sets lr at every update)
            group["eps"] = self.config.adam_eps
            if not self.config.anneal_lr:
                group["lr"] = self.config.learning_rate
        self.action_generator.set_state(state["rng"]["action"].cpu())
        self.update_generator.set_state(state["rng"]["update"].cpu())
        set_rng_state(state["rng"]["global"])
        restored = (restore_env and state["env"] is not None
                    and hasattr(self.env, "load_state_dict"))
        # absent (a snapshot from before normalisation, or with it off): fresh statistics
        self.normalizer.load_state_dict(state.get("normalizer"), restore_returns=restored)
        if restored:
            self.env.load_state_dict(state["env"])
            self.next_obs = state["next_obs"].to(self.device).clone()
            if "obs" not in (state.get("normalizer") or {}):
                self.normalizer.observe(self.next_obs, alive_of(self.env))  # fresh statistics
        else:
            # not snapshottable: start fresh episodes, seeded by the iteration
            self.next_obs = self.env.reset(seed=self.config.seed + 7919 * self.dist.rank
                                           + 1_000_003 * self.iteration)
            self.normalizer.observe(self.next_obs, alive_of(self.env))
        self.episode_returns = deque(state["episode_returns"],
                                     maxlen=max(100, self.return_window))
