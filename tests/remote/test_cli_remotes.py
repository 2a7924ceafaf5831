"""`vrl remote`, `push`, `fetch`, `pull`, `clone`: exact output and exit codes."""

import subprocess
import sys
import time

import torch
from helpers import vrl

from vrl import Repo
from vrl.workspace import write_checkpoint


def policy(bump: float = 0.0) -> None:
    torch.manual_seed(0)
    sd = torch.nn.Linear(4, 3).state_dict()
    sd["bias"] = sd["bias"] + bump
    write_checkpoint(sd, "policy.safetensors")


def test_remote_add_list_rename_remove(ws, capsys):
    vrl(capsys, "init")
    code, out, _ = vrl(capsys, "remote", "add", "origin", str(ws / "r.vrl"))
    assert (code, out) == (0, f"Added remote origin -> {ws / 'r.vrl'}\n")
    code, out, _ = vrl(capsys, "remote", "add", "store", "s3://bucket/team", "-o",
                       "endpoint_url=http://127.0.0.1:9000", "-o", "profile=lab")
    assert code == 0
    code, out, _ = vrl(capsys, "remote", "list")
    assert out == "origin\nstore\n"
    code, out, _ = vrl(capsys, "remote", "list", "-v")
    assert out == (f"origin\t{ws / 'r.vrl'}\n"
                   "store\ts3://bucket/team\tendpoint_url=http://127.0.0.1:9000 profile=lab\n")
    code, out, _ = vrl(capsys, "remote", "rename", "store", "s3")
    assert (code, out) == (0, "Renamed remote store to s3\n")
    code, out, _ = vrl(capsys, "remote", "remove", "s3")
    assert (code, out) == (0, "Removed remote s3\n")
    code, out, err = vrl(capsys, "remote", "remove", "s3")
    assert code == 1 and err.startswith("error: unknown remote 's3' (known: origin)")
    code, out, err = vrl(capsys, "remote", "add", "x", "ssh://me:pw@host/x")
    assert code == 1 and "pw" not in err and "ssh://me:***@host/x" in err
    assert "pw" not in (ws / ".vrl" / "config").read_text()


def test_remote_add_from_dvc(ws, capsys):
    vrl(capsys, "init")
    (ws / ".dvc").mkdir()
    (ws / ".dvc" / "config").write_text(
        "[core]\n    remote = storage\n"
        "['remote \"storage\"']\n    url = s3://dvc-bucket/cache\n"
        "    endpointurl = http://127.0.0.1:9000\n"
        "['remote \"other\"']\n    url = /mnt/nfs/dvc\n")
    (ws / ".dvc" / "config.local").write_text(
        "['remote \"storage\"']\n    secret_access_key = SHOULD-NOT-APPEAR\n")
    code, out, err = vrl(capsys, "remote", "add", "origin", "--from-dvc")
    assert (code, out) == (0, "Added remote origin -> s3://dvc-bucket/cache/vrl\n"), err
    code, out, _ = vrl(capsys, "remote", "add", "nfs", "--from-dvc", "--dvc-remote", "other")
    assert out == "Added remote nfs -> /mnt/nfs/dvc/vrl\n"
    config = (ws / ".vrl" / "config").read_text()
    assert "endpoint_url = http://127.0.0.1:9000" in config
    assert "SHOULD-NOT-APPEAR" not in config


def test_push_clone_pull_session(ws, capsys):
    (ws / "a").mkdir()
    import os

    os.chdir(ws / "a")
    vrl(capsys, "init")
    policy()
    vrl(capsys, "commit", "-m", "first", "--no-env")
    remote = ws / "shared.vrl"
    vrl(capsys, "remote", "add", "origin", str(remote))
    code, out, err = vrl(capsys, "push", "-q", "--create")
    head = Repo(".").head()
    assert (code, out) == (0, f"origin/main: ------------ -> {head[:12]} (new)\n"), err
    code, out, _ = vrl(capsys, "push")
    assert out == f"origin/main: up to date ({head[:12]})\n"
    os.chdir(ws)
    code, out, err = vrl(capsys, "clone", str(remote), "b", "-q")
    assert code == 0, err
    assert out == (f"Cloned {remote} into {ws / 'b'}\nOn branch main at {head[:12]}\n")
    assert (ws / "b" / "policy.safetensors").exists()
    code, out, _ = vrl(capsys, "clone", str(remote), "lazy", "--metadata-only")
    assert out.startswith(f"Cloned {remote} into {ws / 'lazy'} (metadata only)\n")
    assert not (ws / "lazy" / "policy.safetensors").exists()
    # a new commit upstream, then pull in the clone
    os.chdir(ws / "a")
    policy(bump=1.0)
    vrl(capsys, "commit", "-m", "second", "--no-env")
    second = Repo(".").head()
    code, out, _ = vrl(capsys, "push")
    assert out.startswith(f"origin/main: {head[:12]} -> {second[:12]} (fast-forward)\n"
                          "Sent 1 tensor, 1 manifest, 1 commit (")
    os.chdir(ws / "b")
    code, out, err = vrl(capsys, "pull", "-q")
    assert (code, out) == (0, f"main: {head[:12]} -> {second[:12]} (fast-forward)\n"
                              "Wrote policy.safetensors\n"), err
    code, out, _ = vrl(capsys, "status")
    assert "no changes since HEAD" in out
    # the lazy clone: log works without tensors; checkout downloads them
    os.chdir(ws / "lazy")
    code, out, _ = vrl(capsys, "fetch", "-q")
    assert out == f"origin/main: {head[:12]} -> {second[:12]} (fast-forward)\n"
    code, out, _ = vrl(capsys, "log", "--oneline", "origin/main")
    assert code == 0 and "second" in out and "first" in out
    code, out, err = vrl(capsys, "checkout", "origin/main")
    assert code == 0, err
    assert Repo(".").fsck()["ok"]


def test_push_refused_when_diverged(ws, capsys):
    import os

    (ws / "a").mkdir()
    os.chdir(ws / "a")
    vrl(capsys, "init")
    policy()
    vrl(capsys, "commit", "-m", "first", "--no-env")
    vrl(capsys, "remote", "add", "origin", str(ws / "r.vrl"), "--create")
    vrl(capsys, "push")
    os.chdir(ws)
    vrl(capsys, "clone", str(ws / "r.vrl"), "b")
    os.chdir(ws / "b")
    policy(bump=2.0)
    vrl(capsys, "commit", "-m", "theirs", "--no-env")
    vrl(capsys, "push")
    theirs = Repo(".").head()
    os.chdir(ws / "a")
    policy(bump=3.0)
    vrl(capsys, "commit", "-m", "ours", "--no-env")
    ours = Repo(".").head()
    code, out, err = vrl(capsys, "push")
    assert code == 1 and err.count("\n") == 1
    assert err.startswith("error: push to origin/main rejected (not a fast-forward): origin is "
                          f"at {theirs[:12]}, your main is at {ours[:12]}")
    code, out, err = vrl(capsys, "pull")
    assert code == 1 and "have diverged" in err and "vrl reset --hard origin/main" in err
    code, out, _ = vrl(capsys, "push", "--force")
    assert code == 0 and "(forced)" in out


def test_remote_list_does_not_import_torch(ws, capsys):
    vrl(capsys, "init")
    vrl(capsys, "remote", "add", "origin", str(ws / "r"))
    code = ("import sys; from vrl.cli import main; main(['remote', 'list']); "
            "assert 'torch' not in sys.modules and 's3fs' not in sys.modules")
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ws, capture_output=True)
    assert time.monotonic() - start < 5
