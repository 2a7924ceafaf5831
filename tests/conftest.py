import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # tests/helpers.py


@pytest.fixture
def repo(tmp_path):
    from vrl import Repo

    return Repo.init(tmp_path / "repo")
