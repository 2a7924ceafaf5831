"""Reinforcement-learning trainer: warehouse environment, PPO and GSPO.

The trainer knows nothing about storage; a store connects through hooks
(see :mod:`trainer.hooks`) and :meth:`trainer.train.Trainer.state_dict`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.config import GSPOConfig, PPOConfig, load_config

__all__ = ["GSPOConfig", "PPOConfig", "load_config"]


def __getattr__(name: str) -> Any:
    # loaded on first use: `python -m trainer` imports this package before its __main__
    # can install the Ctrl-C latch, so the package itself imports nothing
    if name in __all__:
        from trainer import config

        return getattr(config, name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
