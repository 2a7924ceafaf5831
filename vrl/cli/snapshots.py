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
    parse_metrics,
    pass_repo,
    render_diff,
    safe,
    short,
)
from vrl.diff import human_bytes
from vrl.errors import CheckpointError, VrlError
from vrl.objects import check_depth
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

    from vrl.yaml12 import load

    is_json = path.endswith(".json")
    try:
        text = Path(path).read_text()
        data = json.loads(text) if is_json else load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:
        detail = "it nests too deeply" if isinstance(exc, RecursionError) else \
            (str(exc).splitlines() or [type(exc).__name__])[0]
        raise VrlError(f"{path}: not valid {'JSON' if is_json else 'YAML'} ({detail})") \
            from exc
    except OSError as exc:
        raise VrlError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    if not isinstance(data, dict):
        raise VrlError(f"{path}: hyperparameters must be a mapping of names to values")
    check_depth(data, path)
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
    from vrl.workspace import open_checkpoint

    path = Path(file) if file else repo.workspace_path
    try:
        before = path.stat()  # the stat cache records the file only if it stayed so
    except OSError:
        hint = "" if file else " (the workspace checkpoint; pass a FILE or set core.workspace)"
        raise CheckpointError(f"{path}: no such checkpoint file{hint}") from None
    hparams = {**_load_hparams(hparams_file), **parse_assignments(hparam_items, "--set")}
    oid = repo.commit(open_checkpoint(path), message=message or f"commit {path.name}",
                      hparams=hparams, metrics=parse_metrics(metric_items),
                      step=step, env=not no_env, allow_empty=allow_empty,
                      meta=_source_meta(repo, path))
    c = repo.read_commit(oid)
    if path.resolve() == repo.workspace_path.resolve():
        repo.record_workspace(path, c.manifest, before)
    summary = c.stats.get("summary", "")
    if as_json:
        echo_json({"id": oid, "branch": repo.current_branch(), "summary": summary})
        return
    where = repo.current_branch() or "detached HEAD"
    root = "" if c.parents else " (root-commit)"
    click.echo(f"[{where}{root} {short(oid)}] {first_line(c.message)}\n {summary}")


# commit metadata: the file `vrl commit FILE` read, when it is not the workspace checkpoint
SOURCE_KEY = "source_file"


def _source_meta(repo: Repo, path: Path) -> dict[str, str] | None:
    """`{"source_file": "model.safetensors"}` for a FILE inside the work tree that is not
    the workspace checkpoint, so that checkout can say which file it did not rewrite. Paths
    outside the work tree are not recorded (a machine's layout stays out of the history),
    nor is the workspace file (commits of it keep the ids they always had)."""
    full = path.resolve()
    if full == repo.workspace_path.resolve():
        return None
    try:
        return {SOURCE_KEY: full.relative_to(repo.workdir.resolve()).as_posix()}
    except ValueError:
        return None


def source_note(repo: Repo, oid: str) -> str | None:
    """One line when snapshot `oid` was committed from another file than the workspace
    checkpoint that checkout and reset --hard write (None otherwise)."""
    import shlex

    source = repo.read_commit(oid).meta.get(SOURCE_KEY)
    if not isinstance(source, str) or not source:
        return None
    # (repository data: only compared and printed, never a path vrl writes to)
    if (repo.workdir / source).resolve() == repo.workspace_path.resolve():
        return None
    quoted = shlex.quote(source)
    return safe(f"note: wrote {repo.workspace_path.name} (the workspace checkpoint), not "
                f"{source}, which {short(oid)} was committed from; to make checkout write "
                f"{source}: vrl config set core.workspace {quoted}", True)


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
    # the workspace is written first; HEAD moves only once that worked
    target = repo.checkout(rev, create_branch=new_branch, workspace=write)
    if target in repo.pruned():
        click.echo(f"warning: snapshot {short(target)} was pruned by retention: `vrl gc` "
                   "frees its tensors once HEAD moves away; tag or branch it to keep it",
                   err=True)
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
        note = source_note(repo, target)
        if note:
            click.echo(note, err=True)


@click.command()
@click.argument("rev")
@click.argument("file", type=click.Path(dir_okay=False))
@pass_repo
def export(repo: Repo, rev: str, file: str) -> None:
    """Write snapshot REV to FILE (.safetensors, or .pt/.pth) without moving HEAD.

    A snapshot committed from a .safetensors file is written back byte for byte.
    """
    oid = repo.resolve(rev)
    manifest = repo.read_manifest(repo.read_commit(oid).manifest)
    repo.export(oid, file)
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
                # `checkout HEAD` would detach HEAD; checking out the branch itself does not
                "missing": f"{name}: not present" + (
                    f" (`vrl checkout {branch or short(head)}` writes it)" if head else ""),
                "untracked": f"{name}: not committed yet (vrl commit)",
                "modified": f"{name}: modified since HEAD"}
    click.echo(messages[state])
    if diff is not None:
        click.echo(render_diff(diff, only_changed=not show_all))


def _ensure_nothing_lost(repo: Repo, target: str) -> None:
    """Refuse a `reset --hard` that would overwrite workspace content no snapshot holds.

    As checkout does: git's reset --hard discards such edits silently, and the reflog
    that undoes the move cannot bring them back. A workspace that matches HEAD, or
    already holds `target`, or is not there, loses nothing."""
    from vrl.errors import WorkspaceError

    current = repo.workspace_manifest()
    if current is None or current[0] == repo.read_commit(target).manifest:
        return
    head = repo.head()
    if head is not None and repo.read_commit(head).manifest == current[0]:
        return
    name = repo.workspace_path.name
    what = "has uncommitted changes" if head is not None else "was never committed"
    raise WorkspaceError(f"{name} {what} that reset --hard would discard; commit it "
                         "(`vrl commit`), or use --force to discard it")


@click.command()
@click.argument("rev")
@click.option("--hard", is_flag=True, help="Also rewrite the workspace checkpoint.")
@click.option("-f", "--force", is_flag=True,
              help="With --hard: discard uncommitted workspace changes.")
@pass_repo
def reset(repo: Repo, rev: str, hard: bool, force: bool) -> None:
    """Roll the current branch back (or forward) to REV in one command.

    --hard also rewrites the workspace checkpoint; it refuses (as checkout does) when
    that would lose uncommitted changes of the file, unless --force."""
    if force and not hard:
        raise click.UsageError("--force only applies with --hard")
    if hard and not force:
        _ensure_nothing_lost(repo, repo.resolve(rev))
    old, new = repo.reset(rev, workspace=hard)  # the workspace first, then the branch
    c = repo.read_commit(new)
    click.echo(f"HEAD is now at {short(new)} {first_line(c.message)}")
    if old and old != new:
        undo = f"vrl reset --hard {short(old)}" if hard else f"vrl reset {short(old)}"
        click.echo(f"(was {short(old)}; `{undo}` undoes this)")
    note = source_note(repo, new) if hard else None
    if note:
        click.echo(note, err=True)


COMMANDS = [init, commit, checkout, export, status, reset]
