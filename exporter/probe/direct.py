"""Requests sent straight to a server's httpcore pool: what the fetcher reads of httpx's layers, without them.

httpx builds a Request (headers, URL, stream), wraps httpcore's answer in a Response and runs every chunk through a
decoder and a chunker: at 1,000 servers that was a sixth of a poll's CPU for nothing a poll needs. Failures are raised
as the httpx exceptions httpx would raise, chained to httpcore's, so they map to the same reasons.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpcore
import httpx

from .client import PerServerTransport

ENCODINGS = "gzip, deflate"
"""What an answer may be compressed with: httpx decodes these; any encoding goes through httpx's own Response."""

_MAPPED: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    # Most specific first, as httpx picks the most derived match.
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def as_httpx(err: Exception) -> Exception:
    """The httpx exception httpx raises for httpcore's `err` (`err` itself when httpx passes it on), chained to it."""
    for core, mapped in _MAPPED:
        if isinstance(err, core):
            raised = mapped(str(err))
            raised.__cause__ = raised.__context__ = err
            return raised
    return err


class Target:
    """One server URL, parsed once: what each request to it is addressed with."""

    __slots__ = ("core", "host", "origin", "url")

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        self.url = parsed
        """The httpx URL: what an error message reads its path from (`response.request.url.path`)."""
        self.origin = (parsed.raw_scheme, parsed.raw_host, parsed.port)
        self.host = parsed.netloc
        self.core = httpcore.URL(scheme=parsed.raw_scheme, host=parsed.raw_host, port=parsed.port, target=parsed.raw_path)


class _Headers:
    """An answer's headers, looked up by name as httpx's are (case-insensitively); the fetcher asks for one or two."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        key = name.lower().encode()
        for found, value in self.raw:
            if found.lower() == key:
                return value.decode("latin-1")
        return default


async def _mapped_chunks(stream: Any) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            if chunk:
                yield chunk
    except Exception as err:
        raised = as_httpx(err)
        if raised is err:
            raise
        raise raised from err


class Answer:
    """httpcore's answer with what the fetcher reads of an httpx Response: status_code, headers.get, aiter_bytes, aclose
    and request.url."""

    __slots__ = ("_closed", "_stream", "headers", "request", "status_code")

    def __init__(self, response: httpcore.Response, target: Target) -> None:
        self.status_code = response.status
        self.headers = _Headers(response.headers)
        self.request = target
        self._stream = response.stream
        self._closed = False

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return _mapped_chunks(self._stream)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._stream.aclose()  # type: ignore[union-attr]


class _Stream(httpx.AsyncByteStream):
    """httpcore's body for an httpx Response, its failures raised as httpx's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in _mapped_chunks(self._stream):
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


@functools.lru_cache(maxsize=256)
def _encoded(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """The headers on the wire, encoded once: every request to a fleet sends the same few."""
    return (*((name.encode("ascii"), value.encode("ascii")) for name, value in headers if name != "accept-encoding"),
            (b"accept-encoding", ENCODINGS.encode()))


def _body(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


async def send(
    transport: PerServerTransport, target: Target, method: str, headers: dict[str, str], timeout: float, body: Any
) -> Answer | httpx.Response:
    """Send one request on the server's pool; the answer's headers are read, its body is not."""
    raw = [(b"Host", target.host), *_encoded(tuple(headers.items()))]
    content = b""
    if body is not None:
        content = _body(body)
        raw += [(b"Content-Length", str(len(content)).encode()), (b"Content-Type", b"application/json")]
    request = httpcore.Request(method.encode("ascii"), target.core, headers=raw, content=content,
                               extensions={"timeout": {"connect": timeout, "read": timeout, "write": timeout,
                                                       "pool": timeout}})
    pool = await transport.pool_for(target.origin)
    try:
        response = await pool._pool.handle_async_request(request)
    except Exception as err:
        raised = as_httpx(err)
        if raised is err:
            raise
        raise raised from err
    answer = Answer(response, target)
    encoding = answer.headers.get("content-encoding")
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return answer
    # A compressed answer (llama-server built with zlib): httpx's Response decodes it as it always did.
    decoded = httpx.Response(status_code=response.status, headers=response.headers, stream=_Stream(response.stream),
                             extensions=response.extensions)
    decoded.request = target  # type: ignore[assignment]  # read for its url, as an Answer's
    return decoded
