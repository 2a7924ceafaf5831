"""Repository maintenance: gc, fsck, prune and repack."""

from __future__ import annotations

import time

import click

from vrl.cli._common import echo_json, first_line, json_option, pass_repo, plural, safe
from vrl.diff import human_bytes
from vrl.errors import VrlError
from vrl.repo import Repo


def _when(moment: float) -> str:
    minutes = max(1, round((moment - time.time()) / 60))
    clock = time.strftime("%H:%M", time.localtime(moment))
    return f"in {minutes} min (at {clock})"


def pending_note(repo: Repo, grace: float | None = None) -> tuple[int, float | None, str]:
    """Unreachable bytes gc keeps for now (the grace period protects commits in flight),
    when the last becomes freeable, and a sentence saying so ("" if none)."""
    size, latest = repo.gc_pending(grace)
    if not size or latest is None:
        return size, latest, ""
    return size, latest, (
        f"{human_bytes(size)} more become freeable {_when(latest)}, when the gc grace period "
        "has passed; `vrl gc --now` frees them at once")


@click.command()
@click.option("--grace", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Keep unreachable objects younger than this [default: gc.grace, 3600].")
@click.option("--now", is_flag=True, help="Same as --grace 0.")
@click.option("--dry-run", is_flag=True, help="Only report what would be removed.")
@click.option("--expire-reflog", is_flag=True,
              help="Forget the reflog first, so snapshots only it kept alive are removed.")
@json_option
@pass_repo
def gc(repo: Repo, grace: float | None, now: bool, dry_run: bool, expire_reflog: bool,
       as_json: bool) -> None:
    """Delete objects no ref, HEAD or reflog entry can reach."""
    if now:
        grace = 0.0
    # commits in flight hold the gc lock: gc waits for them (and new ones for gc), so no
    # grace period can break a commit (vrl/gclock.py)
    count, freed = repo.gc(grace=grace, dry_run=dry_run, expire_reflog=expire_reflog,
                           on_wait=lambda: click.echo("vrl gc: waiting for commits in "
                                                      "progress to finish...", err=True))
    size, latest, note = pending_note(repo, grace)
    if as_json:
        echo_json({"objects": count, "bytes": freed, "dry_run": dry_run,
                   "pending_bytes": size, "pending_until": latest})
        return
    verb = "Would remove" if dry_run else "Removed"
    click.echo(f"{verb} {count} unreachable objects ({human_bytes(freed)})")
    if note:
        click.echo(note[0].upper() + note[1:])


@click.command()
@click.option("--remote", "remote_name", metavar="NAME", default=None,
              help="Check remote NAME instead: every object its refs reach, read back and "
                   "hashed (`vrl push --repair NAME` re-sends what is missing or damaged).")
@json_option
@pass_repo
def fsck(repo: Repo, remote_name: str | None, as_json: bool) -> None:
    """Check objects (re-hashed), commits, manifests, refs and reflogs; list every problem."""
    if remote_name is not None:
        from vrl.cli.remotes import fsck_remote

        return fsck_remote(repo, remote_name, as_json)
    report = repo.fsck()
    if as_json:
        echo_json(report)
    else:
        for problem in report["problems"]:
            click.echo(f"error: {safe(problem, True)}")
        for warning in report["warnings"]:
            click.echo(f"warning: {safe(warning['message'], True)}")
        for oid in report["dangling_commits"]:
            click.echo(f"dangling commit {oid}")
        state = "ok" if report["ok"] else plural(len(report["problems"]), "problem")
        click.echo(f"checked {plural(report['objects'], 'object')}: {state}")
    if not report["ok"]:
        raise click.exceptions.Exit(1)  # main() returns it (sys.exit would escape main)


@click.command()
@click.option("--keep-last", type=int, default=10, show_default=True,
              help="Keep the last N snapshots of every branch.")
@click.option("--branch", "branches", multiple=True, metavar="NAME",
              help="Prune only these branches' history (default: all).")
@click.option("--keep", multiple=True, metavar="REV", help="Also keep REV (repeatable).")
@click.option("--dry-run", is_flag=True, help="Only list what would be pruned.")
@json_option
@pass_repo
def prune(repo: Repo, keep_last: int, branches: tuple[str, ...], keep: tuple[str, ...],
          dry_run: bool, as_json: bool) -> None:
    """Release the tensor data of old snapshots (tags, best and recent ones are kept).

    Commits, metrics and layer statistics stay, so `vrl log` and curves survive;
    `vrl gc` then frees the space.
    """
    refs = []
    for name in branches:
        if name not in repo.branches():
            raise click.BadParameter(f"no branch {name!r}", param_hint="--branch")
        refs.append(f"refs/heads/{name}")
    pruned = repo.prune(keep_last=keep_last, refs=refs or None, keep=keep, dry_run=dry_run)
    if as_json:
        echo_json({"pruned": pruned, "dry_run": dry_run})
        return
    verb = "would prune" if dry_run else "pruned"
    for oid in pruned:
        message = repo.read_commit(oid).message
        click.echo(f"{verb} {oid[:12]} {first_line(message)}".rstrip())
    if dry_run or not pruned:
        click.echo(f"{plural(len(pruned), 'snapshot')} {'would be ' if dry_run else ''}"
                   "pruned; run `vrl gc` to free their space")
        return
    click.echo(f"{plural(len(pruned), 'snapshot')} pruned")
    try:
        _, freed = repo.gc(dry_run=True)
        note = pending_note(repo)[2]
    except VrlError:  # e.g. a damaged reflog: gc itself will explain
        return
    if freed:
        click.echo(f"`vrl gc` frees {human_bytes(freed)} now" + (f"; {note}" if note else ""))
    elif note:
        click.echo(f"`vrl gc` frees nothing yet: {note}")


@click.command()
@json_option
@pass_repo
def repack(repo: Repo, as_json: bool) -> None:
    """Merge the packs of many commits (and small loose objects) into one pack."""
    packed, removed = repo.repack()
    if as_json:
        echo_json({"objects": packed, "files_removed": removed})
        return
    if removed:
        click.echo(f"Packed {plural(packed, 'object')} into one pack "
                   f"({plural(removed, 'file')} replaced)")
    else:
        click.echo(f"Nothing to repack ({plural(packed, 'object')} already in one pack)")


COMMANDS = [gc, fsck, prune, repack]
