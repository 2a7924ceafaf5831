"""`vrl-demo DIR`: never deletes anything, and commits the losses it really measured."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from vrl import Repo
from vrl.demo import main


@pytest.mark.parametrize("target", [".", "existing"])
def test_refuses_a_non_empty_directory_and_deletes_nothing(tmp_path, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    for d in (tmp_path, tmp_path / "existing"):
        (d / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(main, [target])
    assert result.exit_code == 1
    assert "not empty" in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    for d in (tmp_path, tmp_path / "existing"):
        assert (d / "precious.txt").read_text() == "keep me"
    assert not (tmp_path / ".vrl").exists() and not (tmp_path / "existing/.vrl").exists()


def test_refuses_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("x")
    result = CliRunner().invoke(main, ["f"])
    assert result.exit_code == 1 and "not a directory" in result.output
    assert (tmp_path / "f").read_text() == "x"


def test_runs_in_a_new_or_empty_directory_and_commits_the_real_losses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["empty"])
    assert result.exit_code == 0, result.output
    printed = [float(x) for x in re.findall(r"trained \d+ steps: loss ([0-9.]+)",
                                            result.output)]
    assert len(printed) == 2
    repo = Repo(tmp_path / "empty")
    first, second = _both_commits(repo)
    for commit, loss in zip((first, second), printed, strict=True):
        assert commit.metrics["loss"] == pytest.approx(loss, abs=5e-4)
    assert second.metrics["loss"] != 0.1


def _both_commits(repo):
    """The demo resets to its first commit; the second is still in the reflog."""
    ids = [e.new for e in reversed(repo.refs.reflog("refs/heads/main"))]
    return [repo.read_commit(ids[0]), repo.read_commit(ids[1])]
