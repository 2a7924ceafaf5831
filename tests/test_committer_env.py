"""The Snapshotter's committer process captures the environment recorded with each
snapshot itself (git and package scans stay off the training path), given the part only
the training process knows (torch build, device, seed)."""

from __future__ import annotations

import pytest
import torch

from vrl import Repo, envinfo
from vrl.hooks import Snapshotter, process_mode_available


@pytest.mark.skipif(not process_mode_available(), reason="needs the committer process")
def test_the_committer_captures_the_same_environment(tmp_path, monkeypatch):
    repo = Repo.init(tmp_path / "repo")
    torch.manual_seed(1234)
    expected = envinfo.capture(repo.workdir)

    def not_here(*args, **kwargs):
        raise AssertionError("the training process captured the environment")

    monkeypatch.setattr(envinfo, "capture", not_here)
    with Snapshotter(repo, torch.nn.Linear(3, 2), include_rng=False,
                     handle_sigterm=False) as snap:
        snap.step(0)
    monkeypatch.undo()
    got = repo.read_commit(repo.resolve("HEAD")).env
    assert got == expected
    assert got["seeds"] == {"torch_initial_seed": 1234} and got["torch"] == torch.__version__


def test_without_env_nothing_is_captured(tmp_path):
    repo = Repo.init(tmp_path / "repo")
    with Snapshotter(repo, torch.nn.Linear(3, 2), include_rng=False, env=False,
                     handle_sigterm=False) as snap:
        snap.step(0)
    assert repo.read_commit(repo.resolve("HEAD")).env == {}
