"""A Stable-Baselines3 algorithm's constructor arguments as JSON (a commit's hparams), and
back.

Classes are recorded by qualified name ({"$class": "torch.nn.modules.activation.Tanh"})
and rebuilt only from an allow-list: torch's modules and optimizers, SB3's feature
extractors, buffers and the algorithms' own policies. SB3's constant and linear schedules
are recorded by their numbers. Any other object (a lambda, an action noise) is recorded by
its name only ({"$object": ...}): `load` asks for it. Nothing is ever evaluated or
unpickled. SB3 is imported inside the functions, when they run.
"""

from __future__ import annotations

import enum
import functools
import inspect
from typing import Any

from vrl.errors import VrlError

ALGORITHMS = ("A2C", "DDPG", "DQN", "PPO", "SAC", "TD3")  # the classes `load` rebuilds


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def to_json(value: Any) -> Any:
    """One argument as JSON."""
    from stable_baselines3.common import utils

    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy, torch
        return value.item()
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, type):
        return {"$class": _name(value)}
    if type(value).__name__ == "device":
        return str(value)
    if inspect.isfunction(value) and value.__module__ == utils.__name__:
        # (SB3 before FloatSchedule: schedules are closures of these two functions)
        free = inspect.getclosurevars(value).nonlocals
        if value.__qualname__.startswith("constant_fn."):
            return free["val"]
        if value.__qualname__.startswith("get_schedule_fn."):
            return to_json(free["value_schedule"])
    if isinstance(value, getattr(utils, "FloatSchedule", ())):
        value = value.value_schedule
    if isinstance(value, getattr(utils, "ConstantSchedule", ())):
        return value.val
    if isinstance(value, getattr(utils, "LinearSchedule", ())):
        return {"$schedule": "LinearSchedule", "start": value.start, "end": value.end,
                "end_fraction": value.end_fraction}
    return {"$object": _name(value if inspect.isfunction(value) else type(value))}


def constructor_args(model: Any, env_id: str | None) -> dict[str, Any]:
    """The algorithm's constructor arguments, read back from the model (SB3 keeps each
    under its own name or with a leading underscore); `env` is the env's id."""
    out: dict[str, Any] = {}
    for name in inspect.signature(type(model).__init__).parameters:
        if name in ("self", "_init_setup_model", "args", "kwargs"):
            continue
        if name == "policy":  # the alias it was most likely given as ("MlpPolicy")
            aliases = getattr(model, "policy_aliases", {})
            value = next((a for a, c in aliases.items() if c is model.policy_class),
                         model.policy_class)
        elif name == "env":
            value = env_id
        elif name in vars(model) or f"_{name}" in vars(model):
            value = vars(model).get(name, vars(model).get(f"_{name}"))
        else:
            continue
        out[name] = to_json(value)
    return out


@functools.cache
def _classes() -> dict[str, type]:
    """The allow-list: every class a recorded argument may name."""
    import stable_baselines3
    import torch
    from stable_baselines3.common import buffers, torch_layers

    table: dict[str, type] = {}
    for space, base in ((torch.nn, torch.nn.Module), (torch.optim, torch.optim.Optimizer),
                        (torch_layers, torch.nn.Module), (buffers, buffers.BaseBuffer)):
        for attr in dir(space):
            obj = getattr(space, attr)
            if isinstance(obj, type) and issubclass(obj, base):
                table[_name(obj)] = obj
    for algo in ALGORITHMS:
        for cls in getattr(stable_baselines3, algo).policy_aliases.values():
            table[_name(cls)] = cls
    return table


def from_json(value: Any, path: str) -> Any:
    """One recorded argument (`path` names it in errors) as the constructor takes it."""
    if isinstance(value, list):
        return [from_json(v, path) for v in value]
    if not isinstance(value, dict):
        return value
    top = path.split(".")[0]
    if "$class" in value:
        if value["$class"] not in _classes():
            raise VrlError(f"{path} is {value['$class']}, which load does not rebuild from "
                           f"a name; pass {top}=... to load")
        return _classes()[value["$class"]]
    if "$object" in value:
        raise VrlError(f"{path} was a {value['$object']}, which is not recorded; pass "
                       f"{top}=... to load")
    if value.get("$schedule") == "LinearSchedule":
        from stable_baselines3.common.utils import LinearSchedule

        return LinearSchedule(value["start"], value["end"], value["end_fraction"])
    return {k: from_json(v, f"{path}.{k}") for k, v in value.items()}


def rebuild(hparams: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments (but `env`): the recorded ones, `overrides`
    taking the place of any of them."""
    args = {k: from_json(v, k) for k, v in hparams.items()
            if k not in overrides and k != "env"}
    if isinstance(args.get("train_freq"), list):  # SB3 takes (n, unit) as a tuple only
        args["train_freq"] = tuple(args["train_freq"])
    return {**args, **overrides}
