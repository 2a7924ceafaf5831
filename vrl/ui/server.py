"""`vrl ui`: a small read-only HTTP server (standard library only) over one repository.

What it serves is fixed: the page, the assets listed in `ASSETS` (read from the package,
never from a path in the request) and the JSON API of `vrl.ui.api`. Only GET and HEAD
are answered. Bound to a loopback address it also refuses requests whose Host header
names another host, so a web page elsewhere cannot read the repository through DNS
rebinding.
"""

from __future__ import annotations

import json
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vrl.errors import VrlError
from vrl.ui.api import Api, ApiError
from vrl.ui.firstpaint import page

STATIC = resources.files("vrl.ui") / "static"

# url path -> (file under static/, content type); nothing else is ever read from disk
ASSETS: dict[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    "/static/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/static/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
    "/static/uPlot.LICENSE": ("vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
}

SECURITY_HEADERS = {
    # scripts and styles only from this server; no frames, no plugins, no outside requests
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; object-src 'none'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
}

LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}


def asset(name: str) -> bytes:
    """The bytes of a packaged static file (`name` comes from `ASSETS`, never a request)."""
    return (STATIC / name).read_bytes()


class Handler(BaseHTTPRequestHandler):
    server: UiServer
    protocol_version = "HTTP/1.1"
    server_version = "vrl-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            super().log_message(format, *args)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only\n", "text/plain", True,
                   {"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def _serve(self, body: bool) -> None:
        if not self.server.host_allowed(self.headers.get("Host", "")):
            self._send(HTTPStatus.FORBIDDEN, b"unexpected Host header\n", "text/plain", body)
            return
        url = urlsplit(self.path)
        if url.path == "/":  # the page, with the runs table already in it (first paint)
            text = page(self.server.assets["index.html"].decode(), self.server.api)
            self._send(HTTPStatus.OK, text.encode(), ASSETS["/"][1], body,
                       {"Cache-Control": "no-cache"})
        elif url.path in ASSETS:
            name, ctype = ASSETS[url.path]
            extra = {"Cache-Control": "no-cache"}
            self._send(HTTPStatus.OK, self.server.assets[name], ctype, body, extra)
        elif url.path == "/api/gif":
            self._gif(url.query, body)
        elif url.path.startswith("/api/"):
            self._api(url.path[len("/api/"):], url.query, body)
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain", body)

    def _api(self, route: str, query: str, body: bool) -> None:
        params = {k: v for k, v in parse_qs(query, keep_blank_values=True).items()}
        try:
            data = self.server.api.get(route, params)
            status = HTTPStatus.OK
        except ApiError as exc:
            data, status = {"error": str(exc)}, exc.status
        except VrlError as exc:
            data, status = {"error": self.server.api.clean_error(exc)}, HTTPStatus.NOT_FOUND
        except Exception as exc:  # a bug: say so without a traceback in the page
            print(f"vrl ui: {route}: {type(exc).__name__}: {exc}", file=sys.stderr)
            data = {"error": f"internal error ({type(exc).__name__})"}
            status = HTTPStatus.INTERNAL_SERVER_ERROR
        payload = json.dumps(data, allow_nan=False, separators=(",", ":")).encode()
        self._send(status, payload, "application/json", body, {"Cache-Control": "no-store"})

    def _gif(self, query: str, body: bool) -> None:
        """A commit's eval GIF (`Api.eval_gif`: found by the resolved commit id, never by
        a path from the request)."""
        rev = (parse_qs(query).get("rev") or [""])[-1]
        try:
            path = self.server.api.gif_file(rev) if rev else None
            data = path.read_bytes() if path is not None else None
        except (VrlError, OSError):
            data = None
        if data is None:
            self._send(HTTPStatus.NOT_FOUND, b"no eval GIF\n", "text/plain", body)
        else:
            self._send(HTTPStatus.OK, data, "image/gif", body, {"Cache-Control": "no-cache"})

    def _send(self, status: int, payload: bytes, ctype: str, body: bool,
              extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for key, value in {**SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(payload)


class UiServer(ThreadingHTTPServer):
    """The HTTP server: one `Api` over the repository, the assets read once at start."""

    daemon_threads = True

    def __init__(self, api: Api, host: str = "127.0.0.1", port: int = 8080,
                 verbose: bool = False) -> None:
        self.api = api
        self.verbose = verbose
        self.bound_host = host
        self.assets = {name: asset(name) for name, _ in ASSETS.values()}
        if ":" in host:  # an IPv6 address
            import socket

            self.address_family = socket.AF_INET6
        super().__init__((host, port), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a browser that went away mid-answer (a page closed, a screenshot taken) is no
        # error worth a traceback
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}/"

    def host_allowed(self, header: str) -> bool:
        """On a loopback address only loopback names are accepted (DNS rebinding)."""
        if self.bound_host not in LOOPBACK:
            return True
        name = header.rsplit(":", 1)[0] if not header.endswith("]") else header
        return name in LOOPBACK


def serve_in_thread(server: UiServer) -> threading.Thread:
    """Start `server` in a daemon thread (tests and the bench); stop it with shutdown()."""
    thread = threading.Thread(target=server.serve_forever, name="vrl-ui", daemon=True)
    thread.start()
    return thread


def make_server(repo: Any, host: str, port: int, verbose: bool = False) -> UiServer:
    try:
        return UiServer(Api(repo), host, port, verbose)
    except OSError as exc:
        raise UiError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                      "choose another --port or --host") from None


class UiError(VrlError, OSError):
    """The server cannot start (port taken, address not available)."""
