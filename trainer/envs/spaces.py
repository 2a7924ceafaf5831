"""Space handling shared by the Gymnasium and PettingZoo adapters.

The trainer's policy is one MLP over flat float observations, shared by all agents, so
every agent's observation space is flattened (``gymnasium.spaces.flatten_space``: Box,
Discrete and MultiDiscrete one-hot, MultiBinary, and Tuple/Dict of these, nested).
Actions are either discrete (every agent has a Discrete space with the same number of
actions: a categorical policy) or continuous (every agent has a 1-D float Box of the
same shape ``(k,)``: a diagonal Gaussian policy whose samples the env adapters clip to
each agent's bounds; infinite bounds do not clip). Mixed Discrete/Box agents, Box
actions of another rank, and MultiDiscrete/MultiBinary/Tuple/Dict actions are refused.
An ``"action_mask"`` entry of a Dict observation (PettingZoo's convention) is not part
of the observation: it is the set of legal actions, and the policy's logits are masked
with it (discrete actions; with Box actions masks are ignored). Agents with different
flat observation sizes are zero-padded to the largest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainer.env_specs import EnvSpecError

SUPPORTED_OBS = ("Box, Discrete, MultiBinary, MultiDiscrete, and Tuple/Dict of these "
                 "(flattened; a Dict's 'action_mask' entry masks the actions)")
SUPPORTED_ACTIONS = ("Discrete or a 1-D float Box (continuous); for several agents one "
                     "per agent, all Discrete of one size or all Box of one shape")


class ObsFlattener:
    """Turns one agent's observation into a flat float32 vector (and its action mask)."""

    def __init__(self, space: Any, who: str) -> None:
        from gymnasium import spaces

        self.space = space
        self.mask_key = None
        if isinstance(space, spaces.Dict) and "action_mask" in space.spaces:
            self.mask_key = "action_mask"
            rest = {k: v for k, v in space.spaces.items() if k != "action_mask"}
            if not rest:
                raise EnvSpecError(f"{who}: the observation space {space} holds only an "
                                   "action_mask; there is nothing to observe")
            self.space = spaces.Dict(rest)
        try:
            flat = spaces.flatten_space(self.space)
        except NotImplementedError:
            flat = None
        if not isinstance(flat, spaces.Box) or len(flat.shape) != 1:
            raise EnvSpecError(f"{who}: unsupported observation space {space}; "
                               f"supported: {SUPPORTED_OBS}")
        self.dim = int(flat.shape[0])
        # a plain Box needs no per-step space walk (the common, hot case)
        self._box = isinstance(self.space, spaces.Box)

    def __call__(self, obs: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """``(flat observation, action mask or None)``."""
        mask = None
        if self.mask_key is not None:
            mask = np.asarray(obs[self.mask_key]).astype(bool).reshape(-1)
            obs = {k: v for k, v in obs.items() if k != self.mask_key}
        if self._box:
            return np.asarray(obs, dtype=np.float32).reshape(-1), mask
        from gymnasium import spaces

        return np.asarray(spaces.flatten(self.space, obs), dtype=np.float32), mask


@dataclass
class ActionSpec:
    """What the shared policy outputs for a set of per-agent action spaces."""

    continuous: bool
    size: int
    """number of discrete actions, or the dimension k of a continuous action"""
    starts: np.ndarray | None = None
    """discrete: each agent's first action (Discrete ``start``), shape ``(agents,)``"""
    low: np.ndarray | None = None
    """continuous: each agent's lower bounds, shape ``(agents, k)`` (-inf: unbounded)"""
    high: np.ndarray | None = None
    dtype: Any = None
    """continuous: the Box's dtype, the one the env receives"""

    def env_actions(self, actions: Any, copies: int, agents: int) -> np.ndarray:
        """The policy's actions (a tensor, one row per copy and agent) as the envs
        receive them: discrete ones ``(copies, agents)`` shifted by each agent's
        Discrete ``start``; continuous ones ``(copies, agents, k)`` clipped to each
        agent's bounds in the Box's dtype (the policy trains on the raw sample)."""
        if not self.continuous:
            return actions.view(copies, agents).cpu().numpy() + self.starts
        raw = actions.view(copies, agents, -1).cpu().numpy()
        return np.clip(raw, self.low, self.high).astype(self.dtype, copy=False)


def action_spec(action_spaces: Sequence[Any], names: Sequence[str], who: str) -> ActionSpec:
    """The :class:`ActionSpec` of per-agent action spaces, or a one-line error naming
    the agent and the space that does not fit."""
    from gymnasium import spaces

    for space, name in zip(action_spaces, names, strict=True):
        if isinstance(space, spaces.Discrete):
            continue
        if isinstance(space, spaces.Box):
            if len(space.shape) != 1:
                raise EnvSpecError(f"{who}: {name} has action space {space}: a Box action "
                                   f"must be one vector (shape (k,)), not shape {space.shape}; "
                                   f"supported: {SUPPORTED_ACTIONS}")
            if not np.issubdtype(space.dtype, np.floating):
                raise EnvSpecError(f"{who}: {name} has action space {space}: an integer Box "
                                   f"is not supported (the Gaussian policy outputs floats); "
                                   f"supported: {SUPPORTED_ACTIONS}")
            continue
        raise EnvSpecError(f"{who}: {name} has action space {space}: "
                           f"{type(space).__name__} actions are not supported; "
                           f"supported: {SUPPORTED_ACTIONS}")
    listed = ", ".join(f"{n}: {s}" for n, s in zip(names, action_spaces, strict=True))
    kinds = {isinstance(space, spaces.Box) for space in action_spaces}
    if len(kinds) > 1:
        raise EnvSpecError(f"{who}: agents mix discrete and continuous actions ({listed}); "
                           "one shared policy needs all Discrete or all Box action spaces")
    if kinds == {True}:
        shapes = {space.shape for space in action_spaces}
        if len(shapes) > 1:
            raise EnvSpecError(f"{who}: agents have different action spaces ({listed}); one "
                               "shared policy needs the same Box shape for every agent")
        dtype = np.result_type(*(space.dtype for space in action_spaces))
        return ActionSpec(True, int(action_spaces[0].shape[0]),
                          low=np.stack([space.low for space in action_spaces]).astype(dtype),
                          high=np.stack([space.high for space in action_spaces]).astype(dtype),
                          dtype=dtype)
    sizes = [int(space.n) for space in action_spaces]
    if len(set(sizes)) > 1:
        raise EnvSpecError(f"{who}: agents have different action spaces ({listed}); one "
                           "shared policy needs the same number of actions for every agent")
    return ActionSpec(False, sizes[0],
                      starts=np.asarray([int(space.start) for space in action_spaces],
                                        dtype=np.int64))
