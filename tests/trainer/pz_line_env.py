"""A tiny PettingZoo parallel env for adapter tests: agents walk right along a line.

``mask="obs"`` gives Dict observations ``{"observation", "action_mask"}`` (PettingZoo's
convention), ``mask="info"`` puts the mask in ``infos[agent]``; either adds action 2,
"jump", which is never legal: the env raises if it is taken. ``action_sizes`` and
``continuous=True`` (a Box agent next to a Discrete one) make spaces the adapter must
refuse; ``continuous="all"`` gives every agent a Box action in [-1, 1] (``speed`` steps
right where it is positive; the env raises on an action out of bounds).
"""

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class LineEnv(ParallelEnv):
    metadata = {"name": "line_v0"}
    render_mode = None

    def __init__(self, length: int = 5, max_steps: int = 6, speeds=(1, 0), mask=None,
                 action_sizes=None, continuous=False):
        self.length, self.max_steps, self.mask = length, max_steps, mask
        self.possible_agents = ["fast", "slow"]
        self.speeds = dict(zip(self.possible_agents, speeds, strict=True))
        n = 3 if mask else 2
        self.sizes = dict(zip(self.possible_agents, action_sizes or (n, n), strict=True))
        self.continuous = continuous

    def observation_space(self, agent):
        box = spaces.Box(0, 1, (self.length,), np.float32)
        if self.mask == "obs":
            return spaces.Dict({"observation": box, "action_mask": spaces.MultiBinary(3)})
        return box

    def action_space(self, agent):
        if self.continuous == "all" or (self.continuous and agent == "slow"):
            return spaces.Box(-1, 1, (1,), np.float32)
        return spaces.Discrete(self.sizes[agent])

    def _obs(self, agent):
        o = np.zeros(self.length, np.float32)
        o[self.pos[agent]] = 1
        if self.mask == "obs":
            return {"observation": o, "action_mask": np.array([1, 1, 0], np.int8)}
        return o

    def _infos(self, agents):
        if self.mask == "info":
            return {a: {"action_mask": np.array([1, 1, 0], np.int8)} for a in agents}
        return {a: {} for a in agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.pos = {a: 0 for a in self.agents}
        self.t = 0
        return {a: self._obs(a) for a in self.agents}, self._infos(self.agents)

    def step(self, actions):
        self.t += 1
        rew, term, trunc = {}, {}, {}
        for a, act in actions.items():
            if self.continuous == "all":
                if not self.action_space(a).contains(act):
                    raise RuntimeError(f"action {act!r} of {a} is out of bounds")
                act = int(act[0] > 0)
            if act == 2:
                raise RuntimeError(f"illegal action {act} for {a}")
            self.pos[a] = min(self.length - 1, self.pos[a] + act * self.speeds[a])
            term[a] = self.pos[a] == self.length - 1
            rew[a] = 1.0 if term[a] else 0.0
            trunc[a] = self.t >= self.max_steps and not term[a]
        obs = {a: self._obs(a) for a in actions}
        self.agents = [a for a in self.agents if not (term[a] or trunc[a])]
        return obs, rew, term, trunc, self._infos(actions)


def make(**kw):
    return LineEnv(**kw)


def make_aec(**kw):
    """The same env behind PettingZoo's AEC interface (which the adapter refuses)."""
    from pettingzoo.utils.conversions import parallel_to_aec

    return parallel_to_aec(LineEnv(**kw))
