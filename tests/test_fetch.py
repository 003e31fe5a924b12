"""HTTP to llama-servers: the keep-alive race is retried once and nothing else is; HTTP errors name their path."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator

import httpx
import pytest

from specwatch.probe.client import new_client
from specwatch.probe.fetch import Fetcher
from specwatch.reasons import ProbeFailure, Reason

OK = json.dumps({"status": "ok"}).encode()


class DropsIdleConnections:
    """A server on a real socket that answers the first request of a connection and drops the connection when
    the next request arrives on it: a server closing a kept-alive connection just as the client reuses it."""

    def __init__(self, drop: str = "close", *, drop_after: float = 0.0, hang_new: bool = False) -> None:
        self.drop = drop
        """'close' (FIN, no answer), 'reset' (RST, no answer), or 'mid-body' (headers and half a body, then RST)."""
        self.drop_after = drop_after
        self.hang_new = hang_new
        """Whether a request on a second connection is never answered (to see the retry keep the deadline)."""
        self.requests = 0
        self.connections = 0
        self.url = ""
        self._server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> DropsIdleConnections:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection = self.connections
        served = 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                if connection > 1 and self.hang_new:
                    await asyncio.sleep(3600)
                if served == 1:
                    await asyncio.sleep(self.drop_after)
                    self._drop(writer)
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(OK) + OK)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def _drop(self, writer: asyncio.StreamWriter) -> None:
        if self.drop == "mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        if self.drop in ("reset", "mid-body"):
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if self.drop == "mid-body":
                # Let the head reach the client before the reset.
                asyncio.get_running_loop().call_later(0.1, writer.transport.abort)
                return
            writer.transport.abort()
        else:
            writer.close()


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    client = new_client()
    yield Fetcher(client, 1 << 20)
    await client.aclose()


@pytest.mark.parametrize("drop", ["close", "reset"])
async def test_a_dropped_kept_alive_connection_is_retried_once(fetcher: Fetcher, drop: str) -> None:
    async with DropsIdleConnections(drop) as server:
        assert await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5) == {"status": "ok"}
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == {"status": "ok"}
        assert (server.requests, server.connections) == (3, 2)
        # A canary's POST is retried the same way: the lost request was never read.
        assert await fetcher.post_json(f"{server.url}/completion", {"n_probs": 3}, headers={}, timeout=5) == {"status": "ok"}
        assert (server.requests, server.connections) == (5, 3)


async def test_an_answer_cut_off_after_it_started_is_not_retried(fetcher: Fetcher) -> None:
    async with DropsIdleConnections("mid-body") as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5)
        assert caught.value.reason is Reason.CONNECTION_RESET
        await asyncio.sleep(0.2)
        assert (server.requests, server.connections) == (2, 1)


async def test_a_timeout_is_not_retried(fetcher: Fetcher) -> None:
    async with DropsIdleConnections(drop_after=3600) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=0.5)
        assert caught.value.reason is Reason.TIMEOUT
        await asyncio.sleep(0.5)
        assert (server.requests, server.connections) == (2, 1)


async def test_the_retry_keeps_the_overall_deadline(fetcher: Fetcher) -> None:
    async with DropsIdleConnections(drop_after=0.5, hang_new=True) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=1.0)
        assert caught.value.reason is Reason.TIMEOUT
        assert loop.time() - started < 1.4
        assert (server.requests, server.connections) == (3, 2)  # it was retried, within the same second


async def test_a_refused_connection_is_not_retried() -> None:
    attempts = 0

    class Counting(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            nonlocal attempts
            attempts += 1
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    async with httpx.AsyncClient(transport=Counting()) as client:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json("http://127.0.0.1:9/health", headers={}, timeout=5)
    assert caught.value.reason is Reason.CONNECTION_REFUSED and attempts == 1


@pytest.mark.parametrize(("status", "reason"), [(404, Reason.NOT_FOUND), (401, Reason.UNAUTHORIZED), (500, Reason.SERVER_ERROR)])
async def test_an_http_error_names_its_path_not_its_query(status: int, reason: Reason) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, json={"error": {"code": status}}))
    async with httpx.AsyncClient(transport=transport) as client:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json("http://h:1/v1/props?model=secret-model&x=1", headers={}, timeout=5)
    assert caught.value.reason is reason
    assert caught.value.detail == f"HTTP {status} on /v1/props"
