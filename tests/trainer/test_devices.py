import pytest
import torch

from trainer import npu
from trainer.devices import Precision, resolve_device


def test_auto_without_accelerators_is_cpu(monkeypatch):
    monkeypatch.setattr(npu, "import_torch_npu", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


def test_auto_prefers_npu_then_cuda(monkeypatch):
    monkeypatch.setattr(npu, "is_available", lambda: True)
    monkeypatch.setattr(npu, "pin_device", lambda i: f"pinned npu {i}")
    assert resolve_device("auto", local_rank=1) == "pinned npu 1"
    assert resolve_device("npu:3", local_rank=1) == "pinned npu 3"
    monkeypatch.setattr(npu, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)


def test_npu_request_without_torch_npu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(npu, "import_torch_npu", lambda: None)
    assert not npu.is_available()
    with pytest.raises(RuntimeError, match="torch_npu"):
        resolve_device("npu:0")


def test_cuda_request_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="cuda"):
        resolve_device("cuda")
    with pytest.raises(ValueError):
        resolve_device("tpu")


def test_precision():
    cpu = torch.device("cpu")
    assert Precision("fp32", cpu).make_scaler() is None
    assert Precision("bf16", cpu).make_scaler() is None
    assert Precision("fp16", cpu).make_scaler() is not None
    with Precision("bf16", cpu).autocast():
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    with pytest.raises(ValueError):
        Precision("int8", cpu)


def test_global_rng_state_round_trip():
    import random

    import numpy as np

    from vrl.rng import rng_state, set_rng_state

    state = rng_state(tensors=True)  # the form the trainer stores
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
