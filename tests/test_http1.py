"""A server's connection pool: kept-alive connections reused only while safe, a bound on connections, clean cancels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from specwatch.probe.http1 import DISCONNECTED, OriginPool

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
HEADERS = [(b"Host", b"127.0.0.1")]


class Server:
    """A loopback server that answers each request head with `answer(n)` (n counts requests), and counts connections."""

    def __init__(self, answer: Callable[[int], bytes | None] = lambda n: OK, *, close_after: bool = False) -> None:
        self.answer = answer
        self.close_after = close_after
        self.connections = 0
        self.requests = 0
        self.open = 0
        self.port = 0

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                data = self.answer(self.requests)
                if data is None:  # hang: read until the client gives up
                    await reader.read()
                    return
                writer.write(data)
                await writer.drain()
                if self.close_after:
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def pool_of(server: Server, *, limit: int = 4, expiry: float = 4.0) -> OriginPool:
    return OriginPool("127.0.0.1", server.port, None, limit=limit, expiry=expiry)


async def body(pool: OriginPool, timeout: float = 5.0) -> bytes:
    answer = await pool.exchange(b"GET", b"/props", HEADERS, b"", timeout)
    return b"".join([chunk async for chunk in answer.chunks()])


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with Server() as running:
        yield running


async def test_an_answer_read_to_its_end_leaves_its_connection_for_the_next(server: Server) -> None:
    pool = pool_of(server)
    assert [await body(pool) for _ in range(3)] == [b"ok"] * 3
    assert (server.connections, server.requests, pool.checked_out) == (1, 3, 0)
    pool.close()


async def test_an_expired_idle_connection_is_not_reused(server: Server) -> None:
    pool = pool_of(server, expiry=0.0)
    await body(pool)
    await body(pool)
    assert server.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async with Server(close_after=True) as server:
        pool = pool_of(server)
        await body(pool)
        for _ in range(50):  # the close reaches the client
            if server.open == 0:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert await body(pool) == b"ok"  # a new connection, not a failed request on the closed one
        assert server.connections == 2


async def test_an_answer_that_says_close_is_not_kept() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with Server(lambda n: closing) as server:
        pool = pool_of(server)
        await body(pool)
        await body(pool)
        assert server.connections == 2


async def test_an_answer_closed_before_its_end_closes_its_connection(server: Server) -> None:
    pool = pool_of(server)
    answer = await pool.exchange(b"GET", b"/props", HEADERS, b"", 5.0)
    answer.close()
    assert pool.checked_out == 0
    await body(pool)
    assert server.connections == 2


async def test_an_informational_answer_is_read_past() -> None:
    async with Server(lambda n: b"HTTP/1.1 100 Continue\r\n\r\n" + OK) as server:
        answer = await pool_of(server).exchange(b"GET", b"/props", HEADERS, b"", 5.0)
        assert answer.status == 200
        assert b"".join([c async for c in answer.chunks()]) == b"ok"


async def test_a_connection_closed_before_any_answer_says_so_as_httpx_does() -> None:
    async with Server(lambda n: b"", close_after=True) as server:
        with pytest.raises(httpx.RemoteProtocolError, match=DISCONNECTED):
            await body(pool_of(server))


async def test_a_body_cut_short_is_a_protocol_error() -> None:
    async with Server(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok", close_after=True) as server:
        pool = pool_of(server)
        with pytest.raises(httpx.RemoteProtocolError):
            await body(pool)
        assert pool.checked_out == 0


async def test_at_most_limit_exchanges_run_and_the_next_waits_for_one_to_end() -> None:
    async with Server(lambda n: None) as server:  # answers nothing: every exchange holds its connection
        pool = pool_of(server, limit=2)
        held = [asyncio.ensure_future(body(pool)) for _ in range(2)]
        while server.requests < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(httpx.PoolTimeout):
            await body(pool, timeout=0.2)
        assert (server.connections, pool.checked_out) == (2, 2)
        held[0].cancel()
        waiting = asyncio.ensure_future(body(pool))
        while server.requests < 3:  # the cancelled exchange gave its place to the waiting one
            await asyncio.sleep(0.01)
        for task in (held[1], waiting):
            task.cancel()
        await asyncio.gather(*held, waiting, return_exceptions=True)
        assert pool.checked_out == 0


async def test_a_cancelled_exchange_closes_its_socket() -> None:
    async with Server(lambda n: None) as server:
        pool = pool_of(server)
        task = asyncio.ensure_future(body(pool))
        while server.requests < 1:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(100):
            if server.open == 0:
                break
            await asyncio.sleep(0.01)
        assert (server.open, pool.checked_out) == (0, 0)


async def test_a_read_that_waits_too_long_is_a_read_timeout() -> None:
    async with Server(lambda n: None) as server:
        with pytest.raises(httpx.ReadTimeout):
            await body(pool_of(server), timeout=0.1)
