"""A local S3-compatible server (moto) for tests and benchmarks: 127.0.0.1 only.

`python -m vrl.testing.s3server PORT [--threaded]` serves until killed. Single-threaded by
default, so conditional writes (If-Match / If-None-Match) are evaluated atomically, as real
S3 does; moto checks and writes in two steps, which threads could interleave.
"""

from __future__ import annotations

import argparse

from vrl.testing.servers import exit_with_parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--threaded", action="store_true")
    args = parser.parse_args()
    exit_with_parent()
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    run_simple("127.0.0.1", args.port, app, threaded=args.threaded, use_reloader=False,
               use_debugger=False)


if __name__ == "__main__":
    main()
