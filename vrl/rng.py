"""The global RNG states of a training process: capture them into a snapshot, restore them.

One capture has two stored forms, because snapshots of both are in repositories and each
must load and keep its skeleton (a commit's structure is compared with its parent's):

* the Snapshotter's (`rng_state()`, under "rng"): Python's state as the tuple `random`
  gives, numpy's as the tuple `np.random.get_state()` gives (its keys a uint32 array);
* the trainer's (`rng_state(tensors=True)`, under "rng"/"global"): torch tensors and JSON
  values only (lists, no tuples, no numpy arrays; numpy's state a dict with its keys an
  int64 tensor), for stores and loaders that take nothing else (`torch.load` with
  `weights_only=True` refuses numpy arrays).

`set_rng_state` restores either form, as stored or as loaded back (the store may return
lists where tuples were, and a `.pt` export turns numpy arrays into tensors).
"""

from __future__ import annotations

import random
from typing import Any


def rng_state(tensors: bool = False) -> dict[str, Any]:
    """Every global RNG state: Python, numpy, torch CPU and (where in use) CUDA / NPU.

    `tensors=True` gives the form with only tensors and JSON values (see the module)."""
    import numpy as np
    import torch

    py = random.getstate()
    np_state = np.random.get_state()
    state: dict[str, Any]
    if tensors:
        version, internal, gauss = py
        name, keys, pos, has_gauss, cached = np_state
        state = {"python": [version, list(internal), gauss],
                 "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)),
                           "pos": int(pos), "has_gauss": int(has_gauss),
                           "cached": float(cached)}}
    else:
        state = {"python": py, "numpy": np_state}
    state["torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    npu = getattr(torch, "npu", None)  # (present once torch_npu is imported)
    if npu is not None and npu.is_available():
        state["npu"] = npu.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` captured, in either form."""
    import numpy as np
    import torch

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    if isinstance(n, dict):
        np.random.set_state((n["name"], _uint32(n["keys"]), n["pos"], n["has_gauss"],
                             n["cached"]))
    else:
        name, keys, *rest = n
        np.random.set_state((name, _uint32(keys), *rest))
    # (copies: a loaded state's tensors may view a read-only file, or another device)
    torch.set_rng_state(state["torch"].cpu().clone())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu().clone() for s in state["cuda"]])
    if "npu" in state and getattr(torch, "npu", None) is not None:
        torch.npu.set_rng_state(state["npu"].cpu().clone())


def _uint32(keys: Any) -> Any:
    """numpy's MT19937 key as the uint32 array it takes, from an array, tensor or list."""
    import numpy as np

    if hasattr(keys, "numpy") and not isinstance(keys, np.ndarray):  # a torch tensor
        keys = keys.cpu().numpy()
    return np.asarray(keys).astype(np.uint32)
