"""YAML with the YAML 1.2 core schema's plain scalars, on top of PyYAML.

PyYAML implements YAML 1.1, where `3e-4` is a string (1.1 floats need a dot), `yes`/`off`
are booleans, `0777` is octal and `1:30` is the integer 90. Hyperparameters are typed in
YAML 1.2's sense by everyone who writes them (`lr: 3e-4`), so vrl and the trainer read
YAML through this loader: PyYAML's parser, with the 1.2 core schema's resolvers for plain
(unquoted) scalars. Quoted scalars stay strings, as in any YAML.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


class Loader(yaml.SafeLoader):
    """A safe loader resolving plain scalars by the YAML 1.2 core schema."""


# Keep only the resolvers that are not about plain scalars (merge keys, `=`), then add 1.2's.
Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                           "tag:yaml.org,2002:float", "tag:yaml.org,2002:null",
                           "tag:yaml.org,2002:timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _rx, _first in (
        ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
        ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
        ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
        ("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))):
    Loader.add_implicit_resolver(_tag, _rx, _first)


def _construct_int(loader: Loader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text)


def _construct_float(loader: Loader, node: yaml.ScalarNode) -> float:
    text = str(loader.construct_scalar(node)).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


def _construct_bool(loader: Loader, node: yaml.ScalarNode) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


def load(text: str) -> Any:
    """Parse YAML text (YAML 1.2 scalars). Raises yaml.YAMLError, or ValueError when the
    document nests too deeply to parse (PyYAML's composer recurses once per level)."""
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader
    except RecursionError:
        raise ValueError("it nests too deeply") from None


def parse_scalar(text: str) -> Any:
    """A command-line value (`--set lr=3e-4`): parsed as a YAML 1.2 value where that works
    (numbers, booleans, null, lists, mappings), else kept as the string given."""
    if not text:
        return ""
    try:
        return load(text)
    except (yaml.YAMLError, ValueError):
        return text
