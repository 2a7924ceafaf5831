"""`vrl-demo`: a two-minute tour of the store on a tiny policy (no trainer needed).

Creates ./vrl-demo (or DIR; an existing directory must be empty: nothing is ever deleted),
trains a small policy a few steps on synthetic data, commits twice with the real losses,
shows the log and the layer diff, rolls back in one command, and checks the repository.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click


def run(*args: str) -> None:
    from vrl.cli import main

    click.echo(click.style(f"$ vrl {shlex.join(args)}", bold=True))
    code = main(list(args))
    if code:
        raise SystemExit(code)


def policy_step(steps: int, seed: int = 0) -> float:
    """Train a tiny actor-critic MLP for a few steps and save it as the workspace file;
    return the last training loss."""
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    model = torch.nn.ModuleDict({
        "actor": torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(),
                                     torch.nn.Linear(64, 5)),
        "critic": torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(),
                                      torch.nn.Linear(64, 1)),
    })
    path = Path("policy.safetensors")
    if path.exists():
        model.load_state_dict(load_file(path))
    opt = torch.optim.Adam(model["actor"].parameters(), lr=3e-3)  # only the actor learns
    for _ in range(steps):
        obs = torch.randn(256, 8)
        loss = torch.nn.functional.cross_entropy(model["actor"](obs), obs[:, :5].argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_file(model.state_dict(), str(path))
    click.echo(f"(trained {steps} steps: loss {loss.item():.3f}, saved {path})")
    return loss.item()


def prepare(directory: str) -> Path:
    """The demo's directory: created, or an existing empty one. Never deletes anything."""
    root = Path(directory).resolve()
    if root.exists() and not root.is_dir():
        raise click.ClickException(f"{root} exists and is not a directory; choose another "
                                   "DIRECTORY")
    if root.is_dir() and any(root.iterdir()):
        raise click.ClickException(f"{root} is not empty; the demo runs only in a new or "
                                   "empty directory (it never deletes files): choose another "
                                   "DIRECTORY or empty this one")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.ClickException(f"cannot create {root}: {exc.strerror or exc}") from exc
    return root


@click.command()
@click.argument("directory", default="vrl-demo")
def main(directory: str) -> None:
    """Run the store demo in DIRECTORY (created; an existing one must be empty)."""
    root = prepare(directory)
    os.chdir(root)
    run("init")
    loss = policy_step(20)
    run("commit", "-m", "policy after 20 steps", "--step", "20", "--set", "lr=0.003",
        "--metric", f"loss={loss!r}")
    loss = policy_step(200)
    run("status")
    run("commit", "-m", "policy after 220 steps", "--step", "220", "--metric",
        f"loss={loss!r}")
    run("log", "--oneline")
    run("diff", "HEAD~1", "HEAD")
    run("tag", "v1", "HEAD~1")
    run("reset", "--hard", "v1")
    run("status")
    run("fsck")
    click.echo(f"\nDone: the repository is in {root}/.vrl")


if __name__ == "__main__":
    sys.exit(main())
