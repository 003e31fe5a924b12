"""Requests sent straight to a server's connection pool: what the fetcher reads of httpx's layers, without them.

httpx builds a Request (headers, URL, stream), wraps the answer in a Response and runs every chunk through a decoder
and a chunker: at 1,000 servers that was a sixth of a poll's CPU for nothing a poll needs. Failures are the httpx
exceptions httpx would raise (see http1), so they map to the same reasons.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from .client import PerServerTransport, as_response
from .http1 import Answer

ENCODINGS = "gzip, deflate"
"""What an answer may be compressed with: httpx decodes these; any encoding goes through httpx's own Response."""


class Target:
    """One server URL, parsed once: what each request to it is addressed with."""

    __slots__ = ("host", "origin", "path", "url")

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        self.url = parsed
        """The httpx URL: what an error message reads its path from (`response.request.url.path`)."""
        self.origin = (parsed.raw_scheme, parsed.raw_host, parsed.port)
        self.host = parsed.netloc
        self.path = parsed.raw_path
        """The request target: path and query."""


class _Headers:
    """An answer's headers, looked up by name as httpx's are (case-insensitively: h11 gives the names lower-cased)."""

    __slots__ = ("raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self.raw = raw

    def get(self, name: str, default: str | None = None) -> str | None:
        key = name.lower().encode()
        for found, value in self.raw:
            if found == key:
                return value.decode("latin-1")
        return default


class Reply:
    """An http1 answer with what the fetcher reads of an httpx Response: status_code, headers.get, aiter_bytes, aclose
    and request.url."""

    __slots__ = ("_answer", "headers", "request", "status_code")

    def __init__(self, answer: Answer, target: Target) -> None:
        self.status_code = answer.status
        self.headers = _Headers(answer.headers)
        self.request = target
        self._answer = answer

    def aiter_bytes(self) -> AsyncIterator[bytes]:
        return self._answer.chunks()

    async def aclose(self) -> None:
        self._answer.close()


@functools.lru_cache(maxsize=256)
def _encoded(headers: tuple[tuple[str, str], ...]) -> tuple[tuple[bytes, bytes], ...]:
    """The headers on the wire, encoded once: every request to a fleet sends the same few."""
    return (*((name.encode("ascii"), value.encode("ascii")) for name, value in headers if name != "accept-encoding"),
            (b"accept-encoding", ENCODINGS.encode()))


def _body(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


async def send(
    transport: PerServerTransport, target: Target, method: str, headers: dict[str, str], timeout: float, body: Any
) -> Reply | httpx.Response:
    """Send one request on the server's pool; the answer's headers are read, its body is not."""
    raw = [(b"Host", target.host), *_encoded(tuple(headers.items()))]
    content = b""
    if body is not None:
        content = _body(body)
        raw += [(b"Content-Length", str(len(content)).encode()), (b"Content-Type", b"application/json")]
    answer = await transport.pool_for(target.origin).exchange(method.encode("ascii"), target.path, raw, content, timeout)
    reply = Reply(answer, target)
    encoding = reply.headers.get("content-encoding")
    if encoding is None or encoding.strip().lower() in ("", "identity"):
        return reply
    # A compressed answer (llama-server built with zlib): httpx's Response decodes it as it always did.
    decoded = as_response(answer)
    decoded.request = target  # type: ignore[assignment]  # read for its url, as a Reply's
    return decoded
