"""Commands that create, restore and export snapshots: init, commit, checkout, export,
status, reset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from vrl.cli._common import (
    echo_json,
    first_line,
    json_option,
    parse_assignments,
    pass_repo,
    render_diff,
    safe,
    short,
)
from vrl.diff import human_bytes
from vrl.errors import CheckpointError, VrlError
from vrl.repo import Repo


@click.command()
@click.argument("path", default=".", type=click.Path(file_okay=False))
@click.option("-b", "--branch", default="main", show_default=True, help="Initial branch.")
@click.option("--workspace", default=None,
              help="Workspace checkpoint file [default: policy.safetensors].")
def init(path: str, branch: str, workspace: str | None) -> None:
    """Create an empty repository (a .vrl directory) in PATH."""
    existed = (Path(path) / ".vrl" / "HEAD").is_file()
    repo = Repo.init(path, branch=branch, workspace=workspace)
    verb = "Reinitialized existing" if existed else "Initialized empty"
    click.echo(f"{verb} vrl repository in {repo.vrl_dir}")


def _load_hparams(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import json

    import yaml

    text = Path(path).read_text()
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise VrlError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'YAML'} "
                       f"({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, dict):
        raise VrlError(f"{path}: hyperparameters must be a mapping of names to values")
    return data


@click.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False))
@click.option("-m", "--message", default=None, help="Commit message.")
@click.option("--hparams", "hparams_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML or JSON file of hyperparameters.")
@click.option("--set", "hparam_items", multiple=True, metavar="KEY=VALUE",
              help="A hyperparameter (repeatable).")
@click.option("--metric", "metric_items", multiple=True, metavar="KEY=VALUE",
              help="A metric (repeatable).")
@click.option("--step", type=int, default=None, help="Training step of this snapshot.")
@click.option("--allow-empty", is_flag=True, help="Commit even if nothing changed.")
@click.option("--no-env", is_flag=True, help="Do not record the environment context.")
@json_option
@pass_repo
def commit(repo: Repo, file: str | None, message: str | None, hparams_file: str | None,
           hparam_items: tuple[str, ...], metric_items: tuple[str, ...], step: int | None,
           allow_empty: bool, no_env: bool, as_json: bool) -> None:
    """Snapshot a checkpoint FILE (default: the workspace checkpoint)."""
    from vrl.workspace import read_checkpoint

    path = Path(file) if file else repo.workspace_path
    if not path.exists():
        hint = "" if file else " (the workspace checkpoint; pass a FILE or set core.workspace)"
        raise CheckpointError(f"{path}: no such checkpoint file{hint}")
    hparams = {**_load_hparams(hparams_file), **parse_assignments(hparam_items, "--set")}
    oid = repo.commit(read_checkpoint(path), message=message or f"commit {path.name}",
                      hparams=hparams, metrics=parse_assignments(metric_items, "--metric"),
                      step=step, env=not no_env, allow_empty=allow_empty)
    c = repo.read_commit(oid)
    if path.resolve() == repo.workspace_path.resolve():
        repo.record_workspace(path, c.manifest)
    summary = c.stats.get("summary", "")
    if as_json:
        echo_json({"id": oid, "branch": repo.current_branch(), "summary": summary})
        return
    where = repo.current_branch() or "detached HEAD"
    root = "" if c.parents else " (root-commit)"
    click.echo(f"[{where}{root} {short(oid)}] {first_line(c.message)}\n {summary}")


@click.command()
@click.argument("rev", required=False)
@click.option("-b", "new_branch", default=None, metavar="NAME",
              help="Create branch NAME at REV (default HEAD) and switch to it.")
@click.option("-f", "--force", is_flag=True, help="Discard uncommitted workspace changes.")
@click.option("--no-workspace", is_flag=True, help="Move HEAD only; leave the file alone.")
@pass_repo
def checkout(repo: Repo, rev: str | None, new_branch: str | None, force: bool,
             no_workspace: bool) -> None:
    """Switch to a branch or snapshot and write it to the workspace checkpoint."""
    if rev is None and new_branch is None:
        raise click.UsageError("give a revision, or -b NAME")
    rev = rev or "HEAD"
    target = repo.resolve(rev)
    write = not no_workspace
    if write and not force:
        repo.ensure_clean_workspace()
    target = repo.checkout(rev, create_branch=new_branch)  # a branch wins over a tag
    if write:
        repo.write_workspace(target)
    branch = repo.current_branch()
    c = repo.read_commit(target)
    if new_branch:
        click.echo(f"Switched to a new branch '{new_branch}'")
    elif branch:
        click.echo(safe(f"Switched to branch '{branch}'", True))
    else:
        click.echo(f"HEAD is now at {short(target)} {first_line(c.message)} (detached)")
    if write:
        click.echo(f"Wrote {repo.workspace_path.name}")


@click.command()
@click.argument("rev")
@click.argument("file", type=click.Path(dir_okay=False))
@pass_repo
def export(repo: Repo, rev: str, file: str) -> None:
    """Write snapshot REV to FILE (.safetensors, or .pt/.pth) without moving HEAD."""
    from vrl.workspace import write_checkpoint

    oid = repo.resolve(rev)
    manifest = repo.read_manifest(repo.read_commit(oid).manifest)
    write_checkpoint(repo.load(oid), file)
    click.echo(f"Exported {short(oid)} to {file} ({len(manifest.tensors)} tensors, "
               f"{human_bytes(manifest.nbytes)})")


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged layers.")
@json_option
@pass_repo
def status(repo: Repo, show_all: bool, as_json: bool) -> None:
    """Compare the workspace checkpoint with HEAD, layer by layer."""
    head = repo.head()
    branch = repo.current_branch()
    state, diff = repo.workspace_status()
    if as_json:
        echo_json({"branch": branch, "head": head, "workspace": str(repo.workspace_path),
                   "status": state, "diff": diff.to_json() if diff else None})
        return
    click.echo(safe(f"On branch {branch}", True) if branch else
               f"HEAD detached at {short(head)}")
    if head is None:
        click.echo("No commits yet")
    name = repo.workspace_path.name
    messages = {"clean": f"{name}: no changes since HEAD",
                "missing": f"{name}: not present (vrl checkout HEAD writes it)",
                "untracked": f"{name}: not committed yet (vrl commit)",
                "modified": f"{name}: modified since HEAD"}
    click.echo(messages[state])
    if diff is not None:
        click.echo(render_diff(diff, only_changed=not show_all))


@click.command()
@click.argument("rev")
@click.option("--hard", is_flag=True, help="Also rewrite the workspace checkpoint.")
@pass_repo
def reset(repo: Repo, rev: str, hard: bool) -> None:
    """Roll the current branch back (or forward) to REV in one command."""
    old, new = repo.reset(rev)
    if hard:
        repo.write_workspace(new)
    c = repo.read_commit(new)
    click.echo(f"HEAD is now at {short(new)} {first_line(c.message)}")
    if old and old != new:
        click.echo(f"(was {short(old)}; `vrl reset {short(old)}` undoes this)")


COMMANDS = [init, commit, checkout, export, status, reset]
