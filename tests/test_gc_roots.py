"""What gc must keep besides branches and HEAD: a snapshot only a tag reaches (once every
reflog is expired: the tag is then its only root), and snapshots only a reflog reaches
(a branch reset away from them, a tag moved on). Each is checked by loading the snapshot
bit-exactly after `gc --now`, and by showing it goes once its last root does (so the root
was what kept it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vrl import Repo
from vrl.cli import main
from vrl.errors import VrlError


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"policy.weight": rng.standard_normal((32, 16)).astype(np.float32),
            "policy.bias": rng.standard_normal(32).astype(np.float32),
            "step": np.array([seed], dtype=np.int64)}


def vrl(path: Path, capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-C", str(path), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_snapshot(path: Path, oid: str, want: dict[str, np.ndarray]) -> None:
    repo = Repo(path, verify=True)  # (every byte read is hashed against its id)
    got = repo.load(oid)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert np.asarray(got[name]).tobytes() == value.tobytes(), name
    report = repo.fsck()
    assert report["ok"], report["problems"]


def objects_of(path: Path, oid: str) -> set[str]:
    repo = Repo(path)
    manifest = repo.read_commit(oid).manifest
    return {oid, manifest, *(e.id for e in repo.read_manifest(manifest).tensors.values())}


# ------------------------------------------------------------------ a tag is a root


def test_gc_keeps_a_snapshot_only_a_tag_reaches_once_reflogs_expire(tmp_path):
    path = tmp_path / "repo"
    repo = Repo.init(path)
    repo.commit(weights(0), env=False, message="base")
    best = repo.commit(weights(1), env=False, ref="refs/heads/exp", message="best run")
    repo.tag("best", "exp")
    repo.delete_branch("exp")  # (its reflog goes with it)
    repo.commit(weights(2), env=False, message="main moves on")
    mine = objects_of(path, best)
    repo.gc(grace=0, expire_reflog=True)  # no reflog left: only the tag reaches `best`
    assert not [e for n in repo.refs.all_logs() for e in repo.refs.reflog(n)]
    assert mine <= set(Repo(path).objects.ids())
    assert_snapshot(path, best, weights(1))
    assert Repo(path).resolve("best") == best

    repo.delete_tag("best")
    repo.gc(grace=0, expire_reflog=True)
    assert not mine & set(Repo(path).objects.ids())  # the tag was what kept it


def test_cli_gc_now_keeps_a_tagged_snapshot_after_reset_and_expired_reflogs(tmp_path,
                                                                             capsys):
    path = tmp_path / "repo"
    assert vrl(tmp_path, capsys, "init", str(path))[0] == 0

    def commit(i: int) -> str:
        save_file(weights(i), tmp_path / f"s{i}.safetensors")
        assert vrl(path, capsys, "commit", str(tmp_path / f"s{i}.safetensors"), "-m",
                   f"s{i}", "--no-env")[0] == 0
        return Repo(path).resolve("HEAD")

    commit(0)
    tagged = commit(1)
    assert vrl(path, capsys, "tag", "best")[0] == 0
    assert vrl(path, capsys, "reset", "--hard", "HEAD~1")[0] == 0
    commit(2)  # main: s0 -> s2; s1 is on no branch
    code, out, _ = vrl(path, capsys, "gc", "--now", "--expire-reflog")
    assert code == 0 and out.startswith("Removed 0 unreachable objects")
    assert vrl(path, capsys, "export", "best", str(tmp_path / "best.safetensors"))[0] == 0
    got = load_file(tmp_path / "best.safetensors")
    assert {k: v.tobytes() for k, v in got.items()} == \
        {k: v.tobytes() for k, v in weights(1).items()}
    code, out, _ = vrl(path, capsys, "fsck")
    assert code == 0, out
    assert vrl(path, capsys, "log", "best", "--oneline")[1].count("\n") == 2

    assert vrl(path, capsys, "tag", "-d", "best")[0] == 0
    code, out, _ = vrl(path, capsys, "gc", "--now", "--expire-reflog")
    assert code == 0 and not out.startswith("Removed 0 ")
    assert tagged not in set(Repo(path).objects.ids())  # the tag was what kept it


# ------------------------------------------------------------------ a reflog is a root


def test_cli_gc_now_keeps_what_only_the_reflog_reaches(tmp_path, capsys):
    """`vrl reset --hard` can be undone after `vrl gc --now`: the reflog keeps the commit
    it moved away from (until `--expire-reflog`)."""
    path = tmp_path / "repo"
    assert vrl(tmp_path, capsys, "init", str(path))[0] == 0
    ids = []
    for i in range(2):
        save_file(weights(10 + i), tmp_path / f"s{i}.safetensors")
        assert vrl(path, capsys, "commit", str(tmp_path / f"s{i}.safetensors"),
                   "-m", f"s{i}", "--no-env")[0] == 0
        ids.append(Repo(path).resolve("HEAD"))
    assert vrl(path, capsys, "reset", "--hard", ids[0])[0] == 0
    code, out, _ = vrl(path, capsys, "gc", "--now")
    assert code == 0 and out.startswith("Removed 0 unreachable objects")
    assert_snapshot(path, ids[1], weights(11))
    assert vrl(path, capsys, "reset", "--hard", ids[1])[0] == 0  # undone
    assert Repo(path).resolve("main") == ids[1]

    assert vrl(path, capsys, "reset", "--hard", ids[0])[0] == 0
    code, out, _ = vrl(path, capsys, "gc", "--now", "--expire-reflog")
    assert code == 0 and not out.startswith("Removed 0 ")
    assert ids[1] not in set(Repo(path).objects.ids())  # the reflog was what kept it


def test_gc_keeps_a_snapshot_a_moved_tags_reflog_names(tmp_path):
    """A tag moved on with --force: its old target, on no branch, stays while the tag's
    reflog names it."""
    path = tmp_path / "repo"
    repo = Repo.init(path)
    repo.commit(weights(20), env=False, message="base")
    old = repo.commit(weights(21), env=False, ref="refs/heads/trial", message="trial 1")
    repo.tag("best", old)
    repo.delete_branch("trial")
    new = repo.commit(weights(22), env=False, message="better")
    repo.tag("best", new, force=True)
    mine = objects_of(path, old) - objects_of(path, new)
    assert repo.gc(grace=0)[0] == 0
    assert mine <= set(Repo(path).objects.ids())
    assert_snapshot(path, old, weights(21))

    repo.gc(grace=0, expire_reflog=True)
    assert not mine & set(Repo(path).objects.ids())


@pytest.mark.parametrize("grace", [-5.0, float("nan")])
def test_gc_refuses_a_grace_that_is_not_a_duration(tmp_path, grace):
    """A negative (or NaN) grace would make every young object look old: refused before
    anything is looked at, in one line, and nothing is deleted."""
    repo = Repo.init(tmp_path)
    repo.commit({"w": np.ones(4, np.float32)}, env=False)
    repo.commit({"w": np.zeros(4, np.float32)}, env=False)
    repo.reset("HEAD~1")
    before = sorted(p.name for p in (repo.vrl_dir / "objects").rglob("*"))
    with pytest.raises(VrlError, match="gc grace must be 0 or more seconds") as err:
        repo.gc(grace=grace, expire_reflog=True)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in (repo.vrl_dir / "objects").rglob("*")) == before
