"""`vrl` and `python -m vrl`: the Ctrl-C latch first, then the command line."""

import sys

from vrl.interrupt import InterruptLatch


def main() -> int:
    # installed before vrl.cli imports the store and every command: a Ctrl-C during those
    # imports ends the command with "interrupted" (130), not a traceback
    try:
        with InterruptLatch():
            from vrl.cli import main as cli_main

            return cli_main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
