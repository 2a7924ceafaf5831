"""Named configurations shipped with the trainer: ``vrl train --preset NAME``.

Each preset is a YAML file next to this module (``NAME.yaml``) in the format of
``--config`` files: config fields, optionally ``algo:`` and an ``env:`` mapping. A preset
reproduces one published figure (README, docs/trainer.md); its first comment lines say
which. ``--config`` and ``--set`` override a preset.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from trainer.config import ConfigError


def list_presets() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.name[:-5] for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """The YAML text of preset ``name`` (a ``ConfigError`` naming the choices if unknown)."""
    if name not in list_presets():
        raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(list_presets())}")
    return resources.files(__name__).joinpath(f"{name}.yaml").read_text()


def load_preset(name: str) -> dict[str, Any]:
    """The preset's mapping (config fields, ``algo``, ``env``)."""
    from vrl import yaml12

    values = yaml12.load(preset_text(name)) or {}
    if not isinstance(values, dict):  # shipped files are tested; this guards edits
        raise ConfigError(f"preset {name!r}: expected a mapping at the top level")
    return values


def preset_algo(name: str | None) -> str | None:
    """The ``algo:`` a preset names, if any."""
    return load_preset(name).get("algo") if name else None
