import os
import sys

import torch

# test-local modules (pz_line_env) import by name under --import-mode=importlib
sys.path.insert(0, os.path.dirname(__file__))


def pytest_configure(config):
    # the machine is shared; keep tests from grabbing every core
    torch.set_num_threads(1)
