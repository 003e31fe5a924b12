"""HTTP to llama-servers with capped bodies, overall deadlines and failures mapped to reasons."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx

from ..reasons import ProbeFailure, Reason
from . import client as pools
from . import direct, sse
from .client import PerServerTransport
from .sse import parse_json

T = TypeVar("T")


def _cause_chain(err: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = err
    while current is not None and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


_NO_ROUTE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})


def classify_transport_error(err: Exception) -> Reason:
    """The closed-set reason for an httpx transport failure."""
    if isinstance(err, httpx.TimeoutException):
        return Reason.TIMEOUT
    chain = _cause_chain(err)
    # A server whose link is down first looks like a timeout (packets vanish), then, once the neighbour entry has
    # failed, the kernel says "No route to host": not a reset, which would send on-call to the server.
    if any(isinstance(e, OSError) and e.errno in _NO_ROUTE for e in chain):
        return Reason.UNREACHABLE
    if any(isinstance(e, socket.gaierror) for e in chain):
        return Reason.DNS
    if any(isinstance(e, ssl.SSLError | ssl.CertificateError) for e in chain):
        return Reason.TLS
    text = " ".join(str(e) for e in chain).lower()
    if "name or service not known" in text or "nodename nor servname" in text or "temporary failure in name resolution" in text:
        return Reason.DNS
    if "ssl" in text or "certificate" in text:
        return Reason.TLS
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "connection refused" in text:
        return Reason.CONNECTION_REFUSED
    if "no route to host" in text or "network is unreachable" in text:
        return Reason.UNREACHABLE
    return Reason.CONNECTION_RESET


def dropped_before_answer(err: Exception) -> bool:
    """Whether the server dropped the connection before any of its answer arrived (reset, or closed without a response).

    A server that closes an idle kept-alive connection races the next request sent on it: the request is lost
    unread, and sending it again on a new connection is safe. A timeout, a refused connection, or an answer cut
    off once it started (the error then comes from reading the body) is the server's answer and is never retried.
    """
    if isinstance(err, httpx.TimeoutException | httpx.ConnectError):
        return False
    if isinstance(err, httpx.RemoteProtocolError):
        return "without sending a response" in str(err)
    if isinstance(err, httpx.ReadError | httpx.WriteError):
        return any(isinstance(e, ConnectionResetError | BrokenPipeError | ConnectionAbortedError) for e in _cause_chain(err))
    return False


def _transport_failure(err: httpx.TransportError) -> ProbeFailure:
    reason = classify_transport_error(err)
    return ProbeFailure(reason, f"{err.__class__.__name__}: {str(err)[:200] or reason.value}")


def _status_reason(status: int) -> Reason | None:
    if status < 300:
        return None
    if status < 400:
        return Reason.REDIRECT
    if status in (401, 403):
        return Reason.UNAUTHORIZED
    if status == 404:
        return Reason.NOT_FOUND
    if status == 501:
        return Reason.NOT_SUPPORTED
    if status == 503:
        return Reason.LOADING
    if status >= 500:
        return Reason.SERVER_ERROR
    return Reason.CLIENT_ERROR


async def _bounded(exchange: Coroutine[Any, Any, T], timeout: float) -> T:
    """`exchange`'s answer, or TIMEOUT after `timeout`: the exchange is cancelled there, its connection closed (http1)."""
    try:
        async with asyncio.timeout(timeout):
            return await exchange
    except TimeoutError:
        raise ProbeFailure(Reason.TIMEOUT, f"no complete answer within {timeout:g}s") from None


def _check_deadline(deadline: float, timeout: float) -> None:
    if asyncio.get_running_loop().time() > deadline:
        raise ProbeFailure(Reason.TIMEOUT, f"no complete answer within {timeout:g}s")


NOT_LOADED_MESSAGE = b"model is not loaded"


async def _says_not_loaded(response: httpx.Response) -> bool:
    """Whether a 400 is a router's "model is not loaded" (asked with autoload=false): a state, not an error."""
    head = b""
    async for chunk in response.aiter_bytes():
        head += chunk
        if len(head) > 4096:
            break
    return NOT_LOADED_MESSAGE in head


class Fetcher:
    """Requests to one fleet through one shared client."""

    def __init__(self, client: httpx.AsyncClient, max_bytes: int) -> None:
        self.client = client
        self.max_bytes = max_bytes
        # A client of new_client() is sent to through its transport's pools directly (see direct.py): its auth,
        # redirect, cookie and hook layers do nothing for it, and with URL parsing they cost about 150 us of CPU per request.
        transport = getattr(client, "_transport", None)
        self._direct = transport if isinstance(transport, PerServerTransport) and not client.event_hooks["request"] else None
        self._headers = dict(client.headers)
        # Parsed URLs, in two generations: one unused for an IDLE_POOL_SECONDS is dropped with the older generation,
        # so the URLs of servers that went away do not pile up.
        self._urls: dict[str, direct.Target] = {}
        self._older_urls: dict[str, direct.Target] = {}
        self._urls_since = time.monotonic()

    def _url(self, url: str) -> direct.Target:
        found = self._urls.get(url)
        if found is None:
            found = self._urls[url] = self._older_urls.get(url) or direct.Target(url)
        now = time.monotonic()
        if now - self._urls_since >= pools.IDLE_POOL_SECONDS:  # the pools' idle time, read when used
            self._older_urls, self._urls, self._urls_since = self._urls, {}, now
        return found

    async def _send_direct(
        self, transport: PerServerTransport, method: str, url: str, headers: dict[str, str], timeout: float, body: Any
    ) -> httpx.Response:
        """What client.send(client.build_request(...), stream=True) does for a client of new_client()."""
        merged = {**self._headers, **{name.lower(): value for name, value in headers.items()}}
        # An Answer reads as the Response the fetcher would get: status_code, headers.get, aiter_bytes, aclose.
        return await direct.send(transport, self._url(url), method, merged, timeout, body)  # type: ignore[return-value]

    @asynccontextmanager
    async def _open(
        self, method: str, url: str, *, headers: dict[str, str], timeout: float, deadline: float, body: Any = None
    ) -> AsyncIterator[httpx.Response]:
        # httpx timeouts apply per read; a body that trickles in meets the overall deadline in the read loops.
        response = await self._send(method, url, headers=headers, timeout=timeout, deadline=deadline, body=body)
        try:
            reason = _status_reason(response.status_code)
            if reason is not None:
                where = response.headers.get("location", "")
                extra = f" to {where[:100]!r}" if reason is Reason.REDIRECT and where else ""
                if response.status_code == 400 and await _says_not_loaded(response):
                    reason = Reason.NOT_LOADED
                # The path, never the query: it may name a model, and a misconfigured URL is found by its path.
                raise ProbeFailure(reason, f"HTTP {response.status_code} on {response.request.url.path}{extra}")
            yield response
        except httpx.TransportError as err:
            raise _transport_failure(err) from None
        finally:
            await response.aclose()

    async def _send(
        self, method: str, url: str, *, headers: dict[str, str], timeout: float, deadline: float, body: Any
    ) -> httpx.Response:
        """The response, its headers read; a connection dropped before any answer is tried once more, by the deadline."""
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            remaining = min(timeout, deadline - loop.time())
            if remaining <= 0:
                raise ProbeFailure(Reason.TIMEOUT, f"no complete answer within {timeout:g}s")
            try:
                if self._direct is not None:
                    return await self._send_direct(self._direct, method, url, headers, remaining, body)
                request = self.client.build_request(method, url, headers=headers, json=body, timeout=httpx.Timeout(remaining))
                return await self.client.send(request, stream=True)
            except httpx.TransportError as err:
                if attempt == 1 and dropped_before_answer(err):
                    continue
                raise _transport_failure(err) from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _read_capped(self, response: httpx.Response, deadline: float, timeout: float) -> bytes:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            raise ProbeFailure(Reason.BODY_TOO_LARGE, f"declares {declared} bytes, cap is {self.max_bytes}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            _check_deadline(deadline, timeout)
            size += len(chunk)
            if size > self.max_bytes:
                raise ProbeFailure(Reason.BODY_TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
            chunks.append(chunk)
        return b"".join(chunks)

    async def get_json(self, url: str, *, headers: dict[str, str], timeout: float) -> Any:
        return await _bounded(self._get_json(url, headers=headers, timeout=timeout), timeout)

    async def post_json(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> Any:
        return await _bounded(self._post_json(url, body, headers=headers, timeout=timeout), timeout)

    async def post_events(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> list[Any]:
        """The JSON payloads of a server-sent-event stream, up to `[DONE]` or the end."""
        return await _bounded(self._post_events(url, body, headers=headers, timeout=timeout), timeout)

    async def _get_json(self, url: str, *, headers: dict[str, str], timeout: float) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        async with self._open("GET", url, headers=headers, timeout=timeout, deadline=deadline) as response:
            return parse_json(await self._read_capped(response, deadline, timeout))

    async def _post_json(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        async with self._open("POST", url, headers=headers, timeout=timeout, deadline=deadline, body=body) as response:
            return parse_json(await self._read_capped(response, deadline, timeout))

    async def _capped_lines(self, response: httpx.Response, deadline: float, timeout: float) -> AsyncIterator[bytes]:
        """The body's lines without line ends, counting raw bytes as they arrive: one endless line cannot grow past the cap."""
        size, pending = 0, b""
        async for chunk in response.aiter_bytes():
            _check_deadline(deadline, timeout)
            size += len(chunk)
            if size > self.max_bytes:
                raise ProbeFailure(Reason.BODY_TOO_LARGE, f"stream exceeds the {self.max_bytes}-byte cap")
            if b"\n" not in chunk:
                pending += chunk
                continue
            *lines, rest = (pending + chunk if pending else chunk).split(b"\n")
            pending = rest
            for line in lines:
                yield line.rstrip(b"\r")
        if pending:
            yield pending.rstrip(b"\r")

    async def _post_events(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> list[Any]:
        deadline = asyncio.get_running_loop().time() + timeout
        events: list[Any] = []
        decoder = sse.Decoder(self.max_bytes)
        async with self._open("POST", url, headers=headers, timeout=timeout, deadline=deadline, body=body) as response:
            async for line in self._capped_lines(response, deadline, timeout):
                if _take(decoder.feed(line), events):
                    return events
        _take(decoder.end(), events)
        return events


def _take(items: tuple[sse.Item, ...], events: list[Any]) -> bool:
    """Each event's payload appended to `events`; True at `[DONE]`, the end of the stream."""
    for item in items:
        if isinstance(item, sse.Event) and item.done:
            return True
        events.append(_payload(item))
    return False


def _payload(item: sse.Item) -> Any:
    """The live canary's reading of a stream's item: an error, sent as a line or as an event, is the server's failure."""
    if isinstance(item, sse.Event):
        event = parse_json(item.data)
        if isinstance(event, dict) and "error" in event:
            raise ProbeFailure(Reason.SERVER_ERROR, f"stream error: {str(event['error'])[:200]}")
        return event
    if isinstance(item, sse.StreamError):
        raise ProbeFailure(Reason.SERVER_ERROR, f"stream error: {item.text[:200]}")
    raise ProbeFailure(Reason.BODY_TOO_LARGE, f"an event exceeds the {item.cap}-byte cap")
