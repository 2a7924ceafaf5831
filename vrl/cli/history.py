"""Commands that read history: log, show, diff, reflog (none of them imports torch
unless a diff has to be computed from tensor data)."""

from __future__ import annotations

from typing import Any

import click

from vrl.cli._common import (
    color,
    echo_json,
    first_line,
    fmt_num,
    json_option,
    pass_repo,
    render_diff,
    safe,
    short,
    table,
)
from vrl.cli.merge import merge_lines
from vrl.cli.refs import warn_damaged_refs
from vrl.errors import ObjectNotFoundError
from vrl.refs import short_ref
from vrl.repo import LogEntry, Repo
from vrl.returns import EPISODES_METRIC

_SHOWN_CHANGES = 3  # hyperparameter changes on a `log --oneline` line; the rest are counted


def _decorations(entry: LogEntry, head_target: str | None, detached_at: str | None) -> str:
    """` (HEAD -> main, tag: v1)` after a log line; HEAD is read once per log, by the caller
    (`head_target`: HEAD's branch; `detached_at`: HEAD's commit when it is detached)."""
    names = []
    if head_target is None and detached_at == entry.id:
        names.append("HEAD")
    for ref in entry.refs:
        name = short_ref(ref)
        if ref.startswith("refs/tags/"):
            name = f"tag: {name}"
        if ref == head_target:
            name = f"HEAD -> {name}"
            names.insert(0, name)
        else:
            names.append(name)
    return safe(f" ({', '.join(names)})", one_line=True) if names else ""


def _value(value: Any) -> str:
    # every digit of a float (fmt_num's 4 would print 0.30001 -> 0.30002 as 0.3 -> 0.3),
    # and lists as JSON (true and 1 differ there, as they do in the stored config)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, dict)):
        import json

        return safe(json.dumps(value, sort_keys=True, default=str), True)
    return fmt_num(value)


def change_text(entry: dict[str, Any], sep: str = ": ") -> str:
    """`learning_rate: 0.00025 -> 0.0001` for one `lineage.setting_changes` entry."""
    old = _value(entry["old"]) if "old" in entry else "(unset)"
    new = "(unset)" if entry["status"] == "removed" else _value(entry["value"])
    return f"{safe(entry['key'], True)}{sep}{old} -> {new}"


def fork_text(fork: dict[str, Any], verb: str = "forked") -> str:
    """`forked from small at step 4096 (a1b2c3d4e5f6)` for one `lineage.forks` entry."""
    at = f" at step {fork['step']}" if fork["step"] is not None else ""
    return safe(f"{verb} from {fork['from']}{at} ({short(fork['id'])})", True)


def _fork_json(fork: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if fork is None else {"run": fork["from"], "id": fork["id"],
                                      "step": fork["step"]}


def _entry_json(entry: LogEntry, fork: dict[str, Any] | None,
                changes: list[dict[str, Any]]) -> dict[str, Any]:
    c = entry.commit
    return {"id": entry.id, "parents": list(c.parents), "message": c.message,
            "author": c.author, "time": c.time, "step": c.step, "metrics": c.metrics,
            "refs": list(entry.refs), "summary": c.stats.get("summary"),
            "forked_from": _fork_json(fork), "hparam_changes": changes}


def _oneline_notes(fork: dict[str, Any] | None, changes: list[dict[str, Any]]) -> str:
    """` [forked from small at step 40 (...); lr 0.1 -> 0.3, +2 more]`, or nothing."""
    notes = [fork_text(fork)] if fork else []
    if changes:
        shown = [change_text(e, " ") for e in changes[:_SHOWN_CHANGES]]
        if len(changes) > _SHOWN_CHANGES:
            shown.append(f"+{len(changes) - _SHOWN_CHANGES} more")
        notes.append(", ".join(shown))
    return f" [{'; '.join(notes)}]" if notes else ""


def _walk(repo: Repo, revs: tuple[str, ...], all_refs: bool, max_count: int | None,
          full: bool) -> tuple[list[LogEntry], set[str]]:
    """The commits reachable from `revs` (with `all_refs`: from every branch, tag,
    remote-tracking branch and HEAD too), each after its children, newest first among
    those ready; and the ids reachable past `max_count` (their edges run on below the
    last one shown). Commits are read without their layer statistics unless `full`."""
    from vrl.graph_text import topo_order
    from vrl.history import History

    history = History.of(repo)
    heads = [repo.resolve(rev) for rev in revs]
    refs = repo.refs.list()
    if all_refs:
        heads += [oid for ref, oid in refs.items()
                  if ref.startswith(("refs/heads/", "refs/tags/", "refs/remotes/"))]
        head = repo.head()
        if head is not None:
            heads.append(head)
    known: dict[str, list[str]] = {}

    def parents(oid: str) -> list[str]:  # those this repository holds (not past a shallow end)
        if oid not in known:
            known[oid] = [p for p in history.commit(oid).parents if history.has(p)]
        return known[oid]

    order = topo_order([h for h in dict.fromkeys(heads) if history.has(h)], parents,
                       lambda oid: history.commit(oid).time)
    shown = order if max_count is None else order[:max(max_count, 0)]
    names: dict[str, list[str]] = {}
    for ref, oid in refs.items():
        names.setdefault(oid, []).append(ref)
    read = repo.read_commit if full else history.commit
    entries = [LogEntry(oid, read(oid), tuple(names.get(oid, ()))) for oid in shown]
    return entries, set(order[len(shown):])


@click.command()
@click.argument("revs", nargs=-1, metavar="[REV]...")
@click.option("-n", "--max-count", type=int, default=None, help="Show at most N commits.")
@click.option("--oneline", is_flag=True, help="One line per commit.")
@click.option("--graph", is_flag=True,
              help="Draw the branches and merges beside the commits, as git does (children "
                   "before their parents).")
@click.option("--all", "all_refs", is_flag=True,
              help="Start from every branch, tag, remote-tracking branch and HEAD.")
@click.option("--metrics", "metric_names", default=None, metavar="A,B",
              help="Show these metrics as columns.")
@json_option
@pass_repo
def log(repo: Repo, revs: tuple[str, ...], max_count: int | None, oneline: bool, graph: bool,
        all_refs: bool, metric_names: str | None, as_json: bool) -> None:
    """Show the history of snapshots reachable from REV (HEAD by default; several REVs
    and --all show each commit once). A REV with * ? or [ is the branches it matches
    ('pbt/lr/*', quoted for the shell).

    A run's first snapshot names the run it forked from, and a snapshot whose
    hyperparameters differ from its parent's lists the changes."""
    from vrl import lineage
    from vrl.history import History

    if graph and (as_json or metric_names is not None):
        raise click.UsageError("--graph draws the text log; it does not combine with "
                               "--json or --metrics")
    from vrl.views import is_pattern, matching_branches

    revs = tuple(name for rev in revs for name in (
        [n for n, _, _ in matching_branches(repo, rev)] if is_pattern(rev) else [rev]))
    below: set[str] = set()
    if graph or all_refs or len(revs) > 1:
        if not revs and not all_refs and repo.head() is None:
            entries: list[LogEntry] = []
        else:
            entries, below = _walk(repo, revs or (() if all_refs else ("HEAD",)), all_refs,
                                   max_count, full=as_json)
    else:
        entries = repo.log(revs[0] if revs else "HEAD", max_count=max_count)
    warn_damaged_refs(repo)
    if not entries and not as_json:
        click.echo("No commits yet")
        return
    if metric_names is not None and not as_json:
        names = [m for m in metric_names.split(",") if m]
        rows = [[short(e.id), fmt_num(e.commit.step),
                 *[fmt_num(e.commit.metrics.get(m)) for m in names],
                 first_line(e.commit.message)] for e in entries]
        click.echo(table(["commit", "step", *names, "message"], rows))
        if any(e.commit.metrics.get(EPISODES_METRIC) == 0 and
               any(m not in e.commit.metrics for m in names) for e in entries):
            # a training iteration in which no episode finished has no return (and no
            # episode metrics): `-`, not a repeat of the last value
            click.echo("-: no episode ended in that iteration")
        return
    History.of(repo).remember((e.id, e.commit) for e in entries)  # read once, not twice
    fork_of = lineage.forks(repo) if entries else {}
    if as_json:
        echo_json([_entry_json(e, fork_of.get(e.id), lineage.hparam_changes(repo, e.id))
                   for e in entries])
        return
    head_target = repo.refs.head_target()
    detached_at = repo.head() if head_target is None else None
    texts = [_entry_lines(e, _decorations(e, head_target, detached_at), fork_of.get(e.id),
                          lineage.hparam_changes(repo, e.id), oneline) for e in entries]
    if graph:
        from vrl.graph_text import draw

        out = draw([(e.id, e.commit.parents) for e in entries], texts, more_below=below)
    else:
        out = [line for lines in texts for line in lines]
    click.echo("\n".join(out))  # at once: a click.echo per line cost more than the log


def _entry_lines(e: LogEntry, decorations: str, fork: dict[str, Any] | None,
                 changes: list[dict[str, Any]], oneline: bool) -> list[str]:
    """One commit's lines of `vrl log` (its first: the one a graph draws `*` beside)."""
    c = e.commit
    if oneline:
        return [f"{color(short(e.id), 'yellow')}{decorations} {first_line(c.message)}"
                f"{_oneline_notes(fork, changes)}"]
    out = [color(f"commit {e.id}", "yellow") + decorations]
    if len(c.parents) > 1:  # as git names a merge's parents
        out.append("Merge: " + " ".join(short(p) for p in c.parents))
    if fork:
        out.append(fork_text(fork, "Forked"))
    out.append(f"Author: {safe(c.author, True)}")
    out.append(f"Date:   {safe(c.time, True)}")
    if c.step is not None:
        out.append(f"Step:   {safe(c.step, True)}")
    if changes:
        out.append("Hparams: " + ", ".join(change_text(ch, " ") for ch in changes))
    if c.metrics:
        out.append("Metrics: " + " ".join(f"{safe(k, True)}={fmt_num(v)}" for k, v in
                                          sorted(c.metrics.items())))
    out.append("")
    out.extend(f"    {safe(line, True)}" for line in str(c.message or "").splitlines()
               or [""])
    out.append("")
    return out


def _flat(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(data, dict):
        out = []
        for k, v in sorted(data.items()):
            out.extend(_flat(v, f"{prefix}{k}." if not isinstance(v, dict) or not v
                             else f"{prefix}{k}."))
        return [(k.rstrip("."), v) for k, v in out]
    return [(prefix, data)]


_only_option = click.option(
    "--only", "only", multiple=True, metavar="PREFIX",
    help="Only layers whose name starts with PREFIX, e.g. model/ or model/actor "
         "(repeatable).")


@click.command()
@click.argument("rev", default="HEAD")
@click.option("--threshold", type=float, default=None, help="Material-change threshold.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged layers.")
@_only_option
@json_option
@pass_repo
def show(repo: Repo, rev: str, threshold: float | None, show_all: bool,
         only: tuple[str, ...], as_json: bool) -> None:
    """Show a snapshot: message, hyperparameters (and those it changed against its
    parent), environment, metrics and layer changes; a run's first snapshot also names
    the run it forked from."""
    from vrl import lineage

    oid = repo.resolve(rev)
    c = repo.read_commit(oid)
    diff = repo.diff(oid, threshold=threshold).with_layout(c.meta).with_only(only)
    fork = lineage.forks(repo).get(oid)
    changes = lineage.hparam_changes(repo, oid)
    if as_json:
        echo_json({**c.to_json(), "id": oid, "diff": diff.to_json(),
                   "forked_from": _fork_json(fork), "hparam_changes": changes})
        return
    click.echo(color(f"commit {oid}", "yellow"))
    if c.parents:
        click.echo(f"Parent: {c.parents[0]}")
    merged = merge_lines(c)  # a merge commit: all its parents, its base and recipe
    if merged:
        click.echo("\n".join(merged))
    if fork:
        click.echo(fork_text(fork, "Forked"))
    click.echo(f"Author: {safe(c.author, True)}")
    click.echo(f"Date:   {safe(c.time, True)}")
    if c.step is not None:
        click.echo(f"Step:   {safe(c.step, True)}")
    click.echo("")
    for line in str(c.message or "").splitlines() or [""]:
        click.echo(f"    {safe(line, True)}")
    if changes:
        click.echo(f"\nHyperparameters changed against the parent ({short(c.parents[0])}):")
        for entry in changes:
            click.echo(f"  {change_text(entry)}")
    for title, data in (("Hyperparameters", c.hparams), ("Metrics", c.metrics),
                        ("Environment", c.env),
                        ("Metadata", {k: v for k, v in c.meta.items()
                                      if not (merged and k == "merge")})):
        if data:
            click.echo(f"\n{title}:")
            for key, value in _flat(data):
                click.echo(f"  {safe(key, True)}: {fmt_num(value)}")
    click.echo("")
    click.echo(render_diff(diff, only_changed=not show_all))


@click.command()
@click.argument("a", required=False)
@click.argument("b", required=False)
@click.option("--threshold", type=float, default=None, help="Material-change threshold.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged layers.")
@_only_option
@json_option
@pass_repo
def diff(repo: Repo, a: str | None, b: str | None, threshold: float | None, show_all: bool,
         only: tuple[str, ...], as_json: bool) -> None:
    """Layer-by-layer changes from A to B.

    With one revision: what that snapshot changed against its parent. With none: the
    workspace checkpoint against HEAD. A training snapshot is shown as model layers,
    optimizer state by parameter, and other state (RNG, environment, counters). Between
    two snapshots, the hyperparameters and environment that differ follow the layers.
    """
    settings: dict[str, Any] = {}
    apart = ""  # where two diverged runs last shared a snapshot
    if a is None:
        state, result = repo.workspace_status()
        if result is None:
            if as_json:
                echo_json({"workspace": state, "layers": {}})
            else:
                click.echo(f"workspace: {state}")
            return
        if threshold is not None:
            result = result.with_threshold(threshold)
    else:
        result = repo.diff(a, b, threshold=threshold)
        new_id = repo.resolve(b or a)
        new = repo.read_commit(new_id)
        result = result.with_layout(new.meta)
        old_id = repo.resolve(a) if b is not None else (new.parents or [None])[0]
        settings = _setting_diffs(repo, old_id, new)
        if b is not None and old_id is not None:
            from vrl import lineage

            base = lineage.common_ancestor(repo, old_id, new_id)
            settings["common_ancestor"] = base
            if base is not None and base not in (old_id, new_id):  # not one line
                step = repo.read_commit(base).step
                at = f" (step {step})" if step is not None else ""
                apart = safe(f"{a} and {b} share history up to {short(base)}{at}", True)
    result = result.with_only(only)
    if as_json:
        echo_json({**result.to_json(), **settings})
        return
    click.echo(render_diff(result, only_changed=not show_all))
    if apart:
        click.echo(f"\n{apart}")
    for title, key in (("Hyperparameters", "hparams"), ("Environment", "env")):
        if settings.get(key):
            click.echo(f"\n{title}:")
            for entry in settings[key]:
                click.echo(f"  {change_text(entry)}")


def _setting_diffs(repo: Repo, old_id: str | None, new: Any) -> dict[str, Any]:
    """{"hparams": changes, "env": changes} from commit `old_id` (None: a root) to `new`."""
    from vrl import lineage

    if old_id is None:
        return {"hparams": [], "env": []}
    try:
        old = repo.read_commit(old_id)
    except ObjectNotFoundError:  # a parent beyond a shallow history
        return {"hparams": [], "env": []}
    return {"hparams": lineage.setting_changes(new.hparams, old.hparams),
            "env": lineage.setting_changes(new.env, old.env)}


@click.command()
@click.argument("ref", default="HEAD")
@click.option("-n", "--max-count", type=int, default=None, help="Show at most N entries.")
@json_option
@pass_repo
def reflog(repo: Repo, ref: str, max_count: int | None, as_json: bool) -> None:
    """Every move of HEAD (or a branch): the undo history."""
    name = ref if ref == "HEAD" or ref.startswith("refs/") else f"refs/heads/{ref}"
    read = repo.refs.read_log(name)
    for damage in read.damaged:  # never silent: `vrl fsck` reports these too
        click.echo(f"warning: {damage}", err=True)
    entries = read.entries[:max_count]
    if as_json:
        echo_json([{"old": e.old, "new": e.new, "time": e.time, "who": e.who,
                    "reason": e.reason} for e in entries])
        return
    label = "HEAD" if name == "HEAD" else short_ref(name)
    for i, e in enumerate(entries):
        click.echo(f"{color(short(e.new), 'yellow')} {safe(label, True)}@{{{i}}}: "
                   f"{safe(e.reason, True)}")


COMMANDS = [log, show, diff, reflog]
