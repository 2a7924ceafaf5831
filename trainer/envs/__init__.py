"""Environments: the built-in warehouse and adapters for Gymnasium and PettingZoo.

``make_env(spec, ...)`` with ``spec`` one of ``warehouse``, ``gym:ID``, ``gym:MODULE:ID``
(MODULE is imported first, so it can register ID) or ``pettingzoo:MODULE:FACTORY``
(``FACTORY(**env_kwargs)`` returns a ParallelEnv); ``check_spec(spec)`` checks one
without making the env (trainer/env_specs.py).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.env_specs import EnvSpecError, check_spec, pettingzoo_factory, unknown_spec
from trainer.envs.base import VecEnv

__all__ = ["EnvSpecError", "VecEnv", "check_spec", "make_env"]


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

        fn = pettingzoo_factory(spec)

        def factory_fn() -> Any:
            try:
                return fn(**kwargs)
            except TypeError as exc:
                raise EnvSpecError(f"{spec}: {exc} (check the env settings, "
                                   "--set env.KEY=...)") from None

        return PettingZooVecEnv(factory_fn, num_envs, device=device, name=spec)
    raise unknown_spec(spec)
