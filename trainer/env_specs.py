"""What an env spec names, checked without making the env and without torch: `vrl sweep`
and `vrl pbt` check their trials' env this way before any trial starts (their controller
only starts `vrl train` processes), and `trainer.envs.make_env` builds on the same parts.

A spec is ``warehouse``, ``gym:ID``, ``gym:MODULE:ID`` (MODULE is imported first, so it can
register ID) or ``pettingzoo:MODULE:FACTORY`` (``FACTORY(**env_kwargs)`` returns a
ParallelEnv).
"""

from __future__ import annotations

import importlib
from typing import Any

from vrl.errors import VrlError

SPECS = "warehouse, gym:ID, gym:MODULE:ID or pettingzoo:MODULE:FACTORY"


class EnvSpecError(VrlError, ValueError):
    """An environment the trainer cannot use: bad spec, unsupported space, bad step."""


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


def check_spec(spec: str) -> None:
    """EnvSpecError where ``make_env`` would fail on the spec itself: an unknown form, a
    Gymnasium ID that is not registered, a module or factory that is not there. What only
    the env's constructor can tell (an unsupported space, bad settings) is not checked."""
    kind, _, rest = spec.partition(":")
    if spec == "warehouse":
        return
    if kind == "gym" and rest and not rest.endswith(":"):
        gym, env_id = registering(rest)
        try:
            gym.spec(env_id)
        except gym.error.Error as exc:
            raise gym_error(gym, rest, exc) from None
    elif kind == "pettingzoo" and ":" in rest:
        pettingzoo_factory(spec)
    else:
        raise unknown_spec(spec)


def unknown_spec(spec: str) -> EnvSpecError:
    return EnvSpecError(f"unknown env {spec!r}; use {SPECS}")


def pettingzoo_factory(spec: str) -> Any:
    """The FACTORY of ``pettingzoo:MODULE:FACTORY``, its module imported."""
    module, _, factory = spec.partition(":")[2].rpartition(":")
    try:
        return getattr(importlib.import_module(module), factory)
    except ImportError as exc:
        raise EnvSpecError(f"{spec}: {import_error_hint(module, exc)}") from None
    except AttributeError:
        raise EnvSpecError(f"{spec}: module {module!r} has no {factory!r}") from None


def import_gym() -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise EnvSpecError("Gymnasium environments need gymnasium: "
                           "pip install 'vrl[gym]'") from exc
    return gymnasium


def registering(spec: str) -> tuple[Any, str]:
    """(gymnasium, ID) for ``ID`` or ``MODULE:ID``, the module imported first (it may
    register ID)."""
    gym = import_gym()
    module, _, env_id = spec.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvSpecError(f"gym:{spec}: {import_error_hint(module, exc)}") from None
    return gym, env_id


def gym_error(gym: Any, spec: str, exc: Exception) -> EnvSpecError:
    """Gymnasium's error for ``gym:SPEC`` in one line (an unknown ID without a module:
    with the hint to name the module that registers it)."""
    unknown = isinstance(exc, (gym.error.NameNotFound, gym.error.NamespaceNotFound))
    hint = (" (use gym:MODULE:ID to import the module that registers it)"
            if unknown and ":" not in spec else "")
    return EnvSpecError(f"gym:{spec}: {str(exc).splitlines()[0]}{hint}")
