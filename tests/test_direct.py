"""Requests sent straight to the per-server pools read as httpx's did: the request on the wire, encodings, chunks, failures."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from collections.abc import AsyncIterator, Callable

import pytest

from specwatch.probe.client import new_client
from specwatch.probe.fetch import Fetcher
from specwatch.reasons import ProbeFailure, Reason

BODY = {"status": "ok", "text": "caf\u00e9"}


class OneShot:
    """A loopback server that answers each request with what `answer` makes of its head and body, and keeps both."""

    def __init__(self, answer: Callable[[str, bytes], bytes], *, close: bool = False) -> None:
        self.answer = answer
        self.close = close
        """Whether the connection is closed after each answer (a server that dies half-way through one)."""
        self.seen: list[tuple[str, bytes]] = []
        self.url = ""

    async def __aenter__(self) -> OneShot:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next((int(line.split(":", 1)[1]) for line in head.lower().split("\r\n")
                               if line.startswith("content-length:")), 0)
                body = await reader.readexactly(length)
                self.seen.append((head, body))
                writer.write(self.answer(head, body))
                await writer.drain()
                if self.close:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _answer(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = "".join(f"{h}\r\n" for h in (*headers, f"Content-Length: {len(body)}"))
    return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{lines}\r\n".encode() + body


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    client = new_client()
    fetcher = Fetcher(client, 1 << 20)
    assert fetcher._direct is not None  # the path under test
    yield fetcher
    await client.aclose()


async def test_a_post_goes_out_as_httpx_sent_it(fetcher: Fetcher) -> None:
    async with OneShot(lambda head, body: _answer(json.dumps(BODY).encode())) as server:
        got = await fetcher.post_json(f"{server.url}/completion?autoload=false", {"prompt": "caf\u00e9", "n": 3},
                                      headers={"Authorization": "Bearer k"}, timeout=5)
    assert got == BODY
    head, body = server.seen[0]
    lines = head.split("\r\n")
    assert lines[0] == "POST /completion?autoload=false HTTP/1.1"
    fields = {line.split(":", 1)[0].lower(): line.split(":", 1)[1].strip() for line in lines[1:] if line}
    assert fields["host"] == server.url.removeprefix("http://")
    assert fields["content-type"] == "application/json" and int(fields["content-length"]) == len(body)
    assert fields["authorization"] == "Bearer k" and fields["user-agent"] == "specwatch"
    assert fields["accept-encoding"] == "gzip, deflate"
    assert json.loads(body) == {"prompt": "caf\u00e9", "n": 3}


async def test_a_get_has_no_body_and_reuses_the_connection(fetcher: Fetcher) -> None:
    async with OneShot(lambda head, body: _answer(json.dumps(BODY).encode())) as server:
        for _ in range(3):
            assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == BODY
    assert [body for _, body in server.seen] == [b"", b"", b""]
    assert all("content-length" not in head.lower() for head, _ in server.seen)
    assert len(fetcher._direct) == 1  # type: ignore[arg-type]  # one server, one pool


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_a_compressed_answer_is_decoded(fetcher: Fetcher, encoding: str) -> None:
    plain = json.dumps(BODY).encode()
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    async with OneShot(lambda head, body: _answer(packed, f"Content-Encoding: {encoding}")) as server:
        assert await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5) == BODY


async def test_a_chunked_stream_is_read_event_by_event(fetcher: Fetcher) -> None:
    events = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\ndata: [DONE]\n\n']
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with OneShot(lambda h, b: head + chunked) as server:
        got = await fetcher.post_events(f"{server.url}/completion", {"stream": True}, headers={}, timeout=5)
    assert got == [{"n": 1}, {"n": 2}]


async def test_an_http_error_names_its_path_not_its_query(fetcher: Fetcher) -> None:
    async with OneShot(lambda head, body: _answer(b'{"error": {}}', status="404 Not Found")) as server:
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props?model=secret", headers={}, timeout=5)
    assert caught.value.reason is Reason.NOT_FOUND and caught.value.detail == "HTTP 404 on /props"


async def test_an_answer_cut_short_fails_as_httpx_failed_it(fetcher: Fetcher) -> None:
    async with OneShot(lambda head, body: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{", close=True) as server:
        with pytest.raises(ProbeFailure) as caught:
            await fetcher.get_json(f"{server.url}/props", headers={}, timeout=5)
    assert caught.value.reason is Reason.CONNECTION_RESET
    assert caught.value.detail.startswith("RemoteProtocolError: ")  # httpx's name for it, as before
