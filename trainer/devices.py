"""Device selection and mixed precision.

``--device auto`` picks an Ascend NPU when torch_npu imports and a device is present,
else CUDA, else CPU; it never fails when torch_npu is absent. NPU details live in
:mod:`trainer.npu`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from trainer import npu

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str = "auto", local_rank: int | None = None) -> torch.device:
    """Turn ``auto|cpu|cuda[:i]|npu[:i]`` into a device; under torchrun the index
    defaults to LOCAL_RANK so each process gets its own accelerator."""
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    kind, _, index = spec.partition(":")
    if kind == "auto":
        if npu.is_available():
            kind = "npu"
        elif torch.cuda.is_available():
            kind = "cuda"
        else:
            kind = "cpu"
    if kind == "cpu":
        return torch.device("cpu")
    idx = int(index) if index else local_rank
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    if kind == "npu":
        return npu.pin_device(idx)
    raise ValueError(f"unknown device {spec!r}; use auto, cpu, cuda[:i] or npu[:i]")


def dist_backend(device: torch.device) -> str:
    """gloo on CPU, NCCL on CUDA, HCCL on NPU."""
    return {"cpu": "gloo", "cuda": "nccl", "npu": npu.BACKEND}[device.type]


@dataclass(frozen=True)
class Precision:
    """Autocast dtype plus, for fp16, a gradient scaler against underflow."""

    name: str
    device: torch.device

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise ValueError(f"unknown precision {self.name!r}; use {sorted(PRECISIONS)}")

    @property
    def dtype(self) -> torch.dtype:
        return PRECISIONS[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device.type)


def manual_seed_all(seed: int) -> None:
    """Seed the global RNGs that library code may use (ours use explicit generators)."""
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

