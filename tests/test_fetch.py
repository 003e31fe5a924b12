"""HTTP to llama-servers through aiohttp: what is resent and what never is, one deadline, cancellation, edge framing."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from specwatch.probe.http.client import CONNECTIONS_PER_SERVER, new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.reasons import ProbeFailure, Reason
from tests.support.fakes import serving

OK = json.dumps({"status": "ok"}).encode()
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(OK), OK)

Reply = Callable[[int, int, asyncio.StreamWriter], Awaitable[bool]]
"""How a raw server answers the n-th request of the c-th connection; False ends that connection."""


class RawServer:
    """A server on a real socket that answers each request as `reply` says, counting requests and connections."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.requests = 0
        self.connections = 0
        self.closed = 0
        """Connections the client closed (EOF or reset) while the server was waiting for a request."""
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        connection, served = self.connections, 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = next((int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.startswith("content-length:")), 0)
                await reader.readexactly(length)
                self.requests += 1
                served += 1
                if not await self.reply(connection, served, writer):
                    return
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed += 1
            writer.close()


def reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a TCP reset."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def drops_the_second(how: str, *, after: float = 0.0, hang_new: bool = False) -> Reply:
    """Answers the first request of a connection, then drops it at the next one: a server closing a kept-alive
    connection just as the client reuses it ('close': FIN, 'reset': RST, 'mid-body': half an answer, then RST)."""

    async def reply(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        if connection > 1 and hang_new:
            await asyncio.sleep(3600)
        if served == 1:
            writer.write(ANSWER)
            return True
        await asyncio.sleep(after)
        if how == "mid-body":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            await writer.drain()
            await asyncio.sleep(0.1)  # the head reaches the client before the reset
        if how == "close":
            writer.close()
        else:
            reset(writer)
        return False

    return reply


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    client = new_client()
    yield Fetcher(client, 1 << 20)
    await client.aclose()


@pytest.mark.parametrize("drop", ["close", "reset"])
async def test_a_get_on_a_dropped_kept_alive_connection_is_sent_once_more_by_the_library(fetcher: Fetcher, drop: str) -> None:
    async with RawServer(drops_the_second(drop)) as server:
        assert await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5) == {"status": "ok"}
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == {"status": "ok"}
        assert (server.requests, server.connections) == (3, 2)


@pytest.mark.parametrize("drop", ["close", "reset"])
async def test_a_post_the_server_may_have_acted_on_is_never_sent_again(fetcher: Fetcher, drop: str) -> None:
    """A canary makes the server generate: one the server read and dropped fails, and says how it failed."""
    async with RawServer(drops_the_second(drop, after=0.3)) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.post_json(f"{server.url}/completion", {"n_probs": 3}, headers={}, timeout=5)
        await asyncio.sleep(0.3)
        assert (server.requests, server.connections) == (2, 1)
    assert caught.value.reason is Reason.CONNECTION_RESET
    assert caught.value.detail.startswith(("ServerDisconnectedError", "ClientOSError")), caught.value.detail


async def test_an_answer_cut_off_after_it_started_is_not_sent_again(fetcher: Fetcher) -> None:
    async with RawServer(drops_the_second("mid-body")) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5)
        await asyncio.sleep(0.2)
        assert (server.requests, server.connections) == (2, 1)
    assert caught.value.reason is Reason.CONNECTION_RESET


async def test_a_timeout_is_not_sent_again(fetcher: Fetcher) -> None:
    async with RawServer(drops_the_second("close", after=3600)) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=0.5)
        assert caught.value.reason is Reason.TIMEOUT
        await asyncio.sleep(0.5)
        assert (server.requests, server.connections) == (2, 1)


async def test_the_second_send_keeps_the_one_deadline(fetcher: Fetcher) -> None:
    async with RawServer(drops_the_second("close", after=0.5, hang_new=True)) as server:
        await fetcher.get_json(f"{server.url}/health", headers={}, timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=1.0)
        assert caught.value.reason is Reason.TIMEOUT
        assert caught.value.detail == "no complete answer within 1s"
        assert loop.time() - started < 1.4
        assert (server.requests, server.connections) == (3, 2)  # sent again, within the same second


async def test_a_cancelled_exchange_closes_its_connection_and_frees_its_place(fetcher: Fetcher) -> None:
    held = asyncio.Event()

    async def hang_first(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        if connection <= CONNECTIONS_PER_SERVER:
            held.set()
            await asyncio.sleep(3600)
        writer.write(ANSWER)
        return True

    async with RawServer(hang_first) as server:
        waiting = [asyncio.create_task(fetcher.get_json(f"{server.url}/props", headers={}, timeout=30))
                   for _ in range(CONNECTIONS_PER_SERVER)]
        while server.requests < CONNECTIONS_PER_SERVER:
            await asyncio.sleep(0.01)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        # Every place was taken by a held exchange: one more goes through only if the cancelled ones gave theirs up.
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == {"status": "ok"}
        assert server.connections == CONNECTIONS_PER_SERVER + 1


async def test_bytes_after_an_answer_are_never_read_as_the_next_answer(fetcher: Fetcher) -> None:
    async def trailing(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        body = json.dumps({"connection": connection}).encode()
        extra = b"HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n{\"stale\":true}" if served == 1 else b""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b%b" % (len(body), body, extra))
        return True

    async with RawServer(trailing) as server:
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == {"connection": 1}
        second = await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5)
    assert (second, server.connections) == ({"connection": 2}, 2)  # the connection with bytes left over was not reused


async def test_a_stream_asked_to_close_never_lends_its_connection_to_the_next_request(fetcher: Fetcher) -> None:
    """A server (or a front end before it) that honours the stream's `Connection: close` without saying so closes a
    beat after the answer: a POST sent on that connection meanwhile would be lost, and a POST is never sent again."""
    async def closes_silently(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        body = b'data: {"content": "x"}\n\ndata: [DONE]\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        await asyncio.sleep(0.2)  # the client has its answer, and sends the next request before the close arrives
        writer.close()
        return False

    async with RawServer(closes_silently) as server:
        assert await fetcher.post_events(f"{server.url}/completion", {"stream": True}, headers={}, timeout=5) == [
            {"content": "x"}]
        assert await fetcher.post_events(f"{server.url}/completion", {"stream": True}, headers={}, timeout=5) == [
            {"content": "x"}]
    assert (server.requests, server.connections) == (2, 2)


async def test_a_chunked_answer_with_trailers_and_an_early_hint_is_read_whole(fetcher: Fetcher) -> None:
    async def chunked(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
                     b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\nX-Trailer: yes\r\n\r\n")
        return True

    async with RawServer(chunked) as server:
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == {"a": 1}


async def test_bad_chunking_is_a_failed_connection(fetcher: Fetcher) -> None:
    async def bad(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
        return True

    async with RawServer(bad) as server:
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5)
    assert caught.value.reason is Reason.CONNECTION_RESET


async def test_an_ipv6_literal_is_reached() -> None:
    async def answer(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        writer.write(ANSWER)
        return True

    server = await asyncio.start_server(lambda r, w: RawServer(answer)._serve(r, w), "::1", 0)
    port = server.sockets[0].getsockname()[1]
    async with new_client() as client:
        assert await Fetcher(client, 1 << 20).get_json(f"http://[::1]:{port}/props", headers={}, timeout=5) == {"status": "ok"}
    server.close()


async def test_a_closed_client_fails_an_exchange_in_flight_and_keeps_no_connection() -> None:
    async def hang(connection: int, served: int, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(3600)
        return False

    async with RawServer(hang) as server:
        client = new_client()
        pending = asyncio.create_task(Fetcher(client, 1 << 20).get_json(f"{server.url}/props", headers={}, timeout=30))
        while server.requests < 1:
            await asyncio.sleep(0.01)
        await client.aclose()
        with pytest.raises(ProbeFailure) as caught:
            await pending
    assert caught.value.reason is Reason.CONNECTION_RESET


@pytest.mark.parametrize(("status", "reason"), [(404, Reason.NOT_FOUND), (401, Reason.UNAUTHORIZED), (500, Reason.SERVER_ERROR)])
async def test_an_http_error_names_its_path_not_its_query(status: int, reason: Reason) -> None:
    async with serving(lambda request: httpx.Response(status, json={"error": {"code": status}}))() as client:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json("http://h:1/v1/props?model=secret-model&x=1", headers={}, timeout=5)
    assert caught.value.reason is reason
    assert caught.value.detail == f"HTTP {status} on /v1/props"


@pytest.mark.parametrize(("location", "named"), [
    ("https://sso.example/login?state=TOKEN-123&next=%2Fprops", "https://sso.example/login"),
    ("https://user:TOKEN-123@sso.example/a#TOKEN-123", "https://sso.example/a"),
    ("/props?token=TOKEN-123", "/props"),
])
async def test_a_redirect_is_named_by_scheme_host_and_path(location: str, named: str) -> None:
    async with serving(lambda request: httpx.Response(302, headers={"Location": location}))() as client:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json("http://h:1/props", headers={}, timeout=5)
    assert caught.value.reason is Reason.REDIRECT
    assert caught.value.detail == f"HTTP 302 on /props to {named!r}"
    assert "TOKEN" not in str(caught.value)
