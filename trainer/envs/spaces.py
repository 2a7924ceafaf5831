"""Space handling shared by the Gymnasium and PettingZoo adapters.

The trainer's policy is one categorical MLP over flat float observations, so every
agent's observation space is flattened (``gymnasium.spaces.flatten_space``: Box,
Discrete and MultiDiscrete one-hot, MultiBinary, and Tuple/Dict of these, nested) and
every agent needs a Discrete action space with the same number of actions. An
``"action_mask"`` entry of a Dict observation (PettingZoo's convention) is not part of
the observation: it is the set of legal actions, and the policy's logits are masked
with it. Agents with different flat observation sizes are zero-padded to the largest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from vrl.errors import VrlError

SUPPORTED_OBS = ("Box, Discrete, MultiBinary, MultiDiscrete, and Tuple/Dict of these "
                 "(flattened; a Dict's 'action_mask' entry masks the actions)")
SUPPORTED_ACTIONS = "Discrete (one per agent: a Tuple of Discrete with equal sizes)"


class EnvSpecError(VrlError, ValueError):
    """An environment the trainer cannot use: bad spec, unsupported space, bad step."""


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


def discrete_actions(action_spaces: Sequence[Any], names: Sequence[str], who: str
                     ) -> tuple[int, list[int]]:
    """``(num_actions, start offsets)`` of per-agent Discrete action spaces, or a
    one-line error naming the space that does not fit."""
    from gymnasium import spaces

    for space, name in zip(action_spaces, names, strict=True):
        if not isinstance(space, spaces.Discrete):
            kind = ("continuous (Box) actions are" if isinstance(space, spaces.Box)
                    else f"{type(space).__name__} actions are")
            raise EnvSpecError(f"{who}: {name} has action space {space}: {kind} not "
                               f"supported (the policy is categorical); "
                               f"supported: {SUPPORTED_ACTIONS}")
    sizes = [int(space.n) for space in action_spaces]
    if len(set(sizes)) > 1:
        listed = ", ".join(f"{n}: {s}" for n, s in zip(names, action_spaces, strict=True))
        raise EnvSpecError(f"{who}: agents have different action spaces ({listed}); one "
                           "shared policy needs the same number of actions for every agent")
    return sizes[0], [int(space.start) for space in action_spaces]



def import_error_hint(module: str, exc: ImportError) -> str:
    """Why ``module`` did not import, and what to do, in one line."""
    missing = getattr(exc, "name", None) or ""
    if missing == "pettingzoo" or missing == "gymnasium":
        return f"cannot import {module!r}: {missing} is not installed (pip install 'vrl[gym]' " \
               "or 'vrl[pettingzoo]')"
    if missing and not (module == missing or module.startswith(missing + ".")):
        return f"cannot import {module!r}: it needs {missing!r}, which is not installed"
    return (f"cannot import module {module!r} ({exc}); it must be importable from the "
            "current directory or PYTHONPATH")
