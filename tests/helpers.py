"""Shared test helpers: bit-exact comparison of nested checkpoints, the commands of the
benchmark pipeline, commands added to vrl's CLI."""

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def assert_same(a: Any, b: Any, path: str = "") -> None:
    """Bit-exact equality of nested structures (NaNs and -0.0 included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert raw(a) == raw(b), path
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a.keys()) == list(b.keys()), path
        for k in a:
            assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}/{i}")
    elif isinstance(a, float) and a != a:
        assert isinstance(b, float) and b != b, path
    else:
        assert type(a) is type(b) and a == b, f"{path}: {a!r} != {b!r}"


def small_policy(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def vrl(capsys, *args):
    """Run the CLI in-process; return (exit code, stdout, stderr)."""
    from vrl.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def edit_object(repo: Any, oid: str, edit: Any) -> None:
    """Apply `edit(bytearray)` (same length) to an object's stored bytes (64-byte header +
    payload), wherever it is kept: its loose file or its pack."""
    import os

    path, offset, length = repo.objects.locate(oid)
    data = bytearray(path.read_bytes())
    obj = bytearray(data[offset:offset + length])
    edit(obj)
    assert len(obj) == length
    data[offset:offset + length] = obj
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


def remove_object(repo: Any, oid: str) -> None:
    """Lose an object (loose or packed), as a damaged disk would."""
    assert repo.objects.delete_many([oid])[0] == 1


def before_ref_moves(repo: Any, action: Any) -> None:
    """Run `action()` each time `repo` is about to move a ref for a commit (its
    compare-and-swap): through the commit journal, or through `refs.update` without it."""
    target, name = (repo.journal, "commit") if repo._journaled else (repo.refs, "update")
    real = getattr(target, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        action()
        return real(*args, **kwargs)

    setattr(target, name, wrapped)


def start_process(ctx: Any, target: Any, *args: Any) -> tuple[Any, Any]:
    """Start `target(*args, conn)` in a process of `ctx`; (process, the reading end)."""
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    child.close()
    return proc, parent


def process_results(proc: Any, conn: Any, timeout: float) -> list:
    """Everything a process of `start_process` sent, once it has exited cleanly."""
    out = []
    deadline = time.monotonic() + timeout
    while True:
        assert conn.poll(max(0.0, deadline - time.monotonic())), "process hung"
        try:
            out.append(conn.recv())
        except EOFError:
            break
    proc.join(timeout)
    assert proc.exitcode == 0, f"{proc.name} exited with {proc.exitcode}"
    return out


def dvc_stage_argv(stage: str) -> list[str]:
    """The command `dvc repro STAGE` runs (dvc.yaml's, with params.yaml substituted): every
    ${...} must resolve."""
    import re
    import shlex
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())
    cmd = yaml.safe_load((root / "dvc.yaml").read_text())["stages"][stage]["cmd"]

    def value(match: re.Match) -> str:
        section, key = match.group(1).split(".")
        return str(params[section][key])

    argv = shlex.split(re.sub(r"\$\{([\w.]+)\}", value, cmd))
    assert "${" not in " ".join(argv), argv
    return argv


@contextlib.contextmanager
def commands_added(*commands: Any) -> Iterator[None]:
    """`commands` on vrl's CLI meanwhile (their entry points may not be installed yet: an
    editable install lists entry points as they were at install time)."""
    from vrl.cli import cli

    added = [c.name for c in commands if c.name not in cli.commands]
    for command in commands:
        cli.add_command(command)
    try:
        yield
    finally:
        for name in added:
            cli.commands.pop(name, None)
