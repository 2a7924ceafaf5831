"""Environments: the built-in warehouse and adapters for Gymnasium and PettingZoo.

``make_env(spec, ...)`` with ``spec`` one of ``warehouse``, ``gym:ID``, ``gym:MODULE:ID``
(MODULE is imported first, so it can register ID) or ``pettingzoo:MODULE:FACTORY``
(``FACTORY(**env_kwargs)`` returns a ParallelEnv).
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from trainer.envs.base import VecEnv
from trainer.envs.spaces import EnvSpecError, import_error_hint

__all__ = ["EnvSpecError", "VecEnv", "make_env"]

SPECS = "warehouse, gym:ID, gym:MODULE:ID or pettingzoo:MODULE:FACTORY"


def make_env(spec: str, num_envs: int, *, device: str | torch.device = "cpu", seed: int = 0,
             env_kwargs: dict[str, Any] | None = None) -> VecEnv:
    """Build a vectorised env from a command-line spec."""
    kwargs = dict(env_kwargs or {})
    if spec == "warehouse":
        from trainer.envs.warehouse import WarehouseEnv

        return WarehouseEnv(num_envs, device=device, seed=seed, **kwargs)
    kind, _, rest = spec.partition(":")
    if kind == "gym" and rest and not rest.endswith(":"):
        from trainer.envs.gym_adapter import GymVecEnv

        return GymVecEnv(rest, num_envs, device=device, **kwargs)
    if kind == "pettingzoo" and ":" in rest:
        from trainer.envs.pettingzoo_adapter import PettingZooVecEnv

        module, _, factory = rest.rpartition(":")
        try:
            fn = getattr(importlib.import_module(module), factory)
        except ImportError as exc:
            raise EnvSpecError(f"{spec}: {import_error_hint(module, exc)}") from None
        except AttributeError:
            raise EnvSpecError(f"{spec}: module {module!r} has no {factory!r}") from None

        def factory_fn() -> Any:
            try:
                return fn(**kwargs)
            except TypeError as exc:
                raise EnvSpecError(f"{spec}: {exc} (check the env settings, "
                                   "--set env.KEY=...)") from None

        return PettingZooVecEnv(factory_fn, num_envs, device=device, name=spec)
    raise EnvSpecError(f"unknown env {spec!r}; use {SPECS}")
