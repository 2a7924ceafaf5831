"""Policy-optimisation algorithms: PPO and GSPO (PPO plus shaper, radius, replay)."""

from __future__ import annotations

from trainer.algos.ppo import PPO, RolloutBuffer, compute_gae, ppo_loss
from trainer.config import GSPOConfig, PPOConfig

__all__ = ["PPO", "RolloutBuffer", "compute_gae", "make_algo", "ppo_loss"]


def make_algo(agent, config: PPOConfig, precision, dist=None, generator=None) -> PPO:
    """PPO for a PPOConfig, GSPO for a GSPOConfig."""
    if isinstance(config, GSPOConfig):
        from trainer.algos.gspo import GSPO

        return GSPO(agent, config, precision, dist, generator)
    return PPO(agent, config, precision, dist, generator)
