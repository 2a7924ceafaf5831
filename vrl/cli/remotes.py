"""Commands that talk to remotes: remote add/list/remove/rename, push, fetch, pull, clone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from vrl.cli._common import (
    echo_json,
    json_option,
    parse_assignments,
    pass_repo,
    plural,
    safe,
    short,
)
from vrl.repo import Repo

jobs_option = click.option("-j", "--jobs", type=click.IntRange(1, 64), default=8,
                           show_default=True, help="Parallel transfers.")
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
option_option = click.option("-o", "--option", "options", multiple=True, metavar="KEY=VALUE",
                             help="Backend option, e.g. endpoint_url=..., profile=..., "
                                  "known_hosts=... (repeatable). Never credentials.")


class TqdmProgress:
    """A byte progress bar on stderr, only on a terminal and only after a moment."""

    def __init__(self, quiet: bool) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self.bar: Any = None

    def begin(self, label: str, total_bytes: int, total_objects: int) -> None:
        if not self.enabled or not total_objects:
            return
        from tqdm import tqdm

        self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024,
                        desc=label, delay=0.5, file=sys.stderr, leave=False)

    def advance(self, nbytes: int) -> None:
        if self.bar is not None:
            self.bar.update(nbytes)

    def end(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _options(items: tuple[str, ...]) -> dict[str, str]:
    return {k: str(v) for k, v in parse_assignments(items, "--option").items()}


def _human(n: int) -> str:
    from vrl.diff import human_bytes

    return human_bytes(n)


@click.group()
def remote() -> None:
    """Manage remotes (local paths, s3://, ssh://, gs://, az://, memory://)."""


@remote.command("add")
@click.argument("name")
@click.argument("url", required=False)
@option_option
@click.option("--from-dvc", "from_dvc", is_flag=True,
              help="Take URL and options from this DVC project's remote (its default, or "
                   "the one named by --dvc-remote).")
@click.option("--dvc-remote", default=None, help="Which DVC remote to use with --from-dvc.")
@click.option("--create", is_flag=True,
              help="Also create an empty vrl remote at URL (push refuses a missing one).")
@pass_repo
def remote_add(repo: Repo, name: str, url: str | None, options: tuple[str, ...],
               from_dvc: bool, dvc_remote: str | None, create: bool) -> None:
    """Add remote NAME at URL."""
    from vrl.remote import add_remote, redact
    from vrl.remote import dvc_remote as read_dvc

    opts = _options(options)
    if from_dvc:
        if url:
            raise click.UsageError("give either URL or --from-dvc, not both")
        _, url, dvc_opts = read_dvc(repo.workdir, dvc_remote)
        opts = {**dvc_opts, **opts}
    elif not url:
        raise click.UsageError("give the remote's URL (or --from-dvc)")
    add_remote(repo, name, url, opts, create=create)
    click.echo(safe(f"Added remote {name} -> {redact(url)}" +
                    (" (created)" if create else "")))


@remote.command("list")
@click.option("-v", "--verbose", is_flag=True, help="Also show options.")
@json_option
@pass_repo
def remote_list(repo: Repo, verbose: bool, as_json: bool) -> None:
    """List remotes."""
    from vrl.remote import remotes
    from vrl.remote.base import redact_options

    # Redacted even though vrl refuses to store secrets: a config written by hand (or by an
    # older version) may hold one.
    known = {name: redact_options(opts) for name, opts in remotes(repo).items()}
    if as_json:
        echo_json(known)
        return
    for name, opts in sorted(known.items()):
        line = f"{name}\t{opts.get('url', '')}" if verbose else name
        if verbose:
            extra = " ".join(f"{k}={v}" for k, v in opts.items() if k != "url")
            line += f"\t{extra}" if extra else ""
        click.echo(safe(line))


@remote.command("remove")
@click.argument("name")
@pass_repo
def remote_remove(repo: Repo, name: str) -> None:
    """Remove remote NAME and its remote-tracking refs."""
    from vrl.remote import remove_remote

    remove_remote(repo, name)
    click.echo(f"Removed remote {name}")


@remote.command("rename")
@click.argument("old")
@click.argument("new")
@pass_repo
def remote_rename(repo: Repo, old: str, new: str) -> None:
    """Rename remote OLD to NEW (and its remote-tracking refs)."""
    from vrl.remote import rename_remote

    rename_remote(repo, old, new)
    click.echo(f"Renamed remote {old} to {new}")


def _summary(result: Any) -> str:
    o = result.objects
    return (f"{plural(o['tensor'], 'tensor')}, {plural(o['manifest'], 'manifest')}, "
            f"{plural(o['commit'], 'commit')} ({_human(result.bytes)})")


@click.command()
@click.argument("remote_name", required=False, metavar="[REMOTE]")
@click.argument("refs", nargs=-1, metavar="[REF[:DST]]...")
@click.option("--all", "all_branches", is_flag=True, help="Push every branch.")
@click.option("--tags", is_flag=True, help="Push every tag.")
@click.option("-f", "--force", is_flag=True, help="Overwrite diverged remote refs.")
@click.option("--create", is_flag=True,
              help="Create the remote if nothing is there yet (a new store).")
@click.option("--repair", is_flag=True,
              help="First re-send, from this repository, every object the remote's refs "
                   "need that is missing or damaged there (what `vrl fsck --remote` "
                   "reports).")
@jobs_option
@quiet_option
@json_option
@pass_repo
def push(repo: Repo, remote_name: str | None, refs: tuple[str, ...], all_branches: bool,
         tags: bool, force: bool, create: bool, repair: bool, jobs: int, quiet: bool,
         as_json: bool) -> None:
    """Upload what REMOTE lacks and move its refs (fast-forward only unless --force).

    Every object is hashed before it is sent: a damaged one stops the push, naming it.
    """
    from vrl.remote import default_remote, open_named
    from vrl.remote import push as do_push

    name = default_remote(repo, remote_name)
    store = open_named(repo, name)
    try:
        repaired = _repair(repo, store, name, jobs, quiet or as_json) if repair else None
        result = do_push(repo, store, name, refs, all_branches=all_branches, tags=tags,
                         force=force, jobs=jobs, progress=TqdmProgress(quiet or as_json),
                         create=create)
    finally:
        store.close()
    if as_json:
        echo_json(result.to_json() | ({} if repaired is None else {"repaired": [
            {"id": p.oid, "kind": p.kind, "was": p.problem} for p in repaired.sent]}))
        return
    if repaired is not None:
        for p in repaired.sent:
            click.echo(safe(f"{name}: re-sent {p.kind} {p.oid[:12]} (was {p.problem})", True))
        if not repaired.sent:
            checked = plural(repaired.report.objects, "object")
            click.echo(safe(f"{name}: nothing to repair ({checked} checked)", True))
    for u in result.updates:
        ref = u.ref.removeprefix("refs/heads/").removeprefix("refs/")
        if u.status == "up-to-date":
            click.echo(safe(f"{name}/{ref}: up to date ({short(u.new)})", True))
        else:
            click.echo(safe(f"{name}/{ref}: {short(u.old)} -> {short(u.new)} ({u.status})",
                            True))
    if not quiet and any(u.status != "up-to-date" for u in result.updates):
        click.echo(f"Sent {_summary(result)}")


def _repair(repo: Repo, store: Any, name: str, jobs: int, quiet: bool) -> Any:
    """`push --repair`: re-send what the remote's refs need and lack intact; refuse (after
    sending what it could) when this repository has no good copy of some."""
    from vrl.errors import VrlError
    from vrl.remote.check import repair_remote

    result = repair_remote(repo, store, name, jobs=jobs, progress=TqdmProgress(quiet))
    if result.unrepaired:
        first = result.unrepaired[0]
        more = f" and {len(result.unrepaired) - 1} more" if len(result.unrepaired) > 1 else ""
        raise VrlError(f"cannot repair {name}: {first.message(name)}{more}, and this "
                       f"repository has no good copy (re-sent {len(result.sent)} others); "
                       "push --repair from a repository that holds it, or see `vrl fsck "
                       f"--remote {name}`")
    return result


def fsck_remote(repo: Repo, name: str, as_json: bool, jobs: int = 8) -> None:
    """`vrl fsck --remote NAME`: every object NAME's refs reach, read back and hashed; one
    line per missing or damaged one, exit 1 if any."""
    from vrl.remote import open_named
    from vrl.remote.check import check_remote

    store = open_named(repo, name)
    try:
        report = check_remote(repo, store, name, jobs=jobs)
    finally:
        store.close()
    if as_json:
        echo_json(report.to_json())
    else:
        for problem in report.problems:
            click.echo(f"error: {safe(problem.message(name), True)}")
        for what in report.unchecked:
            click.echo(f"warning: not checked: {safe(what, True)}")
        state = "ok" if report.ok else (f"{len(report.problems)} problem(s); `vrl push "
                                        f"--repair {name}` re-sends them from this "
                                        "repository")
        refs = f"{report.refs} ref" + ("" if report.refs == 1 else "s")
        click.echo(safe(f"checked {plural(report.objects, 'object')} on {name} ({refs}): {state}",
                        True))
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command()
@click.argument("remote_name", required=False, metavar="[REMOTE]")
@click.option("--metadata-only", is_flag=True,
              help="Commits and manifests only; tensors download when needed.")
@jobs_option
@quiet_option
@json_option
@pass_repo
def fetch(repo: Repo, remote_name: str | None, metadata_only: bool, jobs: int, quiet: bool,
          as_json: bool) -> None:
    """Download REMOTE's branches into refs/remotes/REMOTE/ (and the objects we lack)."""
    from vrl.remote import default_remote, open_named
    from vrl.remote import fetch as do_fetch

    name = default_remote(repo, remote_name)
    partial = repo.config.flag("core", "partial")
    store = open_named(repo, name)
    try:
        result = do_fetch(repo, store, name, metadata_only=metadata_only or partial,
                          jobs=jobs, progress=TqdmProgress(quiet or as_json))
    finally:
        store.close()
    if as_json:
        echo_json(result.to_json())
        return
    for u in result.updates:
        click.echo(safe(f"{u.ref.removeprefix('refs/remotes/')}: {short(u.old)} -> "
                        f"{short(u.new)} ({u.status})", True))
    if not quiet:
        click.echo(f"Received {_summary(result)}")


@click.command()
@click.argument("remote_name", required=False, metavar="[REMOTE]")
@click.argument("branch", required=False)
@click.option("-f", "--force", is_flag=True, help="Discard uncommitted workspace changes.")
@jobs_option
@quiet_option
@pass_repo
def pull(repo: Repo, remote_name: str | None, branch: str | None, force: bool, jobs: int,
         quiet: bool) -> None:
    """Fetch from REMOTE and fast-forward the current branch."""
    from vrl.remote import default_remote, open_named
    from vrl.remote import pull as do_pull

    name = default_remote(repo, remote_name)
    update_workspace = repo.workspace_path.exists() and (branch is None or
                                                         branch == repo.current_branch())
    if update_workspace and not force:
        repo.ensure_clean_workspace()
    store = open_named(repo, name)
    try:
        update, _ = do_pull(repo, store, name, branch, jobs=jobs,
                            progress=TqdmProgress(quiet))
    finally:
        store.close()
    ref = safe(update.ref.removeprefix("refs/heads/"), True)
    if update.status == "up-to-date":
        click.echo(f"{ref}: already up to date ({short(update.new)})")
        return
    click.echo(f"{ref}: {short(update.old)} -> {short(update.new)} (fast-forward)")
    if update_workspace and update.new:
        repo.write_workspace(update.new)
        click.echo(f"Wrote {repo.workspace_path.name}")


@click.command()
@click.argument("url")
@click.argument("directory", required=False, type=click.Path(file_okay=False))
@click.option("-b", "--branch", default=None, help="Branch to check out [remote's HEAD].")
@click.option("--metadata-only", is_flag=True,
              help="Commits and manifests only; tensors download on checkout/export/load.")
@click.option("--no-checkout", is_flag=True, help="Do not write the workspace checkpoint.")
@option_option
@jobs_option
@quiet_option
def clone(url: str, directory: str | None, branch: str | None, metadata_only: bool,
          no_checkout: bool, options: tuple[str, ...], jobs: int, quiet: bool) -> None:
    """Create a repository from URL: init, add remote origin, fetch, check out."""
    from vrl.remote import clone as do_clone
    from vrl.remote import redact

    repo = do_clone(url, directory, branch=branch, options=_options(options),
                    metadata_only=metadata_only, jobs=jobs, progress=TqdmProgress(quiet),
                    checkout=not no_checkout)
    head = repo.head()
    where = Path(repo.workdir)
    kind = " (metadata only)" if metadata_only else ""
    click.echo(safe(f"Cloned {redact(url)} into {where}{kind}", True))
    if head:
        click.echo(safe(f"On branch {repo.current_branch()} at {short(head)}", True))
    else:
        click.echo("The remote is empty")


COMMANDS = [remote, push, fetch, pull, clone]
