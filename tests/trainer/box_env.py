"""Tiny Gymnasium envs with continuous (Box) actions for the trainer's tests.

Importing this module registers:

* ``TargetBox-v0``: one-step episodes; the observation is 3 floats drawn uniformly from
  [-1, 1], the reward ``-sum((a - target)^2)`` with ``target = obs[:dim]``.
  Action bounds ``low``/``high`` (default [-2, 2] per dimension; infinite ones allowed).
  ``received`` records every action the env was given (to check clipping).
* ``MABox-v0``: two agents (a ``Tuple`` of Box spaces), each with a one-step target
  task as above on its own observation; per-agent rewards.
* ``Box2D-v0``, ``MultiDiscreteAction-v0``, ``MultiBinaryAction-v0``, ``MixedBox-v0``
  (a Discrete and a Box agent), ``BoxShapes-v0`` (Box agents of different shapes),
  ``IntBox-v0``: action spaces the adapter refuses.
"""

import gymnasium as gym
import numpy as np
from gymnasium import spaces

OBS = spaces.Box(-1, 1, (3,), np.float32)


class TargetBoxEnv(gym.Env):
    observation_space = OBS

    def __init__(self, dim=1, low=None, high=None):
        self.dim = dim
        low = np.full(dim, -2.0) if low is None else np.asarray(low, dtype=np.float64)
        high = np.full(dim, 2.0) if high is None else np.asarray(high, dtype=np.float64)
        self.action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32),
                                       (dim,), np.float32)
        self.received = []

    def _obs(self):
        self.obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return self.obs

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def step(self, action):
        action = np.asarray(action)
        assert action.shape == (self.dim,) and action.dtype == np.float32
        self.received.append(action.copy())
        reward = -float(((action - self.obs[:self.dim]) ** 2).sum())
        return self._obs(), reward, True, False, {}


class MABoxEnv(gym.Env):
    observation_space = spaces.Tuple([OBS, OBS])
    action_space = spaces.Tuple([spaces.Box(-1, 1, (2,), np.float32),
                                 spaces.Box(-2, 2, (2,), np.float32)])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.obs = tuple(self.np_random.uniform(-1, 1, 3).astype(np.float32) for _ in range(2))
        self.received = getattr(self, "received", [])
        return self.obs, {}

    def step(self, action):
        assert len(action) == 2
        for a, space in zip(action, self.action_space.spaces, strict=True):
            assert space.contains(np.asarray(a)), (a, space)
        self.received.append(tuple(np.asarray(a).copy() for a in action))
        rewards = [-float(((np.asarray(a) - 0.5 * o[:2]) ** 2).sum())
                   for a, o in zip(action, self.obs, strict=True)]
        obs, _ = self.reset()
        return obs, rewards, True, False, {}


def _refused(action_space, obs_space=OBS):
    return type("Refused", (gym.Env,), {"observation_space": obs_space,
                                         "action_space": action_space})


gym.register("TargetBox-v0", entry_point=TargetBoxEnv)
gym.register("MABox-v0", entry_point=MABoxEnv)
gym.register("Box2D-v0", entry_point=_refused(spaces.Box(-1, 1, (2, 2), np.float32)))
gym.register("MultiDiscreteAction-v0", entry_point=_refused(spaces.MultiDiscrete([2, 3])))
gym.register("MultiBinaryAction-v0", entry_point=_refused(spaces.MultiBinary(3)))
gym.register("IntBox-v0", entry_point=_refused(spaces.Box(-1, 1, (2,), np.int64)))
gym.register("MixedBox-v0", entry_point=_refused(
    spaces.Tuple([spaces.Discrete(3), spaces.Box(-1, 1, (1,), np.float32)]),
    spaces.Tuple([OBS, OBS])))
gym.register("BoxShapes-v0", entry_point=_refused(
    spaces.Tuple([spaces.Box(-1, 1, (1,), np.float32), spaces.Box(-1, 1, (2,), np.float32)]),
    spaces.Tuple([OBS, OBS])))
