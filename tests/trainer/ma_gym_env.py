"""A tiny multi-agent Gymnasium env with the layout of multi-robot warehouse envs.

Importing this module registers ``MALine-v0`` (time limit 8 steps). Agents walk right
along a line; each gets reward 1 when it reaches the end. Spaces are ``Tuple``s with one
entry per agent; ``step`` returns a list of per-agent rewards and one shared
``terminated`` (all arrived) unless ``dones="per_agent"``.

Actions: 0 stay, 1 right, 2 left, 3 "jump". With ``mask="obs"`` (a Dict observation with
an ``action_mask``, PettingZoo's convention) or ``mask="info"`` (``info["action_mask"]``)
jumping is never legal and neither is stepping left at the start: taking an illegal
action raises, as real masked envs do.
"""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class MALineEnv(gym.Env):
    def __init__(self, num_agents=2, length=5, obs="box", mask="none", dones="shared",
                 reward="list", speeds=None):
        self.n, self.length = num_agents, length
        self.obs_kind, self.mask, self.dones, self.reward_kind = obs, mask, dones, reward
        self.speeds = list(speeds or [1] * num_agents)
        if obs == "box":
            agent = spaces.Box(0, 1, (length,), np.float32)
        elif obs == "growing":  # agent j sees j extra ones: observation sizes differ
            agent = None
            per_agent = [spaces.Box(0, 1, (length + j,), np.float32) for j in range(num_agents)]
        elif obs == "nested":  # Discrete position + a nested Tuple of MultiBinary/MultiDiscrete
            agent = spaces.Dict({"pos": spaces.Discrete(length),
                                 "extra": spaces.Tuple((spaces.MultiBinary(2),
                                                        spaces.MultiDiscrete([2, 3])))})
        else:
            raise ValueError(obs)
        if mask == "obs":
            agent = spaces.Dict({"observation": agent, "action_mask": spaces.MultiBinary(4)})
        self.observation_space = spaces.Tuple(per_agent if agent is None else [agent] * num_agents)
        self.action_space = spaces.Tuple([spaces.Discrete(4)] * num_agents)

    def legal(self, j):
        m = np.array([1, 1, 1, 1], np.int8)
        if self.mask != "none":
            m[3] = 0
            if self.pos[j] == 0:
                m[2] = 0
        return m

    def _agent_obs(self, j):
        if self.obs_kind in ("box", "growing"):
            o = np.zeros(self.length, np.float32)
            o[self.pos[j]] = 1
            if self.obs_kind == "growing":
                o = np.concatenate([o, np.ones(j, np.float32)])
        else:
            o = {"pos": int(self.pos[j]),
                 "extra": (np.array([1, 0], np.int8), np.array([1, 2], np.int64))}
        if self.mask == "obs":
            return {"observation": o, "action_mask": self.legal(j)}
        return o

    def _obs_info(self):
        info = {"action_mask": np.stack([self.legal(j) for j in range(self.n)])
                } if self.mask == "info" else {}
        return tuple(self._agent_obs(j) for j in range(self.n)), info

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = [0] * self.n
        self.arrived = [False] * self.n
        return self._obs_info()

    def step(self, action):
        assert len(action) == self.n
        rewards = [0.0] * self.n
        for j, a in enumerate(action):
            if not self.legal(j)[a]:
                raise RuntimeError(f"illegal action {a} for agent {j} at {self.pos[j]}")
            if self.arrived[j]:
                continue
            move = {0: 0, 1: self.speeds[j], 2: -1, 3: 0}[int(a)]
            self.pos[j] = int(np.clip(self.pos[j] + move, 0, self.length - 1))
            if self.pos[j] == self.length - 1:
                self.arrived[j] = True
                rewards[j] = 1.0
        obs, info = self._obs_info()
        terminated = all(self.arrived) if self.dones == "shared" else list(self.arrived)
        if self.reward_kind == "tuple":
            rewards = tuple(rewards)
        elif self.reward_kind == "array":
            rewards = np.array(rewards, np.float32)
        elif self.reward_kind == "team":
            rewards = float(sum(rewards))
        elif self.reward_kind == "short":  # a broken env: one reward missing
            rewards = rewards[:-1]
        return obs, rewards, terminated, False, info


class BoxActionEnv(gym.Env):  # a Box action that is not one vector: refused
    observation_space = spaces.Box(0, 1, (3,), np.float32)
    action_space = spaces.Box(-1, 1, (2, 2), np.float32)


class MixedActionsEnv(gym.Env):
    observation_space = spaces.Tuple([spaces.Box(0, 1, (3,), np.float32)] * 2)
    action_space = spaces.Tuple([spaces.Discrete(5), spaces.Discrete(3)])


class SequenceObsEnv(gym.Env):
    observation_space = spaces.Sequence(spaces.Discrete(3))
    action_space = spaces.Discrete(2)


gym.register("MALine-v0", entry_point=MALineEnv, max_episode_steps=8)
gym.register("BoxAction-v0", entry_point=BoxActionEnv)
gym.register("MixedActions-v0", entry_point=MixedActionsEnv)
gym.register("SequenceObs-v0", entry_point=SequenceObsEnv)
