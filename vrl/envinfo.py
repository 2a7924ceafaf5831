"""The environment context recorded with every commit (never any secret)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import vrl

# Variables worth recording: they change how training behaves or where it runs.
_KEEP_PREFIXES = ("CUDA_", "NVIDIA_", "ASCEND_", "HCCL_", "NCCL_", "OMP_", "MKL_", "PYTORCH_",
                  "TORCH_", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                  "MASTER_PORT", "DEVICE_ID", "PYTHONHASHSEED", "CUBLAS_")
# A name is credential-like if it contains one of these (any case, anywhere: AWS_SECRET_...,
# my_token, DB_PASSWORD, TORCH_HUB_TOKEN) ...
_SECRET = re.compile(r"KEY|SECRET|TOKEN|PASS|PWD|CRED|AUTH|SESSION|COOKIE|PRIVATE|SIGNATURE|"
                     r"CERT|CONN|BEARER|JWT|OAUTH|SALT|DSN|WEBHOOK", re.IGNORECASE)
# ... or one of these short words as a whole component (GITHUB_PAT, NCCL_PW, AZURE_SAS, but
# not PATH or COMPATIBILITY)
_SECRET_WORDS = {"pat", "pw", "sas", "sig", "api", "otp", "pin", "hmac", "totp"}
# A value is credential-like if it holds a URL with a password, a private key, or a token in
# a well-known format (AWS access key ids, GitHub, GitLab, Slack, Hugging Face, JWTs).
_SECRET_VALUE = re.compile(
    r"://[^/\s:@]*:[^\s@]*@|-----BEGIN|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b|\bgh[pousr]_\w{20,}|"
    r"github_pat_\w{20,}|\bglpat-[\w-]{20,}|\bxox[abposr]-[\w-]{10,}|\bhf_\w{20,}|"
    r"\beyJ[\w-]{10,}\.eyJ[\w-]{10,}")


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name suggests it holds a credential."""
    words = re.split(r"[^0-9a-z]+", name.lower())
    return bool(_SECRET.search(name)) or any(w in _SECRET_WORDS for w in words)


def is_secret_value(value: str) -> bool:
    """Whether a value looks like a credential whatever its variable is called."""
    return bool(_SECRET_VALUE.search(value))


def safe_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Training-relevant environment variables, with anything credential-like removed."""
    environ = dict(os.environ) if environ is None else environ
    return {k: v for k, v in sorted(environ.items())
            if k.startswith(_KEEP_PREFIXES) and not is_secret_name(k)
            and not is_secret_value(v)}


@lru_cache(maxsize=1)
def _static() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages_digest": _packages_digest(),
        # the running code's version (not importlib.metadata's: importing it costs a
        # command ~15-35 ms, and it names the installed copy, not the one running)
        "vrl": vrl.__version__,
    }
    return info


def _packages_digest() -> str:
    """A short hash of every installed distribution and version (spots silent upgrades).

    Read from the names of the `*.dist-info` / `*.egg-info` folders on sys.path, which
    carry name and version: parsing every package's metadata cost ~0.15-0.25 s a commit.
    """
    names: set[str] = set()
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as found:
                # a versionless `NAME.egg-info` is a source tree's build metadata (left by
                # `pip install -e .`), seen only when the process runs from that tree: the
                # install itself is in site-packages, so it would make the digest depend on
                # the working directory (and the committer process runs elsewhere)
                names.update(e.name.lower() for e in found
                             if e.name.endswith(".dist-info")
                             or (e.name.endswith(".egg-info") and "-" in e.name[:-9]))
        except OSError:  # a zip file or a folder that is gone
            continue
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _accelerator() -> dict[str, Any]:
    torch = sys.modules.get("torch")  # only describe torch when the caller already uses it
    if torch is None:
        return {}
    info: dict[str, Any] = {"torch": torch.__version__, "device": "cpu"}
    if torch.version.cuda:
        info["cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
    if "torch_npu" in sys.modules or importlib.util.find_spec("torch_npu") is not None:
        try:
            import torch_npu  # type: ignore[import-not-found]

            info["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
            info["cann"] = os.environ.get("ASCEND_TOOLKIT_HOME", "")
            if torch.npu.is_available():  # type: ignore[attr-defined]
                info["device"] = torch.npu.get_device_name(0)  # type: ignore[attr-defined]
        except Exception as exc:  # a broken NPU stack must not stop a commit
            info["torch_npu_error"] = type(exc).__name__
    return info


def _git(path: Path, *args: str) -> bytes | None:
    """stdout of `git -C path ARGS` (None when git fails or is not installed)."""
    try:
        done = subprocess.run(["git", "-C", str(path), *args], capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version(path: Path) -> dict[str, Any]:
    """The user's code version from the Git repository around `path`, if any.

    Asks the `git` command directly: importing GitPython cost ~0.1 s of CPU a commit (and
    of a Snapshotter's start, inside the training loop), more than the git calls."""
    top = _git(path, "rev-parse", "--show-toplevel")
    if top is None:
        return {}
    info: dict[str, Any] = {"root": os.fsdecode(top.rstrip(b"\n"))}
    head = _git(path, "rev-parse", "-q", "--verify", "HEAD^{commit}")
    info["commit"] = head.decode().strip() if head else None
    branch = _git(path, "symbolic-ref", "-q", "--short", "HEAD")
    info["branch"] = branch.decode(errors="replace").strip() if branch else None
    diff = _git(path, "diff", "HEAD") if info["commit"] else b""
    untracked = _git(path, "ls-files", "--others", "--exclude-standard", "-z", "--",
                     ":/")
    if diff is None or untracked is None:
        return {**info, "error": "GitCommandError"}
    diff = diff[:-1] if diff.endswith(b"\n") else diff  # as GitPython gave it (same hash)
    info["dirty"] = bool(diff) or bool(untracked)
    if diff:
        info["diff_sha256"] = hashlib.sha256(diff).hexdigest()
    return info


def process_info() -> dict[str, Any]:
    """The part of `capture` only the calling process knows (its torch build, device,
    seed and environment variables); a helper process started by it (the Snapshotter's
    committer, same interpreter and working tree, its own thread-pool settings) captures
    the rest with `capture(..., process=this)`."""
    info = _accelerator()
    torch = sys.modules.get("torch")
    if torch is not None:
        info["seeds"] = {"torch_initial_seed": torch.initial_seed()}
    info["env"] = safe_environ()
    return info


def capture(workdir: Path, seeds: dict[str, Any] | None = None,
            process: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything worth knowing about where and how a snapshot was made (`process`: what
    `process_info()` returned in the process that made it, if that was another one)."""
    info = dict(_static())
    info.update(process_info() if process is None else process)
    code = code_version(workdir)
    if code:
        info["code"] = code
    if seeds:
        info["seeds"] = seeds
    return info
