"""YAML with the YAML 1.2 core schema's plain scalars, on top of PyYAML.

PyYAML implements YAML 1.1, where `3e-4` is a string (1.1 floats need a dot), `yes`/`off`
are booleans, `0777` is octal and `1:30` is the integer 90. Hyperparameters are typed in
YAML 1.2's sense by everyone who writes them (`lr: 3e-4`), so vrl and the trainer read
YAML through this loader: PyYAML's parser, with the 1.2 core schema's resolvers for plain
(unquoted) scalars. Quoted scalars stay strings, as in any YAML.

PyYAML is imported when a document needs its parser: a command-line value that is one
plain number, boolean or null (`--metric return=3.5`) is resolved here by the same rules
(importing PyYAML costs a command ~10-30 ms).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
_NOT_FOUND = object()


def _to_int(text: str) -> int:
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text)


def _to_float(text: str) -> float:
    text = text.lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


def _to_bool(text: str) -> bool:
    return text.lower() == "true"


def _plain(text: str) -> Any:
    """The value of a document that is exactly one plain scalar of the core schema (a
    number, boolean or null, nothing around it), else _NOT_FOUND. Such a document holds
    nothing else for a parser to find, and resolves by the loader's own rules."""
    if _INT.fullmatch(text):
        return _to_int(text)
    if _FLOAT.fullmatch(text):
        return _to_float(text)
    if _BOOL.fullmatch(text):
        return _to_bool(text)
    if _NULL.fullmatch(text):
        return None
    return _NOT_FOUND


@lru_cache(maxsize=1)
def _loader() -> type:
    """A safe loader resolving plain scalars by the YAML 1.2 core schema."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # Keep only the resolvers that are not about plain scalars (merge keys, `=`), then
    # add 1.2's.
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers
                if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                               "tag:yaml.org,2002:float", "tag:yaml.org,2002:null",
                               "tag:yaml.org,2002:timestamp")]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for tag, rx, first in (
            ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
            ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
            ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
            ("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))):
        Loader.add_implicit_resolver(tag, rx, first)
    for tag, convert in (("tag:yaml.org,2002:int", _to_int),
                         ("tag:yaml.org,2002:float", _to_float),
                         ("tag:yaml.org,2002:bool", _to_bool)):
        Loader.add_constructor(
            tag, lambda loader, node, convert=convert: convert(str(
                loader.construct_scalar(node))))
    return Loader


def load(text: str) -> Any:
    """Parse YAML text (YAML 1.2 scalars). Raises yaml.YAMLError, or ValueError when the
    document nests too deeply to parse (PyYAML's composer recurses once per level)."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # noqa: S506 - a SafeLoader
    except RecursionError:
        raise ValueError("it nests too deeply") from None


def parse_scalar(text: str) -> Any:
    """A command-line value (`--set lr=3e-4`): parsed as a YAML 1.2 value where that works
    (numbers, booleans, null, lists, mappings), else kept as the string given."""
    if not text:
        return ""
    value = _plain(text)
    if value is not _NOT_FOUND:
        return value
    import yaml

    try:
        return load(text)
    except (yaml.YAMLError, ValueError):
        return text
