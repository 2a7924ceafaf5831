"""`python -m trainer`: the `vrl train` command on its own."""

import sys

import click

from vrl.hooks import InterruptLatch


def main() -> int:
    # installed before trainer.cli imports torch: a Ctrl-C that lands in that import is
    # deferred until it ends (not swallowed), as `vrl` does for every command
    try:
        with InterruptLatch():
            from trainer.cli import train

            # not standalone, click returns the code of a click.exceptions.Exit (130/143)
            code = train.main(prog_name="python -m trainer", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
