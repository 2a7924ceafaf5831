"""The workspace stat cache (`.vrl/index`): a file is re-read unless its size, mtime,
ctime, inode and device are all as recorded. Size and mtime alone miss a change that keeps
both (`cp -p`, `rsync -t`, `tar`, `os.utime`): `status` then said clean and `checkout`
overwrote uncommitted weights without `--force`."""

import json
import os
import subprocess

import numpy as np
import pytest
from helpers import vrl
from safetensors.numpy import save, save_file

from vrl import Repo, workspace
from vrl.errors import WorkspaceError


def arrays(version: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(version)
    return {"actor.weight": rng.standard_normal((64, 32), np.float32),
            "actor.bias": np.full(64, version, np.float32)}


@pytest.fixture
def workspace_at_v1(ws, capsys):
    """`main` at v1, checked out (stat cache written by the checkout); `other` at v2."""
    vrl(capsys, "init")
    policy = ws / "policy.safetensors"
    save_file(arrays(2), str(policy))
    assert vrl(capsys, "commit", "-m", "v2", "--no-env")[0] == 0
    assert vrl(capsys, "checkout", "-b", "other")[0] == 0
    assert vrl(capsys, "checkout", "main")[0] == 0
    save_file(arrays(1), str(policy))
    assert vrl(capsys, "commit", "-m", "v1", "--no-env")[0] == 0
    assert vrl(capsys, "checkout", "other")[0] == 0
    assert vrl(capsys, "checkout", "main")[0] == 0  # written by vrl: the cache holds it
    return policy


def uncommitted() -> bytes:
    """v1 with one bias changed: a file of the same size, never committed."""
    changed = arrays(1)
    changed["actor.bias"][-1] = 123.0
    return save(changed)


def keep_size_and_mtime(policy, how: str) -> bytes:
    """Change the file's bytes `how` a user's tool would, keeping its size and mtime."""
    st = policy.stat()
    new = uncommitted()
    if how == "utime":  # written in place, then the time put back
        policy.write_bytes(new)
        os.utime(policy, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif how == "cp -p":  # copied over it (same inode) with the copy's time
        source = policy.with_name("elsewhere.safetensors")
        source.write_bytes(new)
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
        subprocess.run(["cp", "-p", str(source), str(policy)], check=True)
        assert policy.stat().st_ino == st.st_ino
    else:  # rsync -t, tar: a new file with the old time renamed into place
        tmp = policy.with_name(".policy.safetensors.rsync")
        tmp.write_bytes(new)
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(tmp, policy)
    after = policy.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    return new


HOWS = ["utime", "cp -p", "rename"]


@pytest.mark.parametrize("how", HOWS)
def test_a_change_keeping_size_and_mtime_is_seen_by_status_and_checkout(
        workspace_at_v1, capsys, how):
    policy = workspace_at_v1
    new = keep_size_and_mtime(policy, how)
    code, out, _ = vrl(capsys, "status")
    assert code == 0 and "modified since HEAD" in out
    code, _, err = vrl(capsys, "checkout", "other")
    assert code == 1 and "uncommitted changes" in err and "--force" in err
    assert policy.read_bytes() == new  # the uncommitted weights are still there
    assert Repo(".").current_branch() == "main"
    code, _, err = vrl(capsys, "checkout", "other", "--force")
    assert code == 0, err


@pytest.mark.parametrize("how", HOWS)
def test_the_library_sees_a_change_keeping_size_and_mtime(workspace_at_v1, how):
    policy = workspace_at_v1
    keep_size_and_mtime(policy, how)
    repo = Repo(".")
    status, diff = repo.workspace_status()
    assert status == "modified"
    assert [c.layer for c in diff.layers if c.status == "changed"] == ["actor"]
    with pytest.raises(WorkspaceError, match="uncommitted changes"):
        repo.ensure_clean_workspace()


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The workspace files read (hashed) to answer a status, from now on."""
    seen: list[str] = []
    real = workspace.open_checkpoint

    def spy(path):
        seen.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(workspace, "open_checkpoint", spy)
    return seen


def test_an_untouched_file_is_not_read_again(workspace_at_v1, capsys, reads):
    policy = workspace_at_v1
    for _ in range(2):
        code, out, _ = vrl(capsys, "status")
        assert "no changes since HEAD" in out
    assert reads == []  # the checkout recorded it
    # a change of ctime only (the same bytes, the time put back): read once, and the
    # cache then holds the file's new stat
    st = policy.stat()
    os.utime(policy, ns=(st.st_atime_ns, st.st_mtime_ns))
    for _ in range(3):
        assert "no changes since HEAD" in vrl(capsys, "status")[1]
    assert reads == [str(policy)]
    # a checkout writes the file and records it: no read for the next status either
    vrl(capsys, "checkout", "other")
    vrl(capsys, "status")
    assert reads == [str(policy)]


def test_a_commit_records_the_file_it_read(ws, capsys, reads):
    vrl(capsys, "init")
    save_file(arrays(1), str(ws / "policy.safetensors"))
    vrl(capsys, "commit", "-m", "v1", "--no-env")
    reads.clear()
    assert "no changes since HEAD" in vrl(capsys, "status")[1]
    assert reads == []


def test_a_file_changed_while_it_was_committed_is_read_again(ws, capsys, monkeypatch):
    """The commit records the stat from before it read the file: a write during the
    commit (after its bytes were hashed) is not covered by the cache."""
    vrl(capsys, "init")
    policy = ws / "policy.safetensors"
    save_file(arrays(1), str(policy))
    real = Repo.commit

    def commit_then_write(self, *args, **kwargs):
        cid = real(self, *args, **kwargs)
        keep_size_and_mtime(policy, "utime")  # a trainer saving mid-commit
        return cid

    with monkeypatch.context() as patch:
        patch.setattr(Repo, "commit", commit_then_write)
        assert vrl(capsys, "commit", "-m", "v1", "--no-env")[0] == 0
    assert "modified since HEAD" in vrl(capsys, "status")[1]
    assert Repo(ws).workspace_status()[0] == "modified"


def test_a_cache_from_an_older_vrl_is_read_again_then_replaced(workspace_at_v1, capsys,
                                                                reads):
    """An index written before ctime, inode and device were recorded (size and mtime
    only) is not trusted: the file is hashed once, then the index is rewritten."""
    policy = workspace_at_v1
    index = policy.parent / ".vrl" / "index"
    entry = json.loads(index.read_text())
    old = {k: entry[k] for k in ("path", "size", "mtime_ns", "boot", "manifest")}
    keep_size_and_mtime(policy, "utime")
    index.write_text(json.dumps(old))  # what the old version trusted: say "clean"
    assert "modified since HEAD" in vrl(capsys, "status")[1]
    assert reads and json.loads(index.read_text()) == old  # (modified: not recorded)
    reads.clear()
    # the committed bytes back: read once more, then recorded in the new format
    save_file(arrays(1), str(policy))
    assert "no changes since HEAD" in vrl(capsys, "status")[1]
    assert reads == [str(policy)]
    assert "no changes since HEAD" in vrl(capsys, "status")[1]
    assert reads == [str(policy)]
    recorded = json.loads(index.read_text())
    st = policy.stat()
    assert (recorded["ino"], recorded["ctime_ns"], recorded["dev"]) == \
        (st.st_ino, st.st_ctime_ns, st.st_dev)
