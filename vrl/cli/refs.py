"""Commands that manage names: branch and tag."""

from __future__ import annotations

import click

from vrl.cli._common import echo_json, first_line, json_option, pass_repo, safe, short
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
@json_option
@pass_repo
def branch(repo: Repo, name: str | None, rev: str, delete: bool, force: bool,
           as_json: bool) -> None:
    """List branches, create NAME at REV, or delete NAME (-d)."""
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
    branches = repo.branches()
    warn_damaged_refs(repo, "refs/heads/")
    if as_json:
        echo_json({"current": current, "branches": branches})
        return
    if current and current not in branches:
        click.echo(f"* {safe(current, True)} (no commits yet)")
    for bname, oid in branches.items():
        mark = "*" if bname == current else " "
        click.echo(f"{mark} {safe(bname, True)}  {short(oid)} "
                   f"{first_line(repo.read_commit(oid).message)}")


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
