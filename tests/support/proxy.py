"""A small reverse proxy on loopback for tests: round-robin per request or per connection, or /v1 only; every exchange timed."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tests.support.net import HOST


@dataclass(frozen=True)
class Exchange:
    """One request forwarded: its path and body, when it arrived and when its answer's end was sent (time.monotonic())."""

    path: str
    body: bytes
    arrived: float
    answered: float


class Proxy:
    """Forwards each HTTP/1.1 request to one of `upstreams`, as a load balancer or an OpenAI-only gateway would.

    `per="request"` picks the next upstream for every request, `per="connection"` once per client connection.
    `v1_only` answers 404 to everything outside /v1/*, as LiteLLM-style gateways do.
    """

    def __init__(self, upstreams: Sequence[str], *, per: str = "request", v1_only: bool = False) -> None:
        self.upstreams = list(upstreams)
        self.per = per
        self.v1_only = v1_only
        self._turn = itertools.cycle(range(len(self.upstreams)))
        self.served: list[tuple[str, str]] = []
        """(upstream, path) of every request forwarded."""
        self.exchanges: list[Exchange] = []
        """Every request forwarded and answered, in the order their answers ended."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> Proxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._connection, HOST, 0), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        fixed = self.upstreams[next(self._turn)] if self.per == "connection" else None
        async with httpx.AsyncClient(timeout=120) as client:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ", 2)
                    headers = {}
                    for line in head.decode().split("\r\n")[1:]:
                        if ":" in line:
                            name, value = line.split(":", 1)
                            headers[name.strip().lower()] = value.strip()
                    body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                    if not await self._forward(client, writer, fixed, method, target, headers, body):
                        break
        writer.close()

    async def _forward(self, client: httpx.AsyncClient, writer: asyncio.StreamWriter, fixed: str | None, method: str,
                       target: str, headers: dict[str, str], body: bytes) -> bool:
        if self.v1_only and not target.startswith("/v1/"):
            answer = b'{"detail":"Not Found"}'
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()
            return True
        upstream = fixed or self.upstreams[next(self._turn)]
        arrived = time.monotonic()
        self.served.append((upstream, target.split("?", 1)[0]))
        forwarded = {k: v for k, v in headers.items() if k in ("authorization", "content-type", "accept")}
        async with client.stream(method, upstream + target, headers=forwarded, content=body) as answer:
            writer.write(f"HTTP/1.1 {answer.status_code} {answer.reason_phrase}\r\n".encode())
            writer.write(f"Content-Type: {answer.headers.get('content-type', 'application/json')}\r\n".encode())
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
            async for chunk in answer.aiter_raw():
                if chunk:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    await writer.drain()
            answered = time.monotonic()  # before the answer's end goes: the client cannot have read it all earlier
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        self.exchanges.append(Exchange(target.split("?", 1)[0], body, arrived, answered))
        return headers.get("connection", "").lower() != "close"
