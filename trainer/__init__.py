"""Reinforcement-learning trainer: warehouse environment, PPO and GSPO.

The trainer knows nothing about storage; a store connects through hooks
(see :mod:`trainer.hooks`) and :meth:`trainer.train.Trainer.state_dict`.
"""

from trainer.config import GSPOConfig, PPOConfig, load_config

__all__ = ["GSPOConfig", "PPOConfig", "load_config"]
