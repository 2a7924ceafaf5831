"""`vrl merge`: commit a merge of snapshots (vrl/merge.py), and how `vrl show` lists one."""

from __future__ import annotations

import click

from vrl import lineage
from vrl.cli._common import echo_json, first_line, json_option, pass_repo, safe, short
from vrl.objects import Commit
from vrl.repo import Repo


@click.command()
@click.argument("revs", nargs=-1, required=True, metavar="REV...")
@click.option("-s", "--strategy", "strategies", multiple=True, metavar="STRATEGY",
              help="How to merge: average (the default), weighted:W1,W2,..., "
                   "task-arithmetic:LAMBDA or take:PATTERN=REV; repeatable, the last rule "
                   "that matches a tensor decides it.")
@click.option("-m", "--message", default=None, help="Commit message.")
@click.option("--branch", default=None, metavar="NAME",
              help="Merge onto NAME instead of the current branch (created from the first "
                   "REV if it does not exist).")
@click.option("--optimizer", type=click.Choice(["drop", "average"]), default="drop",
              show_default=True, help="Optimizer state: emptied, or averaged.")
@click.option("-f", "--force", is_flag=True, help="Discard uncommitted workspace changes.")
@click.option("--no-workspace", is_flag=True, help="Leave the workspace checkpoint alone.")
@json_option
@pass_repo
def merge(repo: Repo, revs: tuple[str, ...], strategies: tuple[str, ...],
          message: str | None, branch: str | None, optimizer: str, force: bool,
          no_workspace: bool, as_json: bool) -> None:
    """Merge snapshots REV... into the current branch as one commit.

    Its parents are the current branch's head, then each REV; with --branch NAME, NAME's
    head (or, for a new branch, the first REV) then the others. The merge base and the
    recipe are recorded in the commit; the workspace checkpoint is rewritten when the
    current branch moved, as `vrl checkout` does.
    """
    oid = repo.merge(list(revs), list(strategies) or "average", message=message,
                     branch=branch, optimizer=optimizer, workspace=not no_workspace,
                     force=force)
    c = repo.read_commit(oid)
    recipe = c.meta.get("merge", {})
    summary = c.stats.get("summary", "")
    if as_json:
        echo_json({"id": oid, "parents": list(c.parents), "merge": recipe,
                   "summary": summary})
        return
    where = branch or repo.current_branch() or "detached HEAD"
    click.echo(safe(f"[{where} {short(oid)}] {first_line(c.message)}", True))
    click.echo("\n".join(merge_lines(c)))
    click.echo(f" {summary}")
    wrote = not no_workspace and (branch is None or branch == repo.current_branch())
    if wrote:
        click.echo(f"Wrote {repo.workspace_path.name}")


def merge_lines(c: Commit) -> list[str]:
    """`vrl show`'s lines for a merge commit, safe to print (none for other commits)."""
    return [safe(line, True) for line in lineage.merge_lines(c)]


COMMANDS = [merge]
