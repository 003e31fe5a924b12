"""An httpcore network backend on asyncio's transports and protocols, without anyio's per-read cancel scopes."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

# Bytes received and not yet read before the socket stops being read: a server that sends while nothing reads
# (an idle kept-alive connection) cannot grow the buffer past this.
_HIGH_WATER = 256 * 1024


class _Protocol(asyncio.Protocol):
    """Received bytes in a buffer, one reader waiting for them; the transport's writes wait while it is paused."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._reader: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # create_connection gives a stream protocol a stream transport
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # the transport closes itself: a server that stopped sending is done with the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        if exc is not None:
            self._error = exc
        self._wake()
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    def _wake(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    @property
    def readable(self) -> bool:
        """Something to read, or the end: what an idle kept-alive connection must not have."""
        return bool(self._buffer) or self._eof or self._error is not None

    async def read(self, max_bytes: int, timeout: float | None) -> bytes:
        if not self._buffer and not self._eof and self._error is None:
            loop = asyncio.get_running_loop()
            self._reader = waiter = loop.create_future()
            timer = loop.call_later(timeout, _expire, waiter) if timeout is not None else None
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                self._reader = None
        if self._buffer:
            data = bytes(self._buffer[:max_bytes])
            del self._buffer[:max_bytes]
            if self._paused and len(self._buffer) <= _HIGH_WATER // 2 and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
            return data
        if self._error is not None:
            raise _chained(httpcore.ReadError(str(self._error) or self._error.__class__.__name__), self._error)
        return b""

    async def drain(self, timeout: float | None) -> None:
        writable = self._writable
        if writable is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(writable), timeout)
        except TimeoutError:
            raise httpcore.WriteTimeout("timed out writing the request") from None


def _chained(error: Exception, cause: BaseException | None) -> Exception:
    """`error` caused by `cause`, as its context too: httpcore's pool re-raises with `from None`, which keeps only the
    context, and the reason a failure maps to (reset, refused, TLS) is found along that chain."""
    error.__cause__ = error.__context__ = cause
    return error


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpcore.ReadTimeout("timed out waiting for the server's answer"))


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._protocol.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        if self._transport.is_closing():
            raise _chained(httpcore.WriteError("the connection is closed"), self._protocol._error)
        try:
            self._transport.write(buffer)
        except (OSError, RuntimeError) as err:
            raise httpcore.WriteError(str(err)) from err
        await self._protocol.drain(timeout)

    async def aclose(self) -> None:
        self._transport.close()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._protocol, ssl_context, server_hostname=server_hostname,
                    ssl_handshake_timeout=timeout,
                )
        except TimeoutError as err:
            self._transport.close()
            raise httpcore.ConnectTimeout("timed out in the TLS handshake") from err
        except (OSError, ssl.SSLError, ConnectionError) as err:
            self._transport.close()
            raise httpcore.ConnectError(str(err) or err.__class__.__name__) from err
        if transport is None:
            raise httpcore.ConnectError("the TLS handshake ended the connection")
        self._protocol.transport = transport
        return AsyncioStream(transport, self._protocol)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":
            return self._protocol.readable
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """Connections for httpcore straight on the running asyncio loop.

    httpcore's default backend goes through anyio, which opens a cancel scope, asks sniffio for the event loop and
    checks for cancellation around every read and write: a fifth of a poll's CPU. Failures are raised as the same
    httpcore exceptions, chained to the OSError or SSLError behind them, so they map to the same reasons.
    """

    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await loop.create_connection(_Protocol, host, port, local_addr=local)
        except TimeoutError as err:
            raise httpcore.ConnectTimeout(f"no connection within {timeout:g}s") from err
        except OSError as err:
            raise httpcore.ConnectError(str(err) or err.__class__.__name__) from err
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
