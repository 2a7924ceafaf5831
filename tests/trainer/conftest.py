import torch


def pytest_configure(config):
    # the machine is shared; keep tests from grabbing every core
    torch.set_num_threads(1)
