"""PettingZoo parallel environments with one policy shared by all agents.

Rows are ``worlds x possible_agents``. A world resets when no agent is left in it.
An agent that finished (terminated, truncated, or left) before its world ends keeps
its row until the reset but is not *alive*: the row is not trained on and not counted
as a step (``alive`` is False; it reports a zero observation, reward 0 and
``terminated``, so nothing bootstraps across it). Agents that join mid-episode are
alive from their first observation.

Every agent's spaces are checked: observations are flattened (Dict and nested spaces
too; smaller ones zero-padded to the largest) and actions must be Discrete with the
same size for all agents, or 1-D float Boxes of the same shape (continuous actions,
clipped to each agent's bounds before the env sees them). Action masks (discrete
actions only) come from an ``"action_mask"`` entry of a Dict observation or
``infos[agent]["action_mask"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from trainer.env_specs import EnvSpecError
from trainer.envs.spaces import ObsFlattener, action_spec


class PettingZooVecEnv:
    def __init__(self, factory: Callable[[], Any], num_envs: int = 4,
                 device: str | torch.device = "cpu", name: str = "pettingzoo env") -> None:
        self.worlds = [factory() for _ in range(num_envs)]
        self.device = torch.device(device)
        first = self.worlds[0]
        who = name
        try:
            from pettingzoo import AECEnv
        except ImportError:
            AECEnv = ()  # noqa: N806 - duck-typed envs work without pettingzoo itself
        if isinstance(first, AECEnv) or not hasattr(first, "possible_agents"):
            raise EnvSpecError(f"{who}: {type(first).__name__} is not a PettingZoo "
                               "ParallelEnv (an AEC env? use the module's parallel_env)")
        self.agents = list(first.possible_agents)
        if not self.agents:
            raise EnvSpecError(f"{who}: possible_agents is empty")
        names = [f"agent {a!r}" for a in self.agents]
        self._actions = action_spec([first.action_space(a) for a in self.agents], names, who)
        self.num_actions = self._actions.size
        self.continuous_actions = self._actions.continuous
        self._flatten = [ObsFlattener(first.observation_space(a), f"{who}: {n}")
                         for a, n in zip(self.agents, names, strict=True)]
        self.num_agents = len(self.agents)
        self.num_worlds = num_envs
        self.num_envs = num_envs * self.num_agents
        self.obs_dim = max(f.dim for f in self._flatten)
        self._who = who
        shape = (num_envs, self.num_agents)
        self._obs = np.zeros((*shape, self.obs_dim), dtype=np.float32)
        self._mask = np.ones((*shape, self.num_actions), dtype=bool)
        # masks select among discrete actions; a Box action has nothing to mask
        self._masks_apply = not self.continuous_actions
        self._has_mask = self._masks_apply and any(f.mask_key for f in self._flatten)
        self._alive = np.zeros(shape, dtype=bool)
        self._returns = np.zeros(shape)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    @property
    def alive(self) -> torch.Tensor:
        """Rows whose agent acts on the current observation."""
        return torch.as_tensor(self._alive.reshape(-1), device=self.device)

    @property
    def action_mask(self) -> torch.Tensor | None:
        """Legal actions for the current observations; None when the env gives none."""
        if not self._has_mask:
            return None
        return torch.as_tensor(self._mask.reshape(self.num_envs, -1), device=self.device)

    def _fill(self, w: int, obs: dict[str, Any], infos: Any) -> None:
        """Observations, masks and alive flags of world ``w`` after a reset or step."""
        self._obs[w] = 0.0
        self._mask[w] = True
        infos = infos if isinstance(infos, dict) else {}
        live = set(self.worlds[w].agents)
        for j, agent in enumerate(self.agents):
            self._alive[w, j] = agent in live
            mask = None
            if agent in obs:
                flat, mask = self._flatten[j](obs[agent])
                self._obs[w, j, :flat.size] = flat
            info = infos.get(agent)
            if not self._masks_apply:
                continue
            if isinstance(info, dict) and info.get("action_mask") is not None:
                self._has_mask = True
                mask = np.asarray(info["action_mask"]).astype(bool).reshape(-1)
            if mask is not None:
                if mask.size != self.num_actions:
                    raise EnvSpecError(f"{self._who}: agent {agent!r} has an action mask of "
                                       f"{mask.size} entries for {self.num_actions} actions")
                # no legal action at all: let the policy choose freely rather than fail
                self._mask[w, j] = mask if mask.any() else True

    def _reset_world(self, w: int, seed: int | None) -> None:
        obs, infos = self.worlds[w].reset(seed=seed)
        self._fill(w, obs, infos)
        self._returns[w] = 0.0
        self._lengths[w] = 0

    def _tensor(self, array: np.ndarray, dtype=torch.float32) -> torch.Tensor:
        return torch.as_tensor(array.reshape(self.num_envs, *array.shape[2:]), dtype=dtype,
                               device=self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        for w in range(self.num_worlds):
            self._reset_world(w, None if seed is None else seed + w)
        return self._tensor(self._obs.copy())

    def step(self, actions: torch.Tensor):
        acts = self._actions.env_actions(actions, self.num_worlds, self.num_agents)
        shape = (self.num_worlds, self.num_agents)
        reward = np.zeros(shape, dtype=np.float32)
        terminated = np.zeros(shape, dtype=bool)
        truncated = np.zeros(shape, dtype=bool)
        final = np.empty_like(self._obs)
        episodes: list[dict[str, float]] = []
        for w, world in enumerate(self.worlds):
            acting = self._alive[w].copy()
            obs, rew, term, trunc, infos = world.step(
                {a: acts[w, j] if self.continuous_actions else int(acts[w, j])
                 for j, a in enumerate(self.agents) if acting[j]})
            remaining = set(world.agents)
            for j, agent in enumerate(self.agents):
                if acting[j]:
                    reward[w, j] = rew.get(agent, 0.0)
                    terminated[w, j] = bool(term.get(agent, False))
                    truncated[w, j] = bool(trunc.get(agent, False)) and not terminated[w, j]
                    if agent not in remaining and not truncated[w, j]:
                        terminated[w, j] = True  # left without a flag: the episode ended
                else:
                    terminated[w, j] = True  # a finished agent's row: nothing to bootstrap
            self._returns[w] += reward[w]
            self._lengths[w] += 1
            self._fill(w, obs, infos)
            final[w] = self._obs[w]
            self._obs[w][~self._alive[w]] = 0.0  # finished: only final_obs keeps its obs
            if not world.agents:
                episodes.append({"return": float(self._returns[w].mean()),
                                 "team_return": float(self._returns[w].sum()),
                                 "length": float(self._lengths[w])})
                self._reset_world(w, None)
        info: dict[str, Any] = {}
        if (terminated | truncated).any():
            info["final_obs"] = self._tensor(final)
        if episodes:
            info["episodes"] = episodes
        return (self._tensor(self._obs.copy()), self._tensor(reward),
                self._tensor(terminated, torch.bool), self._tensor(truncated, torch.bool), info)

    def close(self) -> None:
        for world in self.worlds:
            world.close()
