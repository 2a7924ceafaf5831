"""A tiny PettingZoo parallel env for adapter tests: agents walk right along a line."""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class LineEnv(ParallelEnv):
    metadata = {"name": "line_v0"}

    def __init__(self, length: int = 5, max_steps: int = 6, speeds=(1, 0)):
        self.length, self.max_steps = length, max_steps
        self.possible_agents = ["fast", "slow"]
        self.speeds = dict(zip(self.possible_agents, speeds, strict=True))

    def observation_space(self, agent):
        return spaces.Box(0, 1, (self.length,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def _obs(self, agent):
        o = np.zeros(self.length, np.float32)
        o[self.pos[agent]] = 1
        return o

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.pos = {a: 0 for a in self.agents}
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rew, term, trunc = {}, {}, {}
        for a, act in actions.items():
            self.pos[a] = min(self.length - 1, self.pos[a] + act * self.speeds[a])
            term[a] = self.pos[a] == self.length - 1
            rew[a] = 1.0 if term[a] else 0.0
            trunc[a] = self.t >= self.max_steps and not term[a]
        obs = {a: self._obs(a) for a in actions}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, {a: {} for a in actions}


def make(**kw):
    return LineEnv(**kw)
