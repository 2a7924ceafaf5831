"""Checkpoint files: reading what a user hands to `vrl commit`, writing what checkout and
export produce. Nothing is ever unpickled: `.pt` files load with weights_only=True."""

from __future__ import annotations

import json
import os
import pickle
import secrets
from pathlib import Path
from typing import Any

from vrl.errors import CheckpointError
from vrl.object_store import discard, storage_error

SAFETENSORS = (".safetensors",)
TORCH = (".pt", ".pth", ".ckpt", ".bin")


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in SAFETENSORS:
        return "safetensors"
    if suffix in TORCH:
        return "torch"
    raise CheckpointError(f"{path}: unknown checkpoint type {suffix or '(no extension)'!r}; "
                          "use .safetensors, .pt or .pth")


def read_checkpoint(path: str | Path) -> Any:
    """Load a checkpoint file into a (nested) state tree of CPU tensors."""
    path = Path(path)
    kind = _kind(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if kind == "safetensors":
        return _read_safetensors(path)
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        detail = str(exc).strip().splitlines() or [type(exc).__name__]
        reason = next((line for line in detail if "Unsupported global" in line), detail[0])
        raise CheckpointError(
            f"{path}: refused, it needs pickle to rebuild arbitrary Python objects "
            f"({reason.strip()}); vrl never unpickles untrusted data, so save a state dict "
            "of tensors (torch.save(model.state_dict(), ...)) or a .safetensors file"
        ) from exc
    except Exception as exc:  # any failure to parse untrusted bytes means "not readable"
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint (truncated or not "
                              f"a checkpoint?): {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:120] if lines else type(exc).__name__


def _read_safetensors(path: Path) -> Any:
    from safetensors import SafetensorError, safe_open

    from vrl.tensors import unflatten

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or not a "
                              f"checkpoint?): {_first_line(exc)}") from exc
    if "vrl.tree" not in meta:
        return dict(tensors)
    try:
        for name, target in json.loads(meta.get("vrl.ties", "{}")).items():
            tensors[name] = tensors[target]
        for name in json.loads(meta.get("vrl.numpy", "[]")):
            tensors[name] = tensors[name].numpy()
        return unflatten(json.loads(meta["vrl.tree"]), tensors)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: its vrl metadata is damaged ({exc}); re-export it") \
            from exc


def write_checkpoint(tree: Any, path: str | Path) -> None:
    """Write a state tree atomically: `.safetensors` (with the tree as metadata) or `.pt`."""
    path = Path(path)
    kind = _kind(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "safetensors":
            _write_safetensors(tree, tmp)
        else:
            import torch

            torch.save(_numpy_to_torch(tree), tmp)
        os.replace(tmp, path)
    except OSError as exc:
        discard(tmp)
        raise storage_error(exc, path.parent, f"writing {path.name}") from exc
    except BaseException:
        discard(tmp)
        raise


def _numpy_to_torch(tree: Any) -> Any:
    import numpy as np
    import torch

    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    if isinstance(tree, dict):
        return {k: _numpy_to_torch(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_numpy_to_torch(v) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_numpy_to_torch(v) for v in tree)
    return tree


def _write_safetensors(tree: Any, path: Path) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from vrl.tensors import flatten

    tensors, skeleton, ties = flatten(tree)
    out: dict[str, torch.Tensor] = {}
    numpy_names = []
    storages: set[int] = set()
    for name, value in tensors.items():
        if name in ties:
            continue
        if isinstance(value, np.ndarray):
            numpy_names.append(name)
            value = torch.from_numpy(np.ascontiguousarray(value))
        value = value.detach().to("cpu").contiguous()
        ptr = value.untyped_storage().data_ptr()
        if value.numel() and ptr in storages:  # safetensors refuses overlapping views
            value = value.clone()
        storages.add(ptr)
        out[name] = value
    meta = {"vrl.tree": json.dumps(skeleton, separators=(",", ":")),
            "vrl.ties": json.dumps(ties), "vrl.numpy": json.dumps(numpy_names),
            "format": "pt"}
    save_file(out, str(path), metadata=meta)
