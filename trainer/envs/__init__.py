"""Environments: the built-in warehouse and adapters for Gymnasium and PettingZoo.

``make_env("warehouse" | "gym:CartPole-v1" | "pettingzoo:module:factory", ...)``
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from trainer.envs.base import VecEnv


def make_env(spec: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0,
             env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """Build a vectorised env from a command-line spec."""
    kwargs = dict(env_kwargs or {})
    if spec == "warehouse":
        from trainer.envs.warehouse import WarehouseEnv

        return WarehouseEnv(num_envs, device=device, seed=seed, **kwargs)
    kind, _, rest = spec.partition(":")
    if kind == "gym" and rest:
        from trainer.envs.gym_adapter import GymVecEnv

        return GymVecEnv(rest, num_envs, device=device, **kwargs)
    if kind == "pettingzoo" and ":" in rest:
        from trainer.envs.pettingzoo_adapter import PettingZooVecEnv

        module, _, factory = rest.rpartition(":")
        try:
            fn = getattr(importlib.import_module(module), factory)
        except ImportError as exc:
            raise ImportError(f"cannot import {module!r}; PettingZoo envs need "
                              "pip install 'vrl[pettingzoo]'") from exc
        return PettingZooVecEnv(lambda: fn(**kwargs), num_envs, device=device)
    raise ValueError(f"unknown env {spec!r}; use warehouse, gym:ID or "
                     "pettingzoo:module:factory")
