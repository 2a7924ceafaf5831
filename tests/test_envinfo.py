"""The environment context recorded with each commit never holds a credential."""

from __future__ import annotations

import pytest

from vrl import envinfo
from vrl.objects import canonical_json

SECRET = "s3cr3t-VALUE-0123456789abcdef"

# credential-like names: kept prefixes with a secret inside, lower case, prefixed, suffixed
SECRET_NAMES = [
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "my_token", "DB_PASSWORD", "GITHUB_PAT",
    "TORCH_HUB_TOKEN", "CUDA_API_KEY", "NCCL_PASSWORD", "PYTORCH_S3_SECRET", "TORCH_PAT",
    "torch_token", "NCCL_PW", "OMP_PASSPHRASE", "HCCL_AUTH", "CUDA_CREDENTIALS",
    "TORCH_PRIVATE_KEY", "MKL_CERT_FILE", "RANK_JWT", "TORCH_DB_PASS", "NVIDIA_API",
    "CUDA_SAS", "PYTORCH_OAUTH", "CUBLAS_COOKIE", "TORCH_CONNECTION_STRING",
]
# training-relevant names that are kept
KEPT_NAMES = ["CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "NCCL_DEBUG", "RANK", "WORLD_SIZE",
              "PYTORCH_CUDA_ALLOC_CONF", "TORCH_COMPILE_DEBUG", "MASTER_PORT"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_credential_like_names_are_dropped(name):
    assert envinfo.is_secret_name(name)
    assert envinfo.safe_environ({name: SECRET, "OMP_NUM_THREADS": "2"}) == \
        {"OMP_NUM_THREADS": "2"}


@pytest.mark.parametrize("name", KEPT_NAMES + ["PATH_COMPATIBILITY", "CUDA_PATH"])
def test_ordinary_names_are_not_secret(name):
    assert not envinfo.is_secret_name(name)


def test_training_variables_are_kept_and_others_ignored():
    env = {n: "1" for n in KEPT_NAMES} | {"HOME": "/root", "USER": "me", "PATH": "/bin"}
    assert envinfo.safe_environ(env) == {n: "1" for n in sorted(KEPT_NAMES)}


@pytest.mark.parametrize("value", [
    "s3://AKIA:wJal/rXUtnFEMI@bucket/p",         # a URL with a password (with a /)
    "https://user:hunter2@example.com/x",
    "AKIAIOSFODNN7EXAMPLE",                      # AWS access key id
    "ghp_" + "a" * 36, "github_pat_" + "b" * 40,  # GitHub tokens
    "hf_" + "c" * 34, "glpat-" + "d" * 20, "xoxb-123456789012-abc",
    "-----BEGIN RSA PRIVATE KEY-----",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",  # a JWT
])
def test_credential_like_values_are_dropped_whatever_the_name(value):
    assert envinfo.safe_environ({"TORCH_HOME": value, "CUDA_VISIBLE_DEVICES": "0"}) == \
        {"CUDA_VISIBLE_DEVICES": "0"}


def test_ordinary_values_are_kept():
    env = {"TORCH_HOME": "/data/torch", "NCCL_SOCKET_IFNAME": "eth0",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
           "TORCH_HUB_URL": "https://example.com:8080/hub"}
    assert envinfo.safe_environ(env) == env


def test_nothing_credential_like_leaks_into_a_commit(tmp_path, monkeypatch):
    for i, name in enumerate(SECRET_NAMES):
        monkeypatch.setenv(name, f"{SECRET}-{i}")
    monkeypatch.setenv("TORCH_HOME", f"s3://AKIA:{SECRET}/x@bucket")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    from vrl import Repo

    repo = Repo.init(tmp_path / "r")
    import torch

    cid = repo.commit({"w": torch.ones(2)}, message="m")
    raw = repo.objects.read(cid)[1]
    assert SECRET.encode() not in raw
    env = repo.read_commit(cid).env
    assert env["env"]["OMP_NUM_THREADS"] == "3"
    assert SECRET not in canonical_json(env).decode()


def test_packages_digest_follows_installed_versions(tmp_path, monkeypatch):
    """A package installed or upgraded (a new `*.dist-info` on sys.path) changes it."""
    from vrl.envinfo import _packages_digest

    monkeypatch.syspath_prepend(str(tmp_path))
    before = _packages_digest()
    (tmp_path / "somepkg-1.0.dist-info").mkdir()
    one = _packages_digest()
    (tmp_path / "somepkg-1.0.dist-info").rename(tmp_path / "somepkg-1.1.dist-info")
    assert len({before, one, _packages_digest()}) == 3


def _gitpython_code_version(path):
    """What code_version recorded when it used GitPython (the reference)."""
    import hashlib

    import git

    try:
        repo = git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return {}
    info = {"root": str(repo.working_tree_dir)}
    info["commit"] = repo.head.commit.hexsha if repo.head.is_valid() else None
    info["branch"] = None if repo.head.is_detached else repo.active_branch.name
    diff = repo.git.diff("HEAD") if info["commit"] else ""
    info["dirty"] = bool(diff) or bool(repo.untracked_files)
    if diff:
        info["diff_sha256"] = hashlib.sha256(diff.encode()).hexdigest()
    return info


def test_code_version_matches_what_gitpython_recorded(tmp_path, monkeypatch):
    """The code version comes from `git` directly (no GitPython import, ~0.1 s of CPU),
    field for field what GitPython gave: outside a repository, an unborn branch with
    untracked files, clean, edited, untracked only, detached, from a subdirectory."""
    import shutil
    import subprocess

    pytest.importorskip("git")
    if shutil.which("git") is None:
        pytest.skip("no git command")
    from vrl.envinfo import code_version

    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)

    def run(*args):
        subprocess.run(["git", "-C", str(work), *args], check=True, capture_output=True)

    def same(where=work):
        got = code_version(where)
        assert got == _gitpython_code_version(where)
        return got

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert same() == {}
    run("init", "-q", "-b", "trunk")
    run("config", "user.email", "t@example.com")
    run("config", "user.name", "t")
    (work / "train.py").write_text("lr = 3e-4\n")
    assert same()["dirty"] is True and same()["commit"] is None  # unborn, untracked
    run("add", "train.py")
    run("commit", "-q", "-m", "one")
    clean = same()
    assert clean["branch"] == "trunk" and clean["dirty"] is False and len(clean["commit"]) == 40
    (work / "train.py").write_text("lr = 1e-3\n")
    edited = same(work / "sub")  # from a subdirectory too
    assert edited["dirty"] and edited["diff_sha256"]
    run("checkout", "-q", "train.py")
    (work / "notes.txt").write_text("x\n")
    assert same()["dirty"] is True and "diff_sha256" not in same()
    run("checkout", "-q", "--detach")
    assert same()["branch"] is None
    # and GitPython is never imported (its import alone was most of a commit's capture)
    import sys

    probe = ("import sys; from vrl.envinfo import capture; from pathlib import Path; "
             f"capture(Path({str(work)!r})); assert 'git' not in sys.modules")
    subprocess.run([sys.executable, "-c", probe], check=True)


def test_packages_digest_ignores_a_source_trees_build_metadata(tmp_path, monkeypatch):
    """`pip install -e .` leaves `NAME.egg-info` in the source tree; running from there
    (the tree on sys.path) must not change the digest - the committer process runs
    elsewhere and records the same environment as the training process."""
    from vrl.envinfo import _packages_digest

    monkeypatch.syspath_prepend(str(tmp_path))
    before = _packages_digest()
    (tmp_path / "vrl.egg-info").mkdir()
    assert _packages_digest() == before
    (tmp_path / "oldpkg-0.3-py3.10.egg-info").mkdir()  # an installed egg carries a version
    assert _packages_digest() != before


def test_the_running_vrl_version_is_recorded_and_is_the_installed_one(tmp_path):
    """A commit records the version of the code that made it, which the package metadata
    reads from the same place (pyproject's version is vrl.__version__)."""
    import importlib.metadata

    import vrl

    info = envinfo.capture(tmp_path)
    assert info["vrl"] == vrl.__version__ == importlib.metadata.version("vrl")
