"""The probes' connections on asyncio: HTTPS, refused connections and timeouts map to the same reasons as before."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specwatch.probe.client import new_client
from specwatch.probe.fetch import Fetcher
from specwatch.probe.http1 import OriginPool
from specwatch.reasons import ProbeFailure, Reason
from tests.support.certs import make_certs, server_tls
from tests.support.net import free_port

OK = json.dumps({"status": "ok"}).encode()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(OK) + OK)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    certs = make_certs(tmp_path / "certs")
    server = await asyncio.start_server(_answer, "127.0.0.1", 0, ssl=server_tls(certs))
    yield f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}", certs.ca
    server.close()


async def test_a_refused_connection_leaves_its_pool_free() -> None:
    client = new_client()
    port = free_port()
    with pytest.raises(ProbeFailure) as caught:
        await Fetcher(client, 1 << 20).get_json(f"http://127.0.0.1:{port}/health", headers={}, timeout=2)
    assert caught.value.reason is Reason.CONNECTION_REFUSED
    pools = list(client._transport._pools.values())  # type: ignore[attr-defined]
    assert len(pools) == 1 and isinstance(pools[0], OriginPool) and pools[0].port == port and pools[0].idle
    await client.aclose()


async def test_https_with_a_trusted_certificate(tls_server: tuple[str, Path]) -> None:
    url, ca = tls_server
    client = new_client(verify=ssl.create_default_context(cafile=str(ca)))
    fetcher = Fetcher(client, 1 << 20)
    try:
        for _ in range(3):  # the second and third on the kept-alive TLS connection
            assert await fetcher.get_json(f"{url}/health", headers={}, timeout=5) == {"status": "ok"}
    finally:
        await client.aclose()


async def test_https_with_an_untrusted_certificate_is_a_tls_failure(tls_server: tuple[str, Path]) -> None:
    url, _ = tls_server
    client = new_client()  # the system's trust store: the test CA is not in it
    try:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json(f"{url}/health", headers={}, timeout=5)
    finally:
        await client.aclose()
    assert caught.value.reason is Reason.TLS


async def test_a_server_that_never_answers_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(10)
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = new_client()
    try:
        with pytest.raises(ProbeFailure) as caught:
            await Fetcher(client, 1 << 20).get_json(f"http://127.0.0.1:{port}/health", headers={}, timeout=0.5)
        assert caught.value.reason is Reason.TIMEOUT
    finally:
        await client.aclose()
        server.close()
