"""`vrl ui` (a local web app over the repository) and `vrl report` (the same views in one
HTML file). Both read commits and refs only: no tensors, no torch."""

from __future__ import annotations

import os
from pathlib import Path

import click

from vrl.errors import StorageError


@click.command()
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; anything but a loopback address makes the repository's "
                   "metadata readable by others on the network.")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
@click.option("-v", "--verbose", is_flag=True, help="Log every request.")
def ui(port: int, host: str, open_browser: bool, verbose: bool) -> None:
    """Browse the repository in a web browser: commit graph, metric curves (live while
    `vrl train` commits), commit pages, diffs, the layer-change heatmap and the compare
    table. Read-only; Ctrl-C stops it."""
    from vrl.ui.api import open_repo
    from vrl.ui.server import make_server

    repo = open_repo(".")
    server = make_server(repo, host, port, verbose)
    server.api.warm()  # every commit now, layer statistics in the background
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: listening on {host}: anyone who can reach it can read this "
                   "repository's history and metrics", err=True)
    click.echo(f"vrl ui: serving {repo.workdir} at {server.url} (Ctrl-C to stop)", err=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
    finally:
        server.server_close()


@click.command()
@click.argument("revs", nargs=-1)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="report.html",
              show_default=True, help="HTML file to write.")
def report(revs: tuple[str, ...], output: str) -> None:
    """Write the views of REVS (default: every branch) as one self-contained HTML file:
    graph, curves, compare table, heatmaps, commit pages. It opens offline, with no
    server: attach it to a paper, an issue or a pull request."""
    from vrl.ui.api import open_repo
    from vrl.ui.report import render

    html = render(open_repo("."), revs).encode()
    target = Path(output)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:  # write then rename: never a half-written report
        with open(tmp, "wb") as f:
            f.write(html)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {output}: {exc.strerror or exc}") from None
    click.echo(f"wrote {output} ({len(html) / 1e6:.1f} MB)", err=True)


COMMANDS = [ui, report]
