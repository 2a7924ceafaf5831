"""docs/loops.md's CleanRL-style recipe: its PPO script, as the page shows it, resumes
from a snapshot bit for bit, without moving HEAD."""

import pytest
import torch
from docblocks import ROOT, blocks

import vrl


@pytest.fixture(scope="module")
def ppo():
    """The recipe's script (the first Python block of its section), loaded as a module."""
    recipe = [b for b in blocks(ROOT / "docs" / "loops.md")
              if b.lang == "python" and b.section == "## CleanRL-style loops"][0]
    added = [line for line in recipe.code.splitlines() if line.endswith("# vrl")
             or "# vrl:" in line]
    assert len(added) == 9  # what the page says it adds
    namespace = {"__name__": "ppo_corridor"}
    exec(compile("\n" * (recipe.line - 1) + recipe.code, str(recipe.path), "exec"),
         namespace)
    return namespace


def run(ppo, path, iterations, resume=None):
    vrl.Repo.init(path)
    return ppo["main"](ppo["Args"](iterations=iterations, repo=str(path), resume=resume))


def same(a, b):
    return all(torch.equal(x, b.state_dict()[k]) for k, x in a.state_dict().items())


def tensors(repo, rev):
    manifest = repo.read_manifest(repo.read_commit(repo.resolve(rev)).manifest)
    return {name: entry.id for name, entry in manifest.tensors.items()}


def test_resume_gives_the_straight_runs_snapshots_bit_for_bit(ppo, tmp_path):
    straight = run(ppo, tmp_path / "a", 6)
    first = run(ppo, tmp_path / "b", 3)
    assert not same(first, straight)
    repo = vrl.Repo(tmp_path / "b")
    head = repo.head()
    resumed = run(ppo, tmp_path / "b", 6, resume="HEAD")
    assert same(resumed, straight)
    a = vrl.Repo(tmp_path / "a")
    assert [e.commit.step for e in repo.log()] == [6, 5, 4, 3, 2, 1]
    assert repo.resolve("HEAD~3") == head  # the resumed run went on from there
    # model, optimizer, RNG and env of every later snapshot: the same objects
    for back in range(3):
        assert tensors(repo, f"HEAD~{back}") == tensors(a, f"HEAD~{back}")
    # from an older snapshot: loading it leaves HEAD (the branch) where it was, so the
    # resumed iterations 3-6 are committed on top of the branch's tip, not of HEAD~4
    tip = repo.head()
    assert same(run(ppo, tmp_path / "b", 6, resume="HEAD~4"), straight)
    assert [e.commit.step for e in repo.log(max_count=5)] == [6, 5, 4, 3, 6]
    assert repo.resolve("HEAD~4") == tip


def test_the_check_fails_without_the_rng(ppo, tmp_path, monkeypatch):
    """Can fail: without the RNG state the resumed run samples other actions."""
    import vrl.rng

    straight = run(ppo, tmp_path / "a", 4)
    run(ppo, tmp_path / "b", 2)
    monkeypatch.setattr(vrl.rng, "set_rng_state", lambda state: None)
    resumed = run(ppo, tmp_path / "b", 4, resume="HEAD")
    assert vrl.Repo(tmp_path / "b").log()[0].commit.step == 4
    assert not same(resumed, straight)
