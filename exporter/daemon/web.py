"""The exporter's own HTTP endpoint: /metrics, the landing page, health and reload."""

from __future__ import annotations

import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from exporter import __version__

DEFAULT_PORT = 9824


class _Handler(BaseHTTPRequestHandler):
    server: _WebServer
    server_version = f"specwatch/{__version__}"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # scrapes every few seconds would drown the daemon's own logs

    def _send(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorised(self) -> bool:
        check = self.server.app.authorise
        if check is None or check(self.headers.get("Authorization")):
            return True
        self._send(401, b"Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="specwatch"'})
        return False

    def do_GET(self) -> None:
        if not self._authorised():
            return
        path = urlsplit(self.path).path
        app = self.server.app
        if path == "/metrics":
            try:
                body, content_type = app.metrics(self.headers.get("Accept"))
            except Exception as err:  # noqa: BLE001 - a broken scrape must answer, not kill the thread
                self._send(500, f"error collecting metrics: {err.__class__.__name__}\n".encode())
                return
            self._send(200, body, content_type)
        elif path == "/":
            self._send(200, app.page().encode(), "text/html; charset=utf-8")
        elif path == "/-/healthy":
            self._send(200, b"OK\n")
        elif path == "/-/ready":
            ready = app.ready()
            self._send(200 if ready else 503, b"OK\n" if ready else b"starting\n")
        elif path == "/-/reload":
            self._send(405, b"use POST to reload the configuration\n", headers={"Allow": "POST"})
        else:
            self._send(404, b"not found; see / for what is served\n")

    do_HEAD = do_GET  # noqa: N815 - stdlib naming

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if urlsplit(self.path).path != "/-/reload":
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

    def handle_error(self, request: object, client_address: object) -> None:
        # Plain HTTP on the TLS port, resets and stalled clients are the client's problem: no traceback.
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError | ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _WebServer6(_WebServer):
    address_family = socket.AF_INET6


class WebApp:
    """Serves the exporter; every callable is safe to call from the HTTP threads."""

    def __init__(
        self,
        metrics: Callable[[str | None], tuple[bytes, str]],
        *,
        page: Callable[[], str],
        reload: Callable[[], str | None],
        ready: Callable[[], bool] = lambda: True,
        authorise: Callable[[str | None], bool] | None = None,
        client_timeout: float = 30.0,
    ) -> None:
        self.metrics = metrics
        """(body, content type) of a scrape, given its Accept header."""
        self.page = page
        """The landing page's HTML."""
        self.reload = reload
        self.ready = ready
        self.authorise = authorise
        # A client that stalls (mid-request or mid-TLS-handshake) gives up its thread after this long.
        self.client_timeout = client_timeout
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
