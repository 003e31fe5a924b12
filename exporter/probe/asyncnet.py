"""Connections on asyncio's transports and protocols: what http1 reads from and writes to, failures raised as httpx's."""

from __future__ import annotations

import asyncio
import ssl

import httpx

# Bytes received and not yet read before the socket stops being read: a server that sends while nothing reads
# (an idle kept-alive connection) cannot grow the buffer past this.
_HIGH_WATER = 256 * 1024


class Received(asyncio.Protocol):
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
        self.transport = transport  # type: ignore[assignment]  # a stream protocol's is a stream transport (uvloop's too)

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
    def error(self) -> BaseException | None:
        """What ended the connection, if it did not end cleanly."""
        return self._error

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
            raise chained(httpx.ReadError(str(self._error) or self._error.__class__.__name__), self._error)
        return b""

    async def drain(self, timeout: float | None) -> None:
        writable = self._writable
        if writable is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(writable), timeout)
        except TimeoutError:
            raise httpx.WriteTimeout("timed out writing the request") from None


def chained(error: Exception, cause: BaseException | None) -> Exception:
    """`error` caused by `cause`, as its context too: the reason a failure maps to (reset, refused, TLS) is found along
    that chain."""
    if cause is not None:
        error.__cause__ = error.__context__ = cause
    return error


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(httpx.ReadTimeout("timed out waiting for the server's answer"))


async def connect(host: str, port: int, ssl_context: ssl.SSLContext | None, timeout: float) -> tuple[asyncio.Transport, Received]:
    """A connection to host:port (TLS with `ssl_context`), within `timeout` including the handshake."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                Received, host, port, ssl=ssl_context, ssl_handshake_timeout=timeout if ssl_context is not None else None)
    except TimeoutError as err:
        raise httpx.ConnectTimeout(f"no connection within {timeout:g}s") from err
    except OSError as err:  # ssl.SSLError and ConnectionError among them
        raise httpx.ConnectError(str(err) or err.__class__.__name__) from err
    return transport, protocol
