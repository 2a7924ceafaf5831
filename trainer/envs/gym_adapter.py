"""Gymnasium environments (single- and multi-agent) as a :class:`~trainer.envs.base.VecEnv`.

``num_envs`` copies of the env are stepped in a loop (our own vectorisation, so every
Gymnasium from 0.28 to 1.x behaves the same); each copy contributes one row per agent.

* **Single agent**: any observation space :mod:`trainer.envs.spaces` can flatten, a
  Discrete or a 1-D float Box (continuous) action space. Continuous actions are clipped
  to the Box's bounds before the env sees them (the policy trains on the raw sample).
* **Multi-agent** (the layout of multi-robot warehouse envs): the action space is a
  ``Tuple`` with one space per agent (all Discrete of one size, or all Box of one
  shape), and the observation space a ``Tuple`` of the same length. ``step`` returns
  the rewards as a list/tuple/array with one entry per agent (a scalar is a team
  reward, given to every agent) and ``terminated`` / ``truncated`` either shared (one
  bool) or per agent. An agent whose own flag is set while others go on has finished:
  its row is not alive (not trained on, not counted) until the episode ends, which is
  when no agent is left.
* **Action masks** (discrete actions): an ``"action_mask"`` entry of a Dict
  observation (per agent), or ``info["action_mask"]`` (shape ``(num_actions,)``, or
  ``(agents, num_actions)``).

A finished copy is reset in the same step; its last observation goes to
``info["final_obs"]``, so truncated episodes are bootstrapped with V(final_obs) while
terminated ones are not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainer.env_specs import EnvSpecError, gym_error, import_gym, registering
from trainer.envs.spaces import ObsFlattener, action_spec


def make_gym(spec: str, **env_kwargs: Any):
    """``gymnasium.make`` for ``ID`` or ``module:ID`` (module imported first, so it can
    register ID), with one-line errors."""
    gym, env_id = registering(spec)
    try:
        return gym.make(env_id, **env_kwargs)
    except gym.error.Error as exc:
        raise gym_error(gym, spec, exc) from None
    except TypeError as exc:
        raise EnvSpecError(f"gym:{spec}: {exc} (check the env settings, --set env.KEY=...)"
                           ) from None


def _per_agent(value: Any, num_agents: int, dtype: Any, what: str, who: str) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=dtype).reshape(-1)
    except (TypeError, ValueError):
        raise EnvSpecError(f"{who}: step returned {what} {value!r}; expected a number or one "
                           f"per agent") from None
    if array.size != num_agents and array.size != 1:  # one value: shared (broadcasts)
        raise EnvSpecError(f"{who}: step returned {array.size} {what} values for "
                           f"{num_agents} agents; expected one, or one per agent")
    return array


class GymVecEnv:
    """``num_envs`` copies of a Gymnasium env; ``num_envs * num_agents`` rows."""

    def __init__(self, env_id: str, num_envs: int = 4, device: str | torch.device = "cpu",
                 **env_kwargs: Any) -> None:
        gym = import_gym()
        who = f"gym:{env_id}"
        self.env_id = env_id
        self.device = torch.device(device)
        first = make_gym(env_id, **env_kwargs)
        obs_space, act_space = first.observation_space, first.action_space
        self.multi_agent = isinstance(act_space, gym.spaces.Tuple)
        if self.multi_agent:
            n = len(act_space.spaces)
            if not isinstance(obs_space, gym.spaces.Tuple) or len(obs_space.spaces) != n or n == 0:
                first.close()
                raise EnvSpecError(
                    f"{who}: the action space {act_space} is read as one action space per agent, "
                    f"which needs a Tuple observation space with one entry per agent; got "
                    f"{obs_space}")
            names = [f"agent {j}" for j in range(n)]
            agent_obs, agent_act = list(obs_space.spaces), list(act_space.spaces)
        else:
            names, agent_obs, agent_act = ["the env"], [obs_space], [act_space]
        try:
            self._actions = action_spec(agent_act, names, who)
            self._flatten = [ObsFlattener(s, f"{who}: {name}" if self.multi_agent else who)
                             for s, name in zip(agent_obs, names, strict=True)]
        except EnvSpecError:
            first.close()
            raise
        if self.multi_agent and "disable_env_checker" not in env_kwargs:
            # Gymnasium's checker wants one float reward and one bool done; per-agent lists
            # are this layout's contract, so its warnings would only be noise
            first.close()
            env_kwargs = {**env_kwargs, "disable_env_checker": True}
            first = make_gym(env_id, **env_kwargs)
        self.envs = [first] + [make_gym(env_id, **env_kwargs) for _ in range(num_envs - 1)]
        self.num_copies = num_envs
        self.num_agents = len(names)
        self.num_envs = num_envs * self.num_agents
        self.obs_dim = max(f.dim for f in self._flatten)
        self.num_actions = self._actions.size
        self.continuous_actions = self._actions.continuous
        self._who = who
        shape = (num_envs, self.num_agents)
        self._obs = np.zeros((*shape, self.obs_dim), dtype=np.float32)
        self._mask = np.ones((*shape, self.num_actions), dtype=bool)
        # masks select among discrete actions; a Box action has nothing to mask
        self._masks_apply = not self.continuous_actions
        self._has_mask = self._masks_apply and any(f.mask_key for f in self._flatten)
        self._alive = np.ones(shape, dtype=bool)
        self._returns = np.zeros(shape)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    # ------------------------------------------------------------------ masks
    @property
    def alive(self) -> torch.Tensor | None:
        """Rows whose agent acts on the current observation (None: a single-agent env,
        where every row always does)."""
        if not self.multi_agent:
            return None
        return torch.as_tensor(self._alive.reshape(-1), device=self.device)

    @property
    def action_mask(self) -> torch.Tensor | None:
        """Legal actions for the current observations, ``(num_envs, num_actions)`` bool;
        None when the env gives no masks."""
        if not self._has_mask:
            return None
        return torch.as_tensor(self._mask.reshape(self.num_envs, -1), device=self.device)

    # -------------------------------------------------------------- internals
    def _agent_obs(self, obs: Any) -> list[Any]:
        if not self.multi_agent:
            return [obs]
        if len(obs) != self.num_agents:
            raise EnvSpecError(f"{self._who}: got {len(obs)} observations for "
                               f"{self.num_agents} agents")
        return list(obs)

    def _set_obs(self, e: int, obs: Any, info: Any) -> None:
        """Flatten copy ``e``'s observation (and its action masks) into the row buffers;
        the zero padding of smaller observations is never written."""
        if self._has_mask:
            self._mask[e] = True
        for j, (flatten, agent_obs) in enumerate(zip(self._flatten, self._agent_obs(obs),
                                                      strict=True)):
            flat, mask = flatten(agent_obs)
            self._obs[e, j, :flat.size] = flat
            if mask is not None and self._masks_apply:
                self._set_mask(e, j, mask)
        if (self._masks_apply and isinstance(info, dict)
                and info.get("action_mask") is not None):
            self._has_mask = True
            masks = np.asarray(info["action_mask"]).astype(bool)
            if masks.size != self.num_agents * self.num_actions:
                raise EnvSpecError(f"{self._who}: info['action_mask'] has shape {masks.shape}; "
                                   f"expected ({self.num_agents}, {self.num_actions}) or "
                                   f"({self.num_actions},) for one agent")
            for j, mask in enumerate(masks.reshape(self.num_agents, -1)):
                self._set_mask(e, j, mask)

    def _set_mask(self, e: int, j: int, mask: np.ndarray) -> None:
        if mask.size != self.num_actions:
            raise EnvSpecError(f"{self._who}: an action mask of {mask.size} entries for "
                               f"{self.num_actions} actions")
        # no legal action at all: let the policy choose freely rather than fail
        self._mask[e, j] = mask if mask.any() else True

    def _tensor(self, array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(array.reshape(self.num_envs, *array.shape[2:]), dtype=dtype,
                               device=self.device)

    # -------------------------------------------------------------------- api
    def reset(self, seed: int | None = None) -> torch.Tensor:
        for e, env in enumerate(self.envs):
            obs, info = env.reset(seed=None if seed is None else seed + e)
            self._set_obs(e, obs, info)
        self._alive[:] = True
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._tensor(self._obs.copy())

    def step(self, actions: torch.Tensor):
        acts = self._actions.env_actions(actions, self.num_copies, self.num_agents)
        shape = (self.num_copies, self.num_agents)
        reward = np.zeros(shape, dtype=np.float32)
        terminated = np.ones(shape, dtype=bool)  # rows of finished agents stay terminated
        truncated = np.zeros(shape, dtype=bool)
        final: np.ndarray | None = None
        episodes: list[dict[str, float]] = []
        A = self.num_agents
        for e, env in enumerate(self.envs):
            if self.continuous_actions:
                action = tuple(acts[e]) if self.multi_agent else acts[e, 0]
            else:
                action = (tuple(int(a) for a in acts[e]) if self.multi_agent
                          else int(acts[e, 0]))
            obs, rew, term, trunc, info = env.step(action)
            self._lengths[e] += 1
            if self.multi_agent:
                rew = _per_agent(rew, A, np.float64, "reward", self._who)
                term = _per_agent(term, A, bool, "terminated", self._who)
                trunc = _per_agent(trunc, A, bool, "truncated", self._who)
                live = self._alive[e]
                reward[e] = np.where(live, rew, 0.0)
                terminated[e] = ~live | term
                truncated[e] = live & trunc & ~term
                ended = live & (term | trunc)
                self._alive[e] = live & ~ended
                any_ended, over = bool(ended.any()), not self._alive[e].any()
            else:  # the hot path of classic single-agent envs: plain scalars
                if not isinstance(rew, (int, float, np.number)):
                    rew = _per_agent(rew, 1, np.float64, "reward", self._who)[0]
                reward[e, 0] = rew
                terminated[e, 0] = term = bool(term)
                truncated[e, 0] = bool(trunc) and not term
                over = any_ended = term or bool(trunc)
            self._returns[e] += reward[e]
            self._set_obs(e, obs, info)
            if any_ended:
                if final is None:
                    final = np.zeros_like(self._obs)
                final[e] = self._obs[e]
            if over:
                episode = {"return": float(self._returns[e].mean()),
                           "length": float(self._lengths[e])}
                if self.multi_agent:
                    episode["team_return"] = float(self._returns[e].sum())
                episodes.append(episode)
                obs, info = env.reset()
                self._set_obs(e, obs, info)
                self._alive[e] = True
                self._returns[e] = 0.0
                self._lengths[e] = 0
        out: dict[str, Any] = {}
        if final is not None:
            out["final_obs"] = self._tensor(final)
        if episodes:
            out["episodes"] = episodes
        return (self._tensor(self._obs.copy()), self._tensor(reward),
                self._tensor(terminated, torch.bool), self._tensor(truncated, torch.bool), out)

    def close(self) -> None:
        for env in self.envs:
            env.close()
