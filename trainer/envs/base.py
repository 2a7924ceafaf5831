"""The vectorised-environment interface the trainer consumes.

Every environment the trainer sees is a batch of ``num_envs`` independent decision
makers (for multi-agent envs: environments x agents, one shared policy) with flat
float observations and discrete or continuous actions, exchanged as torch tensors on
``device``.

``step`` auto-resets finished slots. Where a slot ended this step, the returned
observation is already the first of the next episode and ``info["final_obs"]`` holds
the last observation of the finished one, so truncated episodes can be bootstrapped
with V(final_obs) while terminated ones are not.

Actions are discrete (``(num_envs,)`` long, ``num_actions`` choices) unless the env has
``continuous_actions = True``: then they are ``(num_envs, num_actions)`` float32 vectors,
the raw samples of the Gaussian policy; the env clips them to its bounds itself.

Two optional attributes describe the observation last returned by ``reset``/``step``
(an env without them has every row alive and every action legal):

* ``alive``: ``(num_envs,)`` bool, the rows whose agent acts on it. A row that is not
  alive (an agent that finished before the others) is not trained on and not counted
  as a step.
* ``action_mask``: ``(num_envs, num_actions)`` bool, the legal actions; the policy's
  logits are masked with it, in the rollout and in the update (discrete actions only).
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


def continuous_of(env: Any) -> bool:
    """Whether the env takes continuous (vector) actions rather than discrete ones."""
    return bool(getattr(env, "continuous_actions", False))


def alive_of(env: Any) -> torch.Tensor | None:
    """The env's per-row alive flags for its current observation (None: all alive)."""
    return getattr(env, "alive", None)


def action_mask_of(env: Any) -> torch.Tensor | None:
    """The env's legal-action mask for its current observation (None: all legal)."""
    return getattr(env, "action_mask", None)
