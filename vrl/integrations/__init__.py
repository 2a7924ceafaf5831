"""Integrations of vrl with training frameworks: `vrl.integrations.sb3` (Stable-Baselines3),
`vrl.integrations.lightning` (PyTorch Lightning). Each loads on first use, and imports its
framework only when a callback or loader is made."""

import importlib
from typing import Any

__all__ = ["lightning", "sb3"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"vrl.integrations.{name}")
    raise AttributeError(f"module 'vrl.integrations' has no attribute {name!r}")
