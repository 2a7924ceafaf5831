"""The vectorised-environment interface the trainer consumes.

Every environment the trainer sees is a batch of ``num_envs`` independent decision
makers (for multi-agent envs: environments x agents, one shared policy) with flat
float observations and discrete actions, exchanged as torch tensors on ``device``.

``step`` auto-resets finished slots. Where a slot ended this step, the returned
observation is already the first of the next episode and ``info["final_obs"]`` holds
the last observation of the finished one, so truncated episodes can be bootstrapped
with V(final_obs) while terminated ones are not.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class VecEnv(Protocol):
    num_envs: int
    """batch size: decision makers stepped together"""
    obs_dim: int
    num_actions: int
    device: torch.device

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every slot; returns observations ``(num_envs, obs_dim)`` float32."""

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        """Returns ``obs, reward, terminated, truncated, info``.

        ``reward`` float32 and ``terminated``/``truncated`` bool, each ``(num_envs,)``.
        ``info["final_obs"]`` (when any slot ended) is ``(num_envs, obs_dim)`` and valid
        where ``terminated | truncated``. ``info["episodes"]`` is a list of dicts of
        floats, one per episode that finished this step (at least ``return`` and
        ``length``).
        """

    def close(self) -> None: ...


def state_dict_of(env: Any) -> dict[str, Any] | None:
    """The env's resumable state, or None if it cannot be snapshotted (e.g. Gymnasium)."""
    fn = getattr(env, "state_dict", None)
    return fn() if callable(fn) else None
