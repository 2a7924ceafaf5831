"""Integrations with training libraries, each a submodule loaded on first use that imports
its library only when called: `vrl.integrations.sb3` (Stable-Baselines3).
"""

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    try:
        return importlib.import_module(f"{__name__}.{name}")  # vrl.integrations.sb3, ...
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
