"""Commands that manage names: branch and tag."""

from __future__ import annotations

from typing import Any

import click

from vrl.cli._common import echo_json, first_line, json_option, pass_repo, safe, short
from vrl.refs import short_ref
from vrl.repo import Repo


def warn_damaged_refs(repo: Repo, prefix: str = "refs/") -> None:
    """List the refs that cannot be read on stderr (the good ones are still shown)."""
    for why in repo.refs.damaged(prefix).values():
        click.echo(f"warning: {why}", err=True)


def _was(oid: str | None) -> str:
    return f"was {short(oid)}" if oid else "it was damaged"


@click.command()
@click.argument("name", required=False)
@click.argument("rev", required=False, default="HEAD")
@click.option("-d", "--delete", is_flag=True, help="Delete branch NAME.")
@click.option("-f", "--force", is_flag=True, help="Move NAME even if it exists.")
@click.option("-r", "--remotes", "remote_only", is_flag=True,
              help="List the remote-tracking branches (origin/main).")
@click.option("-a", "--all", "list_all", is_flag=True,
              help="List the local branches, then the remote-tracking ones "
                   "(remotes/origin/main).")
@json_option
@pass_repo
def branch(repo: Repo, name: str | None, rev: str, delete: bool, force: bool,
           remote_only: bool, list_all: bool, as_json: bool) -> None:
    """List branches, create NAME at REV, or delete NAME (-d)."""
    if (remote_only or list_all) and (name or delete):
        raise click.UsageError("-r and -a list branches; they take no NAME")
    if delete:
        if not name:
            raise click.UsageError("give the branch to delete")
        old = repo.delete_branch(name)
        click.echo(f"Deleted branch {name} ({_was(old)})")
        return
    if name:
        oid = repo.branch(name, rev, force=force)
        click.echo(f"Created branch {name} at {short(oid)}")
        return
    current = repo.current_branch()
    local = {} if remote_only else repo.branches()
    tracking = {short_ref(ref): oid for ref, oid in repo.refs.list("refs/remotes/").items()
                } if remote_only or list_all else {}
    if not remote_only:
        warn_damaged_refs(repo, "refs/heads/")
    if tracking or remote_only:
        warn_damaged_refs(repo, "refs/remotes/")
    if as_json:
        data: dict[str, Any] = {"current": current}
        if not remote_only:
            data["branches"] = local
        if remote_only or list_all:
            data["remotes"] = tracking
        echo_json(data)
        return
    # (mark, name, id or None): git's prefix for remote-tracking ones under -a
    rows: list[tuple[str, str, str | None]] = []
    if current and current not in local and not remote_only:
        rows.append(("*", current, None))
    rows += [("*" if bname == current else " ", bname, oid) for bname, oid in local.items()]
    prefix = "remotes/" if list_all else ""
    rows += [(" ", prefix + rname, oid) for rname, oid in tracking.items()]
    names = [safe(n, True) for _, n, _ in rows]
    width = max((len(n) for n in names), default=0)
    for (mark, _, oid), shown in zip(rows, names, strict=True):
        if oid is None:  # an unborn branch: HEAD names it, nothing is committed there yet
            click.echo(f"{mark} {shown.ljust(width)}  (no commits yet)")
            continue
        click.echo(f"{mark} {shown.ljust(width)}  {short(oid)} "
                   f"{first_line(repo.read_commit(oid).message)}".rstrip())



@click.command()
@click.argument("name", required=False)
@click.argument("rev", required=False, default="HEAD")
@click.option("-d", "--delete", is_flag=True, help="Delete tag NAME.")
@click.option("-f", "--force", is_flag=True, help="Move NAME if it exists.")
@json_option
@pass_repo
def tag(repo: Repo, name: str | None, rev: str, delete: bool, force: bool,
        as_json: bool) -> None:
    """List tags, tag REV as NAME, or delete NAME (-d)."""
    if delete:
        if not name:
            raise click.UsageError("give the tag to delete")
        old = repo.delete_tag(name)
        click.echo(f"Deleted tag {name} ({_was(old)})")
        return
    if name:
        oid = repo.tag(name, rev, force=force)
        click.echo(f"Tagged {short(oid)} as {name}")
        return
    tags = repo.tags()
    warn_damaged_refs(repo, "refs/tags/")
    if as_json:
        echo_json(tags)
        return
    for tname, oid in tags.items():
        click.echo(f"{safe(tname, True)}  {short(oid)}")


COMMANDS = [branch, tag]
