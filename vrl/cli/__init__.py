"""The `vrl` command line. Commands are thin: they parse, call `vrl.Repo`, and print.

One place (`main`) turns a VrlError into a one-line message and exit code 1.
Command modules are imported when their command runs (or `--help` lists it): a command
pays only for its own imports, which is most of a short command's wall time.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from vrl.errors import VrlError

PLUGIN_GROUP = "vrl.commands"
# built-in command -> the vrl.cli module defining it (in its COMMANDS; a test checks both agree)
BUILTINS = {
    **dict.fromkeys(["init", "commit", "checkout", "export", "status", "reset"], "snapshots"),
    **dict.fromkeys(["log", "show", "diff", "reflog"], "history"),
    **dict.fromkeys(["branch", "tag"], "refs"),
    **dict.fromkeys(["gc", "fsck", "prune", "repack"], "maintenance"),
    **dict.fromkeys(["remote", "push", "fetch", "pull", "clone"], "remotes"),
    **dict.fromkeys(["compare", "plot"], "viz"),
    **dict.fromkeys(["ui", "report"], "ui"),
    "config": "config",
    "merge": "merge",
}


def _entry_points() -> list:
    # importlib.metadata (and the email and zipfile modules it imports) only when a
    # command is not built in, or every command is listed
    from importlib.metadata import entry_points

    return list(entry_points(group=PLUGIN_GROUP))


class VrlGroup(click.Group):
    """Built-in commands plus plugins (e.g. `train` from the trainer), loaded on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = {ep.name for ep in _entry_points()}
        return sorted(set(super().list_commands(ctx)) | set(BUILTINS) | names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        if name in BUILTINS:
            module = importlib.import_module(f"vrl.cli.{BUILTINS[name]}")
            command = next(c for c in module.COMMANDS if c.name == name)
            self.add_command(command)
            return command
        for ep in _entry_points():
            if ep.name == name:
                try:
                    return ep.load()
                except (ImportError, AttributeError) as exc:  # a stale install names a gone object
                    return _unavailable(name, ep.value.split(":")[0], exc)
        return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list with each command's whole first sentence, wrapped: click cuts
        it to one line with "...", which hid what half the commands do."""
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            # e.g. an unknown name: click suggests the closest of the commands it holds,
            # so it gets all of them first
            for name in BUILTINS:
                self.get_command(ctx, name)
            return super().resolve_command(ctx, args)


def _unavailable(name: str, module: str, exc: Exception) -> click.Command:
    """Stand-in for a plugin that cannot be imported: `--help` still works."""
    message = (f"`vrl {name}` is provided by {module}, which failed to import ({exc}); "
               "reinstall vrl with its dependencies")

    def fail(args: tuple[str, ...] = ()) -> None:
        raise click.ClickException(message)

    return click.Command(name, callback=fail, help=f"(unavailable: {exc})",
                         context_settings={"ignore_unknown_options": True},
                         params=[click.Argument(["args"], nargs=-1)])


# The remote backends' libraries and what they use. Their lines (gcsfs's notices, and a
# traceback at ERROR for each failed request; azure-core's request log; botocore's
# credential search; adlfs's UserWarnings) say nothing a vrl user can act on: a failure
# becomes vrl's own one-line error. Shown with `vrl -v` (INFO) / `vrl -vv` (DEBUG).
BACKEND_LOGGERS = ("gcsfs", "google", "adlfs", "azure", "urllib3", "botocore", "aiobotocore",
                   "s3fs", "fsspec", "sshfs", "asyncssh", "aiohttp")


def configure_logging(verbose: int) -> None:
    """Set the backends' log levels for this command: CRITICAL (their Python warnings
    hidden too) by default - ERROR would let gcsfs's tracebacks through - else a stderr
    handler at INFO (-v) or DEBUG (-vv)."""
    import logging
    import warnings

    if verbose:
        level = logging.DEBUG if verbose > 1 else logging.INFO
        logging.basicConfig(format="%(name)s: %(message)s")
    else:
        level = logging.CRITICAL
        warnings.filterwarnings("ignore", module=r"(" + "|".join(BACKEND_LOGGERS) + r")(\.|$)")
    for name in BACKEND_LOGGERS:
        logging.getLogger(name).setLevel(level)


@click.group(cls=VrlGroup, context_settings={"help_option_names": ["-h", "--help"],
                                             "max_content_width": 100})
@click.option("-C", "directory", type=click.Path(file_okay=False), default=None,
              help="Run as if vrl was started in this directory.")
@click.option("-v", "--verbose", count=True,
              help="Show the remote backends' log (-v: INFO, -vv: every request).")
@click.version_option(package_name="vrl")
def cli(directory: str | None, verbose: int) -> None:
    """vrl - version, compare, share and resume RL policies."""
    configure_logging(verbose)
    if directory:
        try:
            os.chdir(directory)
        except OSError as exc:
            raise click.ClickException(f"cannot change to {directory}: {exc.strerror}") from exc


def main(argv: list[str] | None = None) -> int:
    """Console entry point: known errors become one line on stderr and exit code 1."""
    from vrl.interrupt import InterruptLatch

    try:
        # a Ctrl-C that lands in an import or is swallowed is not lost (see InterruptLatch)
        with InterruptLatch():
            # Without standalone mode, click returns the code of an explicit exit (fsck's)
            code = cli.main(args=argv, prog_name="vrl", standalone_mode=False)
    except VrlError as exc:
        if os.environ.get("VRL_DEBUG"):
            raise
        from vrl.cli._common import safe
        from vrl.remote.base import redact

        # Messages may quote repository or remote data: no secrets, no escape sequences.
        click.echo(f"error: {safe(redact(str(exc)), one_line=True)}", err=True)
        return 1
    except click.exceptions.Abort as exc:
        # click turns a Ctrl-C inside a command into Abort; a "no" at a prompt is one too
        ctrl_c = isinstance(exc.__context__, KeyboardInterrupt)
        click.echo("interrupted" if ctrl_c else "aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except BrokenPipeError:
        return 141
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
