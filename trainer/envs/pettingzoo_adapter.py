"""PettingZoo parallel environments with one policy shared by all agents.

Slots are ``worlds x possible_agents``. A world resets when all its agents are done.
An agent that leaves before its world ends keeps its slot until the reset; meanwhile
the slot reports zero observations, reward 0 and ``terminated`` (one-step dummy
episodes that carry no return). All agents must share observation shape and a
Discrete action space.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


class PettingZooVecEnv:
    def __init__(self, factory: Callable[[], Any], num_envs: int = 4,
                 device: str | torch.device = "cpu") -> None:
        self.worlds = [factory() for _ in range(num_envs)]
        self.device = torch.device(device)
        first = self.worlds[0]
        self.agents = list(first.possible_agents)
        self.num_agents = len(self.agents)
        self.num_worlds = num_envs
        self.num_envs = num_envs * self.num_agents
        obs_space = first.observation_space(self.agents[0])
        act_space = first.action_space(self.agents[0])
        if not hasattr(act_space, "n"):
            raise ValueError(f"only Discrete action spaces are supported, got {act_space}")
        self.obs_dim = int(np.prod(obs_space.shape))
        self.num_actions = int(act_space.n)
        self._obs = np.zeros((num_envs, self.num_agents, self.obs_dim), dtype=np.float32)
        self._returns = np.zeros((num_envs, self.num_agents))
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def _fill(self, w: int, obs: dict[str, Any], out: np.ndarray) -> None:
        out[w] = 0.0
        for j, agent in enumerate(self.agents):
            if agent in obs:
                out[w, j] = np.asarray(obs[agent], dtype=np.float32).reshape(-1)

    def _reset_world(self, w: int, seed: int | None) -> None:
        obs, _ = self.worlds[w].reset(seed=seed)
        self._fill(w, obs, self._obs)
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
        acts = actions.view(self.num_worlds, self.num_agents).cpu().numpy()
        shape = (self.num_worlds, self.num_agents)
        reward = np.zeros(shape, dtype=np.float32)
        terminated = np.zeros(shape, dtype=bool)
        truncated = np.zeros(shape, dtype=bool)
        final = np.empty_like(self._obs)
        episodes: list[dict[str, float]] = []
        for w, world in enumerate(self.worlds):
            alive = set(world.agents)
            obs, rew, term, trunc, _ = world.step(
                {a: int(acts[w, j]) for j, a in enumerate(self.agents) if a in alive})
            for j, agent in enumerate(self.agents):
                if agent in alive:
                    reward[w, j] = rew.get(agent, 0.0)
                    terminated[w, j] = bool(term.get(agent, False))
                    truncated[w, j] = bool(trunc.get(agent, False)) and not terminated[w, j]
                else:
                    terminated[w, j] = True  # dummy step of an agent that already left
            self._returns[w] += reward[w]
            self._lengths[w] += 1
            self._fill(w, obs, self._obs)
            final[w] = self._obs[w]
            if not world.agents:
                episodes.append({"return": float(self._returns[w].mean()),
                                 "length": float(self._lengths[w])})
                self._reset_world(w, None)
        info: dict[str, Any] = {}
        if terminated.any() or truncated.any():
            info["final_obs"] = self._tensor(final)
        if episodes:
            info["episodes"] = episodes
        return (self._tensor(self._obs.copy()), self._tensor(reward),
                self._tensor(terminated, torch.bool), self._tensor(truncated, torch.bool), info)

    def close(self) -> None:
        for world in self.worlds:
            world.close()
