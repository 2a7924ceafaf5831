"""The state of Gymnasium environments as data the store keeps, and back.

An env's state is taken as the plain attributes of each of its wrappers and of the env
itself: numbers, strings, numpy arrays and scalars (their dtypes kept), lists, tuples and
dicts of them, and numpy Generators (their bit generator's state). That is the whole
state of the classic-control and toy-text envs, and of wrappers such as TimeLimit and
Monitor; an env that keeps state elsewhere (a physics engine's or an emulator's memory)
is restored only in part. Nothing is unpickled or called: attributes are set to plain
data, never over a method or property.
"""

from __future__ import annotations

import json
from typing import Any

from vrl.errors import VrlError

SKIP = object()  # a value that is not plain data


def encode(value: Any) -> Any:
    """Plain data as the store keeps it (arrays as tensors), or SKIP."""
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.ndarray):
        return SKIP if value.dtype.hasobject else value
    if isinstance(value, np.generic):
        return {"$np": np.asarray(value)}  # its dtype kept: float32 physics stays float32
    if isinstance(value, np.random.Generator):
        return {"$rng": json.dumps(value.bit_generator.state)}  # (128-bit ints: as text)
    if isinstance(value, (list, tuple)):
        items = [encode(v) for v in value]
        return SKIP if any(i is SKIP for i in items) else type(value)(items)
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        pairs = {k: encode(v) for k, v in value.items()}
        return SKIP if any(v is SKIP for v in pairs.values()) else pairs
    return SKIP


def decode(value: Any) -> Any:
    """What `encode` gave, as loaded from the store; arrays as writable copies."""
    import numpy as np

    if isinstance(value, dict):
        if set(value) == {"$np"}:
            return np.asarray(value["$np"])[()]
        if set(value) == {"$rng"}:
            state = json.loads(value["$rng"])
            kind = state.get("bit_generator")
            if kind not in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64"):
                raise VrlError(f"unknown numpy bit generator {kind!r}")
            bits = getattr(np.random, kind)()
            bits.state = state
            return np.random.Generator(bits)
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    if hasattr(value, "numpy"):  # a torch tensor (the store's form of an array)
        return value.numpy().copy()
    if isinstance(value, np.ndarray):
        return value.copy()
    return value


def attributes(obj: Any) -> dict[str, Any]:
    """An object's plain attributes (not `env`, the env a wrapper wraps)."""
    return {k: e for k, v in vars(obj).items() if k != "env" and (e := encode(v)) is not SKIP}


def set_attributes(obj: Any, saved: dict[str, Any]) -> None:
    """Set what `attributes` gave: plain data, and never in place of what the class
    defines (a method, a property, a constant; a default of None is taken, as Gymnasium's
    `_np_random` before the first reset). An env that is not reset yet lacks the attributes
    its reset creates, so names it does not have are set too."""
    for key, value in decode(saved).items():
        if not key.startswith("__") and (key in vars(obj) or
                                          getattr(type(obj), key, None) is None):
            setattr(obj, key, value)


def layers(env: Any) -> list[Any]:
    """An env and the envs it wraps, outermost first."""
    import gymnasium

    out = [env]
    while isinstance(vars(env).get("env"), gymnasium.Env):
        env = vars(env)["env"]
        out.append(env)
    return out


def capture(envs: list[Any]) -> list[list[dict[str, Any]]]:
    """The state of each env: its layers' classes and plain attributes."""
    return [[{"class": type(x).__qualname__, "attrs": attributes(x)} for x in layers(e)]
            for e in envs]


def restore(envs: list[Any], saved: Any) -> bool:
    """Put `capture`'s state back into envs built the same way (the same wrappers in the
    same order); False, touching nothing, where they are not."""
    if not isinstance(saved, list) or len(saved) != len(envs):
        return False
    chains = [layers(e) for e in envs]
    if [[type(x).__qualname__ for x in c] for c in chains] != \
            [[s.get("class") for s in e] for e in saved]:
        return False
    for chain, states in zip(chains, saved, strict=True):
        for layer, state in zip(chain, states, strict=True):
            set_attributes(layer, state["attrs"])
    return True
