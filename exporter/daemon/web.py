"""The exporter's own HTTP endpoint: /metrics, the landing page, health and reload."""

from __future__ import annotations

import json
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from ..core.report import VERDICTS_PATH
from ..core.verdict import Verdict
from ..version import __version__

if TYPE_CHECKING:
    from .exposition.serve import Scrape

DEFAULT_PORT = 9824
VERDICTS = tuple(v.value for v in Verdict)
HEALTHY_PATH = "/-/healthy"
"""Liveness: answered by the web thread as long as the process runs (the image's HEALTHCHECK and Kubernetes ask it)."""
READY_PATH = "/-/ready"
OPEN_PATHS = frozenset({HEALTHY_PATH, READY_PATH})
"""Answered without credentials: they reveal nothing, and liveness probes (Docker, Kubernetes) send none."""
MAX_REQUEST_BODY = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    server: _WebServer
    server_version = f"specwatch/{__version__}"
    sys_version = ""
    # Keep-alive, as Prometheus expects of an exporter: every answer carries a Content-Length.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # scrapes every few seconds would drown the daemon's own logs

    def handle(self) -> None:
        admit = self.server.app.admit
        if admit is not None and not admit(self.connection):
            return  # a client certificate outside client_allowed_sans: the connection ends unanswered
        super().handle()

    def _send(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in {**self.server.app.headers, **(headers or {})}.items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _skip_body(self) -> bool:
        """Read past the request's body so the connection can carry the next request; False when it cannot."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # a chunked body is not read: the connection ends after this answer
            return True
        length = self.headers.get("Content-Length", "0").strip() or "0"
        if not length.isdigit():
            self.close_connection = True
            self._send(400, b"bad Content-Length\n")
            return False
        if int(length) > MAX_REQUEST_BODY:
            self.close_connection = True
            self._send(413, b"request body too large\n")
            return False
        if int(length):
            self.rfile.read(int(length))
        return True

    def _authorised(self, path: str) -> bool:
        check = self.server.app.authorise
        if path in OPEN_PATHS or check is None or check(self.headers.get("Authorization")):
            return True
        self._send(401, b"Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="specwatch"'})
        return False

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if not self._skip_body() or not self._authorised(path):
            return
        app = self.server.app
        if path == "/metrics":
            try:
                scrape = app.metrics(self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
            except Exception as err:  # noqa: BLE001 - a broken scrape must answer, not kill the thread
                self._send(500, f"error collecting metrics: {err.__class__.__name__}\n".encode())
                return
            headers = {"Vary": "Accept-Encoding", **({"Content-Encoding": "gzip"} if scrape.gzipped else {})}
            self._send(200, scrape.body, scrape.content_type, headers)
        elif path == "/":
            self._send(200, app.page().encode(), "text/html; charset=utf-8")
        elif path == "/sd" and app.sd is not None:
            verdict = parse_qs(urlsplit(self.path).query).get("verdict", [None])[-1]
            if verdict is not None and verdict not in VERDICTS:
                self._send(400, f"verdict must be one of {', '.join(VERDICTS)}\n".encode())
                return
            self._send(200, json.dumps(app.sd(verdict), separators=(",", ":")).encode(), "application/json")
        elif path == VERDICTS_PATH and app.verdicts is not None:
            try:
                document = app.verdicts(parse_qs(urlsplit(self.path).query, keep_blank_values=True))
            except ValueError as err:
                self._send(400, f"{err}\n".encode())
                return
            self._send(200, json.dumps(document, separators=(",", ":")).encode(), "application/json")
        elif path == HEALTHY_PATH:
            self._send(200, b"OK\n")
        elif path == READY_PATH:
            ready = app.ready()
            self._send(200 if ready else 503, b"OK\n" if ready else b"starting\n")
        elif path == "/-/reload":
            self._send(405, b"use POST to reload the configuration\n", headers={"Allow": "POST"})
        else:
            self._send(404, b"not found; see / for what is served\n")

    do_HEAD = do_GET  # noqa: N815 - stdlib naming

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if not self._skip_body() or not self._authorised(path):
            return
        if path != "/-/reload":
            self._send(405, b"only /-/reload takes POST\n")
            return
        error = self.server.app.reload()
        if error is None:
            self._send(200, b"configuration reloaded\n")
        else:
            self._send(500, f"reload failed, the previous configuration keeps running:\n{error}\n".encode())


class _WebServer(ThreadingHTTPServer):
    daemon_threads = True
    app: WebApp

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        # Plain HTTP on the TLS port, resets and stalled clients are the client's problem: no traceback.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError | ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class _WebServer6(_WebServer):
    address_family = socket.AF_INET6


class WebApp:
    """Serves the exporter; every callable is safe to call from the HTTP threads."""

    def __init__(
        self,
        metrics: Callable[[str | None, str | None], Scrape],
        *,
        page: Callable[[], str],
        reload: Callable[[], str | None],
        ready: Callable[[], bool] = lambda: True,
        authorise: Callable[[str | None], bool] | None = None,
        client_timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        admit: Callable[[socket.socket], bool] | None = None,
        sd: Callable[[str | None], list[dict[str, object]]] | None = None,
        verdicts: Callable[[dict[str, list[str]]], dict[str, object]] | None = None,
    ) -> None:
        self.metrics = metrics
        """The answer to a scrape, given its Accept and Accept-Encoding headers."""
        self.page = page
        """The landing page's HTML."""
        self.reload = reload
        self.ready = ready
        self.authorise = authorise
        # A client that stalls (mid-request or mid-TLS-handshake), or keeps an idle connection open, gives up its
        # thread after this long.
        self.client_timeout = client_timeout
        self.headers = {"X-Content-Type-Options": "nosniff", **(headers or {})}
        """Sent on every answer (web config's http_server_config.headers; a blank value unsets one)."""
        self.admit = admit
        """Decides, once per connection, whether its client may talk at all (client_allowed_sans)."""
        self.sd = sd
        """GET /sd: the watched targets as Prometheus http_sd groups, optionally only those of one verdict."""
        self.verdicts = verdicts
        """GET /api/v1/verdicts: the watched servers' verdicts, given the query's selection; ValueError for a bad one."""
        self._httpd: _WebServer | None = None

    def start(self, host: str, port: int, wrap_socket: Callable | None = None) -> tuple[str, int]:
        handler = type("_Handler", (_Handler,), {"timeout": self.client_timeout})
        httpd = (_WebServer6 if ":" in host else _WebServer)((host, port), handler)
        httpd.app = self
        if wrap_socket is not None:
            httpd.socket = wrap_socket(httpd.socket)
        self._httpd = httpd
        threading.Thread(target=httpd.serve_forever, name="specwatch-web", daemon=True).start()
        bound = httpd.server_address
        return str(bound[0]), int(bound[1])

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) from ':9824', '0.0.0.0:9824', '[::1]:9824' or '9824'."""
    value = text.strip()
    if value.isdigit():
        host, port_text = "", value
    else:
        host, sep, port_text = value.rpartition(":")
        if not sep:
            raise ValueError(f"listen address {text!r} must look like HOST:PORT or :PORT")
    host = host.strip("[]") or "0.0.0.0"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"listen address {text!r} has no valid port")
    return host, int(port_text)
