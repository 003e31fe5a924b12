"""HTTP/1.1 exchanges with one server: h11 on asyncio's protocols, a few kept-alive connections per server origin.

A poll is one or two small GETs on a new connection (llama-server drops idle ones after 5 s). httpcore's pool, its
connection state machine and its network-stream layers cost twice the CPU of the exchange itself; this is the part of
them a probe uses. Failures are raised as the httpx exceptions httpx raises for them, chained to the OSError, SSLError
or h11 error behind them, so they map to the same reasons (fetch.classify_transport_error).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Sequence

import h11
import httpx

from .asyncnet import Received, chained, connect

READ_BYTES = 64 * 1024
DISCONNECTED = "Server disconnected without sending a response."
"""httpx's words for a connection closed before any answer: what fetch.dropped_before_answer looks for."""

Headers = Sequence[tuple[bytes, bytes]]


class Connection:
    """One connection to a server, with its h11 state; used by one exchange at a time."""

    __slots__ = ("h11", "idle_since", "protocol", "transport")

    def __init__(self, transport: asyncio.Transport, protocol: Received) -> None:
        self.transport = transport
        self.protocol = protocol
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    def reusable(self, now: float, expiry: float) -> bool:
        """Idle for less than `expiry`, and the server has neither closed it nor sent anything unasked."""
        return now - self.idle_since < expiry and not self.protocol.readable and not self.transport.is_closing()

    def close(self) -> None:
        self.transport.close()

    def _bytes(self, event: h11.Event) -> bytes:
        try:
            return self.h11.send(event) or b""
        except h11.LocalProtocolError as err:
            raise chained(httpx.LocalProtocolError(str(err)), err) from None

    async def request(self, method: bytes, target: bytes, headers: Headers, body: bytes, timeout: float) -> h11.Response:
        """Send one request (its head and body in one write) and read up to its answer's headers."""
        data = self._bytes(h11.Request(method=method, target=target, headers=list(headers)))
        if body:
            data += self._bytes(h11.Data(data=body))
        data += self._bytes(h11.EndOfMessage())
        if self.transport.is_closing():
            raise chained(httpx.WriteError("the connection is closed"), self.protocol.error)
        self.transport.write(data)
        await self.protocol.drain(timeout)
        while True:
            event = await self.next_event(timeout, answered=False)
            if isinstance(event, h11.Response):
                return event
            # An InformationalResponse (100 Continue, 103 Early Hints) comes before the answer: read on.

    async def next_event(self, timeout: float, *, answered: bool = True) -> h11.Event:
        """The next event of the answer, reading from the socket as h11 needs."""
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as err:
                raise chained(httpx.RemoteProtocolError(str(err)), err) from None
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.protocol.read(READ_BYTES, timeout)
            if not data and not answered:
                raise chained(httpx.RemoteProtocolError(DISCONNECTED), self.protocol.error)
            self.h11.receive_data(data)


class Answer:
    """An answer whose headers were read: its body is read chunk by chunk, and its connection goes back to the pool once
    the body was read to the end, or is closed."""

    __slots__ = ("_connection", "_pool", "_timeout", "headers", "status")

    def __init__(self, pool: OriginPool, connection: Connection, response: h11.Response, timeout: float) -> None:
        self.status = response.status_code
        self.headers: list[tuple[bytes, bytes]] = list(response.headers)  # lower-cased names (h11 normalises them)
        self._pool = pool
        self._connection: Connection | None = connection
        self._timeout = timeout

    async def chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        try:
            while True:
                event = await connection.next_event(self._timeout)
                if isinstance(event, h11.Data):
                    if event.data:
                        yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    self._release(reuse=True)
                    return
                else:  # ConnectionClosed before the end: h11 raises for a framed body, so this is a body cut by a close
                    self._release(reuse=False)
                    return
        except BaseException:
            self._release(reuse=False)
            raise

    def close(self) -> None:
        """Done with the answer: a body not read to its end leaves its connection closed."""
        self._release(reuse=False)

    def _release(self, *, reuse: bool) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection, reuse=reuse)


class OriginPool:
    """Connections to one (scheme, host, port): at most `limit` at once, idle ones kept for `expiry` seconds."""

    __slots__ = ("_busy", "_idle", "_waiters", "expiry", "host", "limit", "port", "ssl")

    def __init__(self, host: str, port: int, ssl_context: ssl.SSLContext | None, *, limit: int, expiry: float) -> None:
        self.host, self.port, self.ssl = host, port, ssl_context
        self.limit, self.expiry = limit, expiry
        self._idle: list[Connection] = []
        self._busy = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def checked_out(self) -> int:
        """Exchanges in flight, each on a connection of its own."""
        return self._busy

    @property
    def idle(self) -> bool:
        """No exchange in flight: the pool may be closed without cutting one."""
        return self._busy == 0

    async def exchange(
        self, method: bytes, target: bytes, headers: Headers, body: bytes, timeout: float
    ) -> Answer:
        """Send one request and read its answer's headers, on a kept-alive connection or a new one."""
        await self._take_slot(timeout)
        connection: Connection | None = None
        try:
            connection = self._reuse() or await self._connect(timeout)
            response = await connection.request(method, target, headers, body, timeout)
        except BaseException:
            if connection is not None:
                connection.close()
            self._free()
            raise
        return Answer(self, connection, response, timeout)

    def release(self, connection: Connection, *, reuse: bool) -> None:
        """An exchange ended: its connection is kept for the next one when both sides are done and it may stay open."""
        state = connection.h11
        if reuse and state.our_state is h11.DONE and state.their_state is h11.DONE and not connection.transport.is_closing():
            state.start_next_cycle()
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        self._free()

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    async def _take_slot(self, timeout: float) -> None:
        if self._busy >= self.limit:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while self._busy >= self.limit:
                waiter = loop.create_future()
                self._waiters.append(waiter)
                try:
                    async with asyncio.timeout_at(deadline):
                        await waiter
                except TimeoutError:
                    raise httpx.PoolTimeout(f"no connection to the server free within {timeout:g}s") from None
                finally:
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)
        self._busy += 1

    def _free(self) -> None:
        """An exchange's place is free: every waiter looks again."""
        self._busy -= 1
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _reuse(self) -> Connection | None:
        """The most recently used idle connection that can still carry a request; the others are closed."""
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if connection.reusable(now, self.expiry):
                return connection
            connection.close()
        return None

    async def _connect(self, timeout: float) -> Connection:
        transport, protocol = await connect(self.host, self.port, self.ssl, timeout)
        return Connection(transport, protocol)
