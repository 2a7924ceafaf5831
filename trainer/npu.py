"""Everything specific to Huawei Ascend NPUs, in one place.

``torch_npu`` registers the ``npu`` device type when imported. It is optional: every
function here is safe to call without it and reports "no NPU".
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator

import torch

BACKEND = "hccl"
"""collective-communication backend for NPUs (the counterpart of NCCL)"""


def import_torch_npu():
    """Import ``torch_npu`` (registers ``torch.npu``) or return None."""
    try:
        return importlib.import_module("torch_npu")
    except Exception:  # absent, or present but its CANN libraries are not loadable
        return None


def is_available() -> bool:
    """True when torch_npu imports and at least one NPU is visible."""
    if import_torch_npu() is None:
        return False
    npu = getattr(torch, "npu", None)
    try:
        return bool(npu is not None and npu.is_available() and npu.device_count() > 0)
    except Exception:
        return False


def require() -> None:
    if not is_available():
        raise RuntimeError(
            "device 'npu' requested but no Ascend NPU is usable: install torch_npu and the "
            "CANN toolkit matching your torch, and check `npu-smi info`"
        )


def pin_device(index: int) -> torch.device:
    """Bind this process to NPU ``index`` (one process per device under torchrun)."""
    require()
    os.environ["DEVICE_ID"] = str(index)  # CANN tools read it
    torch.npu.set_device(index)
    return torch.device("npu", index)


@contextlib.contextmanager
def device_context(index: int | None = None) -> Iterator[torch.device]:
    """Pin to ``index`` (default: LOCAL_RANK) for the duration of the block."""
    index = int(os.environ.get("LOCAL_RANK", 0)) if index is None else index
    previous = os.environ.get("DEVICE_ID")
    try:
        yield pin_device(index)
    finally:
        if previous is None:
            os.environ.pop("DEVICE_ID", None)
        else:
            os.environ["DEVICE_ID"] = previous


def distributed_env_defaults() -> None:
    """HCCL settings that avoid known misconfiguration slow-downs on Ascend clusters
    (whitelist checks, slow connection set-up)."""
    os.environ.setdefault("HCCL_WHITELIST_DISABLE", "1")
