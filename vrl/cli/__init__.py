"""The `vrl` command line. Commands are thin: they parse, call `vrl.Repo`, and print.

One place (`main`) turns a VrlError into a one-line message and exit code 1.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

import click

from vrl.cli import history, maintenance, refs, remotes, snapshots, ui, viz
from vrl.errors import VrlError

PLUGIN_GROUP = "vrl.commands"


class VrlGroup(click.Group):
    """Built-in commands plus plugins (e.g. `train` from the trainer), loaded on demand."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = {ep.name for ep in entry_points(group=PLUGIN_GROUP)}
        return sorted(set(super().list_commands(ctx)) | names)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        for ep in entry_points(group=PLUGIN_GROUP):
            if ep.name == name:
                try:
                    return ep.load()
                except (ImportError, AttributeError) as exc:  # a stale install names a gone object
                    return _unavailable(name, ep.value.split(":")[0], exc)
        return None


def _unavailable(name: str, module: str, exc: Exception) -> click.Command:
    """Stand-in for a plugin that cannot be imported: `--help` still works."""
    message = (f"`vrl {name}` is provided by {module}, which failed to import ({exc}); "
               "reinstall vrl with its dependencies")

    def fail(args: tuple[str, ...] = ()) -> None:
        raise click.ClickException(message)

    return click.Command(name, callback=fail, help=f"(unavailable: {exc})",
                         context_settings={"ignore_unknown_options": True},
                         params=[click.Argument(["args"], nargs=-1)])


@click.group(cls=VrlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-C", "directory", type=click.Path(file_okay=False), default=None,
              help="Run as if vrl was started in this directory.")
@click.version_option(package_name="vrl")
def cli(directory: str | None) -> None:
    """vrl - version, compare, share and resume RL policies."""
    if directory:
        try:
            os.chdir(directory)
        except OSError as exc:
            raise click.ClickException(f"cannot change to {directory}: {exc.strerror}") from exc


for module in (snapshots, history, refs, maintenance, remotes, viz, ui):
    for command in module.COMMANDS:
        cli.add_command(command)


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
