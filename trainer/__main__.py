"""`python -m trainer`: the `vrl train` command on its own."""

import sys

from vrl.interrupt import InterruptLatch


def main() -> int:
    # installed before click and trainer.cli (torch) are imported: a Ctrl-C that lands in
    # those imports is deferred until they end (not swallowed), as `vrl` does for every
    # command; the package imports nothing, so only interpreter start-up comes before this
    try:
        with InterruptLatch():
            import click

            from trainer.cli import train

            try:
                # not standalone, click returns the code of a click.exceptions.Exit (130/143)
                code = train.main(prog_name="python -m trainer", standalone_mode=False)
            except click.ClickException as exc:
                exc.show()
                return exc.exit_code
            except click.exceptions.Exit as exc:
                return exc.exit_code
            except click.exceptions.Abort:
                raise KeyboardInterrupt from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
