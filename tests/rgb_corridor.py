"""A tiny Gymnasium env with an ``rgb_array`` renderer that needs no pygame, for
``vrl eval --gif`` tests: walk right along a corridor to its end (``gym:rgb_corridor:
VrlCorridor-v0``; importing the module registers the id)."""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(self, render_mode=None, length: int = 4):
        self.length, self.render_mode = length, render_mode
        self.observation_space = gym.spaces.Box(0.0, 1.0, (length,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: stay, 1: right
        self.pos = 0

    def _obs(self):
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = min(self.length - 1, self.pos + int(action))
        done = self.pos == self.length - 1
        return self._obs(), (1.0 if done else -0.1), done, False, {}

    def render(self):
        image = np.full((8, 8 * self.length, 3), 255, dtype=np.uint8)
        image[:, 8 * self.pos:8 * self.pos + 8] = (200, 40, 40)
        return image


if "VrlCorridor-v0" not in gym.registry:
    gym.register("VrlCorridor-v0", entry_point=Corridor, max_episode_steps=12)
