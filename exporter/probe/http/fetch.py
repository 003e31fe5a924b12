"""Requests to llama-servers: JSON and server-sent events, bodies capped, one deadline per exchange, failures as reasons."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import orjson
from yarl import URL

from ...reasons import ProbeFailure, Reason
from . import sse
from .client import Client
from .failures import failure_of, location, status_reason
from .sse import parse_json

T = TypeVar("T")
NOT_LOADED_MESSAGE = b"model is not loaded"
_JSON = {"Content-Type": "application/json"}


@functools.lru_cache(maxsize=1 << 15)
def _parsed(url: str) -> URL:
    """A URL parsed once: a fleet asks the same few of each server at every poll (parsing was a tenth of a request)."""
    return URL(url)


@functools.lru_cache(maxsize=64)
def _read_timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=None, sock_read=seconds)


class HttpStatusFailure(ProbeFailure):
    """An answer whose status is not a success: its reason, and the status itself."""

    def __init__(self, reason: Reason, status: int, detail: str) -> None:
        super().__init__(reason, detail)
        self.status = status


class Fetcher:
    """Requests to one fleet through one shared client; every exchange ends by its deadline or fails with a reason."""

    def __init__(self, client: Client, max_bytes: int) -> None:
        self.client = client
        self.max_bytes = max_bytes

    def forget(self) -> None:
        """Drop what is kept per origin (name lookups, parsed URLs): servers a reload removed leave none of it behind."""
        self.client.forget_names()  # aiohttp keeps an expired lookup until that name is asked again
        _parsed.cache_clear()  # the fleet's URLs are parsed again once, at their next request

    async def get_json(self, url: str, *, headers: dict[str, str], timeout: float) -> Any:
        return await self._exchange("GET", url, None, headers, timeout, self._json)

    async def post_json(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> Any:
        return await self._exchange("POST", url, body, headers, timeout, self._json)

    async def post_events(self, url: str, body: Any, *, headers: dict[str, str], timeout: float) -> list[Any]:
        """The JSON payloads of a server-sent-event stream, up to `[DONE]` or the end."""
        return await self._exchange("POST", url, body, headers, timeout, self._events, closing=True)

    async def _exchange(
        self, method: str, url: str, body: Any, headers: dict[str, str], timeout: float,
        read: Callable[[aiohttp.ClientResponse], Awaitable[T]], *, closing: bool = False,
    ) -> T:
        """One request and its answer read by `read`, all within `timeout`; a cancelled exchange closes its connection.

        Nothing is sent again here. aiohttp itself resends a GET, once, when the connection dropped before any answer
        (a kept-alive connection the server closed as it was reused; RFC 9112 9.3.1); a POST, which makes the server
        generate, is never resent.
        """
        data = None
        if body is not None:
            data, headers = orjson.dumps(body), headers if "Content-Type" in headers else {**_JSON, **headers}
        try:
            async with asyncio.timeout(timeout):
                # One deadline for the exchange; the per-read timeout is the library's, and never the shorter.
                session = self.client.closing if closing else self.client.session
                async with session.request(
                    method, _parsed(url), data=data, headers=headers, allow_redirects=False, timeout=_read_timeout(timeout),
                ) as response:
                    try:
                        await _refuse_status(response)
                        return await read(response)
                    except BaseException:
                        response.close()  # a body not read to its end: the connection is not reused
                        raise
        except TimeoutError:
            raise ProbeFailure(Reason.TIMEOUT, f"no complete answer within {timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as err:
            raise failure_of(err) from None

    async def _json(self, response: aiohttp.ClientResponse) -> Any:
        return parse_json(await self._capped(response))

    async def _capped(self, response: aiohttp.ClientResponse) -> bytes:
        declared = response.content_length
        if declared is not None and declared > self.max_bytes:
            raise ProbeFailure(Reason.BODY_TOO_LARGE, f"declares {declared} bytes, cap is {self.max_bytes}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > self.max_bytes:
                raise ProbeFailure(Reason.BODY_TOO_LARGE, f"body exceeds the {self.max_bytes}-byte cap")
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _lines(self, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """The body's lines without line ends, counting raw bytes as they arrive: one endless line cannot grow past the cap."""
        size, pending = 0, b""
        async for chunk in response.content.iter_any():
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

    async def _events(self, response: aiohttp.ClientResponse) -> list[Any]:
        events: list[Any] = []
        decoder = sse.Decoder(self.max_bytes)
        async for line in self._lines(response):
            if _take(decoder.feed(line), events):
                return events
        _take(decoder.end(), events)
        return events


async def _refuse_status(response: aiohttp.ClientResponse) -> None:
    """Fail on an answer that is not a success; a router's "model is not loaded" is a state of the model."""
    reason = status_reason(response.status)
    if reason is None:
        return
    extra = ""
    if reason is Reason.REDIRECT and (where := response.headers.get("Location")):
        extra = f" to {location(where)!r}"
    if response.status == 400 and await _says_not_loaded(response):
        reason = Reason.NOT_LOADED
    # The path, never the query: it may name a model, or carry a token; a misconfigured URL is found by its path.
    raise HttpStatusFailure(reason, response.status, f"HTTP {response.status} on {response.url.path}{extra}")


async def _says_not_loaded(response: aiohttp.ClientResponse) -> bool:
    """Whether a 400 is a router's "model is not loaded" (asked with autoload=false): a state, not an error."""
    head = b""
    async for chunk in response.content.iter_any():
        head += chunk
        if len(head) > 4096:
            break
    return NOT_LOADED_MESSAGE in head


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
