"""The repository's human-editable settings file `.vrl/config` (Git-style INI).

The settings a person may change are in `SETTINGS`, each with what it allows: a value is
checked when it is set and again when a command reads it (the file can be edited by hand),
and a bad one is a one-line error naming the key, the value and what is allowed. Sections
vrl manages itself (`remote "NAME"`, vrl.remote.config) and its own bookkeeping keys
(`core.partial`, `core.promisor`) are not in it.
"""

from __future__ import annotations

import configparser
import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vrl.durable import write_file
from vrl.errors import ConfigError, VrlError

DEFAULTS = {
    "core": {"fsync": "true", "verify": "false", "workspace": "policy.safetensors",
             "journal": "true"},
    "diff": {"threshold": "0.001"},
    "gc": {"grace": "3600"},
}


def _bool(text: str) -> bool:
    return configparser.ConfigParser.BOOLEAN_STATES[text.strip().lower()]  # KeyError if not


def _non_negative(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(text)
    return value


def _text(text: str) -> str:
    if not text.strip() or any(c in text for c in "\r\n\x00"):
        raise ValueError(text)
    return text


# "section.key" -> (parse the text or raise ValueError/KeyError, what is allowed)
SETTINGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "core.fsync": (_bool, "true or false"),
    "core.verify": (_bool, "true or false"),
    "core.journal": (_bool, "true or false"),
    "core.workspace": (_text, "a checkpoint file name"),
    "diff.threshold": (_non_negative, "a number >= 0 (a relative change, e.g. 0.001)"),
    "gc.grace": (_non_negative, "a number of seconds >= 0 (e.g. 3600)"),
    "user.name": (_text, "non-empty text on one line"),
    "user.email": (_text, "non-empty text on one line"),
}


def setting_name(key: str) -> tuple[str, str]:
    """(section, name) of the setting `key` ("gc.grace"); ConfigError if it is unknown."""
    if key not in SETTINGS:
        raise ConfigError(f"unknown config key {key!r}; known: {', '.join(SETTINGS)}")
    section, _, name = key.partition(".")
    return section, name


def parse_setting(key: str, value: str) -> Any:
    """`value` of the setting `key` ("gc.grace") parsed; ConfigError if it is not allowed or
    the key is unknown."""
    setting_name(key)
    parse, allowed = SETTINGS[key]
    try:
        return parse(value)
    except (ValueError, KeyError):
        raise ConfigError(f"invalid value {value!r} for {key}: it must be {allowed}") \
            from None


class Config:
    """Sections such as `core`, `diff`, and `remote "origin"`, saved atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.parser = configparser.ConfigParser(interpolation=None)
        # parsed numbers by (section, key): every commit reads its threshold, and
        # configparser's lookup costs more than the rest of the commit's metadata; cleared
        # by every change made through this object (the file is read once, at creation)
        self._floats: dict[tuple[str, str], float] = {}
        self.parser.read_dict(DEFAULTS)
        if self.path.exists():
            try:
                self.parser.read(self.path)
            except configparser.Error as exc:
                raise VrlError(f"{self.path} is not a valid config file: "
                               f"{str(exc).splitlines()[0]}; fix or remove it") from exc

    def get(self, section: str, key: str, default: str | None = None) -> str | None:
        return self.parser.get(section, key, fallback=default)

    def _checked(self, section: str, key: str) -> Any:
        """A known setting's value parsed, or a ConfigError that says how to fix it."""
        name = f"{section}.{key}"
        try:
            return parse_setting(name, self.parser.get(section, key))
        except ConfigError as exc:
            raise ConfigError(f"{self.path}: {exc}; fix it with `vrl config set {name} "
                              f"VALUE` or `vrl config unset {name}`") from None

    def getbool(self, section: str, key: str) -> bool:
        if f"{section}.{key}" in SETTINGS:
            return bool(self._checked(section, key))
        try:
            return self.parser.getboolean(section, key)
        except ValueError as exc:
            raise VrlError(f"{self.path}: [{section}] {key} must be true or false") from exc

    def flag(self, section: str, key: str) -> bool:
        """A true/false setting that is false when absent (`partial = false` is false)."""
        return self.getbool(section, key) if self.get(section, key) is not None else False

    def getfloat(self, section: str, key: str) -> float:
        value = self._floats.get((section, key))
        if value is None:
            if f"{section}.{key}" in SETTINGS:
                value = float(self._checked(section, key))
            else:
                try:
                    value = self.parser.getfloat(section, key)
                except ValueError as exc:
                    raise VrlError(f"{self.path}: [{section}] {key} must be a number") \
                        from exc
            self._floats[section, key] = value
        return value

    def set(self, section: str, key: str, value: str) -> None:
        """Set a value (a known setting's value is checked first: ConfigError)."""
        if f"{section}.{key}" in SETTINGS:
            parse_setting(f"{section}.{key}", value)
        self._floats.clear()
        if not self.parser.has_section(section):
            self.parser.add_section(section)
        self.parser.set(section, key, value)

    def sections(self, prefix: str = "") -> list[str]:
        return [s for s in self.parser.sections() if s.startswith(prefix)]

    def unset(self, section: str, key: str) -> None:
        """Remove a value (a setting with a default goes back to it)."""
        self._floats.clear()
        if self.parser.has_section(section):
            self.parser.remove_option(section, key)
        default = DEFAULTS.get(section, {}).get(key)
        if default is not None:
            self.parser.set(section, key, default)

    def remove_section(self, section: str) -> None:
        self._floats.clear()
        self.parser.remove_section(section)

    def save(self) -> None:
        text = io.StringIO()
        self.parser.write(text)
        # whole or not at all: a power cut must not leave an empty config
        write_file(self.path, text.getvalue(), "writing the config")
