"""One asyncio HTTP/1.1 server on loopback sockets for llama-server look-alikes: healthy answers, faults, one port or a thousand."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qsl

from tests.support.net import HOST
from tests.support.wire import SSE, Answer, FakeLlama, Lookalike, Request, error, json_answer

STATS_PATH = "/_sim/stats"
KEEPALIVE_MAX = 100
"""llama-server (cpp-httplib) serves this many requests on one connection, then closes it."""
MAX_HEAD_BYTES = 64 * 1024
MAX_BODY_BYTES = 1024 * 1024
_REASONS = {status.value: status.phrase for status in HTTPStatus}

# The answers of the server itself, before any look-alike sees the request.
HEAD_TOO_LARGE = error(400, "header too large", "invalid_request_error")
BAD_REQUEST_LINE = error(400, "bad request line", "invalid_request_error")
LENGTH_REQUIRED = error(400, "send a Content-Length", "invalid_request_error")
BODY_TOO_LARGE = error(413, "body too large", "invalid_request_error")


_STATUS_LINES: dict[int, bytes] = {}
_CLOSE = b"Connection: close\r\n"


def _status_line(status: int) -> bytes:
    """The status line and the headers llama-server's HTTP library puts on every answer."""
    found = _STATUS_LINES.get(status)
    if found is None:
        found = _STATUS_LINES[status] = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nServer: llama.cpp\r\n"
                                         "Access-Control-Allow-Origin: \r\n").encode()
    return found


def _lines(headers: Iterable[tuple[str, str]]) -> bytes:
    return "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")


def head(status: int, headers: Iterable[tuple[str, str]]) -> bytes:
    """A response head as llama-server's HTTP library writes it."""
    return _status_line(status) + _lines(headers) + b"\r\n"


@dataclass
class Stats:
    """Requests by path and connections accepted, over every site sharing this object."""

    requests: Counter[str] = field(default_factory=Counter)
    connections: int = 0
    started: float = field(default_factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": sum(self.requests.values()),
            "by_path": dict(self.requests),
            "connections": self.connections,
            "cpu_seconds": time.process_time(),
            "uptime_seconds": time.monotonic() - self.started,
        }


class Fault(Protocol):
    async def play(self, exchange: Exchange) -> bool:
        """Answer badly; True when the connection may serve another request."""


@dataclass(eq=False)
class Site:
    """One listening port: the look-alike behind it, faults on chosen paths, and what it received."""

    lookalike: Lookalike
    latency: float = 0.0
    """Seconds before every healthy answer."""
    token_delay: float = 0.0
    """Seconds between the events of a stream, as a server generating tokens takes."""
    keepalive_timeout: float = 5.0
    """llama-server closes a kept-alive connection idle this long (and says so in Keep-Alive)."""
    record: bool = True
    """Keep every request in `seen`; a fleet of a thousand only counts them in `stats`."""
    stats: Stats = field(default_factory=Stats)
    serve_stats: bool = False
    faults: dict[str, Fault] = field(default_factory=dict)
    seen: list[Request] = field(default_factory=list)
    open: set[_Connection] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.keep_alive = f"Keep-Alive: timeout={self.keepalive_timeout:g}, max={KEEPALIVE_MAX}\r\n".encode()

    async def listen(self, host: str = HOST, port: int = 0, tls: ssl.SSLContext | None = None) -> asyncio.Server:
        loop = asyncio.get_running_loop()
        return await loop.create_server(lambda: _Connection(self, loop, tls is not None), host, port, ssl=tls,
                                        reuse_address=True, backlog=256)

    def abort_connections(self) -> None:
        for connection in list(self.open):
            connection.abort()


async def close(server: asyncio.Server, sites: Iterable[Site]) -> None:
    """Stop listening and drop every open connection, a fault in play or not."""
    server.close()
    sites = list(sites)
    playing = [c.task for site in sites for c in site.open if c.task is not None]
    for site in sites:
        site.abort_connections()
    for task in playing:
        task.cancel()
    await asyncio.gather(*playing, return_exceptions=True)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.wait_closed(), 1.0)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, one request at a time; pipelined ones wait in the buffer."""

    def __init__(self, site: Site, loop: asyncio.AbstractEventLoop, tls: bool) -> None:
        self.site = site
        self.loop = loop
        self.tls = tls
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.fresh = True
        self.busy = False
        self.served = 0
        self.idle: asyncio.TimerHandle | None = None
        self.task: asyncio.Task | None = None
        self.paused = False
        self.resumed: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.site.stats.connections += 1
        self.site.open.add(self)
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.site.open.discard(self)
        if self.idle is not None:
            self.idle.cancel()
        if self.task is not None:
            self.task.cancel()
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_exception(ConnectionResetError("the client hung up"))

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.resumed is not None and not self.resumed.done():
            self.resumed.set_result(None)

    async def drain(self) -> None:
        if self.transport is None:
            raise ConnectionResetError("the client hung up")
        if self.paused:
            self.resumed = self.loop.create_future()
            await self.resumed

    def write(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionResetError("the client hung up")
        self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.fresh:
            self.fresh = False
            if not self.tls and data[:1] == b"\x16":
                # A TLS ClientHello on a plain port: answer as a plain HTTP server does, in clear text.
                self.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                self._close()
                return
        self.buffer += data
        if not self.busy:
            self._next_request()

    def _arm_idle(self) -> None:
        if self.idle is not None:
            self.idle.cancel()
        timeout = self.site.keepalive_timeout
        self.idle = self.loop.call_later(timeout, self._close) if timeout > 0 else None

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _next_request(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                self.send(HEAD_TOO_LARGE, close=True)
            return
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ", 2)
        except ValueError:
            self.send(BAD_REQUEST_LINE, close=True)
            return
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        if "chunked" in headers.get("transfer-encoding", "").lower() or not length.isdigit():
            self.send(LENGTH_REQUIRED, close=True)
            return
        if int(length) > MAX_BODY_BYTES:
            self.send(BODY_TOO_LARGE, close=True)
            return
        start, stop = end + 4, end + 4 + int(length)
        if len(self.buffer) < stop:
            return
        body = bytes(self.buffer[start:stop])
        del self.buffer[:stop]
        asked = headers.get("connection", "").lower()
        self.served += 1
        close = asked == "close" or (version == "HTTP/1.0" and asked != "keep-alive") or self.served >= KEEPALIVE_MAX
        self.busy = True
        if self.idle is not None:
            self.idle.cancel()
            self.idle = None
        path, _, query = target.partition("?")
        request = Request(method, path, dict(parse_qsl(query, keep_blank_values=True)) if query else {}, headers, body)
        site = self.site
        if path == STATS_PATH and site.serve_stats:
            self.send(json_answer(200, site.stats.as_dict()), close)
            return
        site.stats.requests[path] += 1
        if site.record:
            site.seen.append(request)
        faults = site.faults
        fault = (faults.get(path) or faults.get("*")) if faults else None
        if fault is not None:
            self.task = self.loop.create_task(self._play(fault, request, close))
            return
        answer = site.lookalike.answer(request)
        if site.latency > 0:
            self.loop.call_later(site.latency, self.send, answer, close, method == "HEAD")
        else:
            self.send(answer, close, method == "HEAD")

    async def _play(self, fault: Fault, request: Request, close: bool) -> None:
        try:
            keep = await fault.play(Exchange(self, request, close))
        except (ConnectionError, OSError):
            keep = False
        self.task = None
        if keep and self.transport is not None:
            self._finish(close)
        else:
            self.abort()

    def send(self, answer: Answer, close: bool, head_only: bool = False, *, framed: bool | None = None) -> None:
        """Write `answer` whole; a stream goes chunked, event by event (with the site's token delay), unless `framed` is False."""
        transport = self.transport
        if transport is None:
            return
        status, content_type, chunks, extra = answer
        top = _status_line(status) + (_lines(extra) if extra else b"")
        connection = _CLOSE if close else self.site.keep_alive
        if content_type == SSE if framed is None else framed:
            top += b"Content-Type: %s\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n%s\r\n" % (
                content_type.encode(), connection)
            framing = [b"%x\r\n%b\r\n" % (len(c), c) for c in chunks if c] + [b"0\r\n\r\n"]
            delay = self.site.token_delay
            if delay > 0 and not head_only:
                transport.write(top)
                self._trickle(framing, 0, delay, close)
                return
            transport.write(top if head_only else top + b"".join(framing))
        else:
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            top += b"Content-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (content_type.encode(), len(body), connection)
            transport.write(top if head_only else top + body)
        self._finish(close)

    def _trickle(self, chunks: list[bytes], index: int, delay: float, close: bool) -> None:
        if self.transport is None:
            return
        self.transport.write(chunks[index])
        if index + 1 == len(chunks):
            self._finish(close)
        else:
            self.loop.call_later(delay, self._trickle, chunks, index + 1, delay, close)

    def _finish(self, close: bool) -> None:
        self.busy = False
        if close:
            self._close()
            return
        self._arm_idle()
        if self.buffer:
            self._next_request()


class Exchange:
    """One request a fault answers: it writes to the client directly, or sends the healthy answer changed."""

    def __init__(self, connection: _Connection, request: Request, close: bool) -> None:
        self.connection = connection
        self.request = request
        self.closing = close

    def healthy(self) -> Answer:
        return self.connection.site.lookalike.answer(self.request)

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                headers: Iterable[tuple[str, str]] = ()) -> None:
        """A whole answer with a Content-Length, whatever its content type."""
        self.connection.send(Answer(status, content_type, (body,), tuple(headers)), self.closing, framed=False)

    def write(self, data: bytes) -> None:
        self.connection.write(data)

    async def drain(self) -> None:
        await self.connection.drain()

    def reset(self) -> None:
        """End the connection with a TCP reset, not an orderly close."""
        transport = self.connection.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # SO_LINGER 0 turns close() into an RST.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()


class LoopThread:
    """An event loop in a daemon thread: servers started from synchronous code live on it."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


_background: LoopThread | None = None
_background_lock = threading.Lock()


def background() -> LoopThread:
    """The one loop that hosts every FaultServer of the process."""
    global _background
    with _background_lock:
        if _background is None:
            _background = LoopThread("faultserver")
        return _background


class FaultServer:
    """A llama-server look-alike (a FakeLlama unless given another) on 127.0.0.1 that plays faults on chosen paths."""

    def __init__(self, fake: Lookalike | None = None, *, tls: ssl.SSLContext | None = None, latency: float = 0.0,
                 token_delay: float = 0.0, keepalive_timeout: float = 5.0) -> None:
        self.site = Site(fake or FakeLlama.plain(), latency=latency, token_delay=token_delay,
                         keepalive_timeout=keepalive_timeout)
        self.tls = tls
        self.port = 0
        self._server: asyncio.Server | None = None

    @property
    def fake(self) -> Lookalike:
        return self.site.lookalike

    @fake.setter
    def fake(self, lookalike: Lookalike) -> None:
        self.site.lookalike = lookalike

    @property
    def seen(self) -> list[Request]:
        return self.site.seen

    @property
    def url(self) -> str:
        return self.url_as("https" if self.tls else "http")

    def url_as(self, scheme: str) -> str:
        return f"{scheme}://{HOST}:{self.port}"

    def play(self, fault: Fault | None, *paths: str) -> FaultServer:
        """Answer `paths` (default: every path) with `fault`; None makes them healthy again."""
        for path in paths or ("*",):
            if fault is None:
                self.site.faults.pop(path, None)
            else:
                self.site.faults[path] = fault
        return self

    def healthy(self) -> FaultServer:
        self.site.faults.clear()
        return self

    def count(self, path: str | None = None) -> int:
        return sum(1 for s in list(self.seen) if path is None or s.path == path)

    def start(self) -> FaultServer:
        background().run(self._start())
        return self

    def stop(self) -> None:
        if self._server is not None:
            background().run(close(self._server, [self.site]))
            self._server = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        self._server = await self.site.listen(HOST, self.port, self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

