import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models: one thread each (several spin-wait against each other on a shared
    2-core machine, 10x slower); restored for the worker's next tests."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
