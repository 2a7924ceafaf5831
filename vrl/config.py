"""The repository's human-editable settings file `.vrl/config` (Git-style INI)."""

from __future__ import annotations

import configparser
import os
from pathlib import Path

from vrl.errors import VrlError
from vrl.object_store import _fsync_dir, discard, storage_error

DEFAULTS = {
    "core": {"fsync": "true", "verify": "false", "workspace": "policy.safetensors",
             "journal": "true"},
    "diff": {"threshold": "0.001"},
    "gc": {"grace": "3600"},
}


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

    def getbool(self, section: str, key: str) -> bool:
        try:
            return self.parser.getboolean(section, key)
        except ValueError as exc:
            raise VrlError(f"{self.path}: [{section}] {key} must be true or false") from exc

    def getfloat(self, section: str, key: str) -> float:
        value = self._floats.get((section, key))
        if value is None:
            try:
                value = self._floats[section, key] = self.parser.getfloat(section, key)
            except ValueError as exc:
                raise VrlError(f"{self.path}: [{section}] {key} must be a number") from exc
        return value

    def set(self, section: str, key: str, value: str) -> None:
        self._floats.clear()
        if not self.parser.has_section(section):
            self.parser.add_section(section)
        self.parser.set(section, key, value)

    def sections(self, prefix: str = "") -> list[str]:
        return [s for s in self.parser.sections() if s.startswith(prefix)]

    def remove_section(self, section: str) -> None:
        self._floats.clear()
        self.parser.remove_section(section)

    def save(self) -> None:
        tmp = self.path.with_name(f".config.tmp-{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                self.parser.write(f)
                f.flush()
                os.fsync(f.fileno())  # a power cut must not leave an empty config
            os.replace(tmp, self.path)
            _fsync_dir(self.path.parent)
        except OSError as exc:
            discard(tmp)
            raise storage_error(exc, self.path.parent, "writing the config") from exc
