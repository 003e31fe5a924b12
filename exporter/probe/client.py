"""The one HTTP client a process shares: a small connection pool per server, no redirects, proxies or cookies."""

from __future__ import annotations

import ssl
import time
from collections.abc import AsyncIterator

import httpx

from .http1 import Answer, OriginPool

USER_AGENT = "specwatch"
LLAMA_KEEPALIVE_SECONDS = 5.0
CONNECTIONS_PER_SERVER = 4
IDLE_POOL_SECONDS = 60.0
"""A server's pool unused this long is closed (a new one costs microseconds): servers dropped by a reload or by
discovery leave no pool, and no half-closed sockets, behind."""


class PerServerTransport(httpx.AsyncBaseTransport):
    """A small connection pool per server origin (http1.OriginPool), found by a dict lookup.

    One fleet-wide pool scans its connections whenever a request starts or ends (httpcore's pool of 64 connections
    cost about 2 ms of CPU per request); per-origin pools keep that to a connection or two and reuse each server's.
    """

    def __init__(
        self, *, verify: bool | ssl.SSLContext, per_server: int, keepalive_expiry: float, max_servers: int = 20_000
    ) -> None:
        self._verify = verify
        self._max_servers = max_servers
        self._per_server = per_server
        self._keepalive_expiry = keepalive_expiry
        self._pools: dict[tuple[bytes, bytes, int | None], OriginPool] = {}
        self._used: dict[tuple[bytes, bytes, int | None], float] = {}
        self._swept = 0.0

    def _ssl_context(self, scheme: bytes) -> ssl.SSLContext | None:
        # A context costs memory and, when it verifies, a CA bundle load: one serves every pool.
        if scheme != b"https":
            return None
        if not isinstance(self._verify, ssl.SSLContext):
            self._verify = httpx.create_ssl_context(verify=self._verify)
        return self._verify

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """A request sent through httpx's own client methods (discovery's list): on the same pools."""
        url = request.url
        timeout = request.extensions.get("timeout", {})
        seconds = min((v for v in timeout.values() if v is not None), default=30.0)
        pool = self.pool_for((url.raw_scheme, url.raw_host, url.port))
        answer = await pool.exchange(request.method.encode("ascii"), url.raw_path, request.headers.raw,
                                     await request.aread(), seconds)
        return as_response(answer)

    def pool_for(self, origin: tuple[bytes, bytes, int | None]) -> OriginPool:
        """The pool of one (scheme, host, port), made when first used; pools unused for long are closed meanwhile."""
        pool = self._pools.pop(origin, None)
        if pool is None:
            scheme, host, port = origin
            pool = OriginPool(host.decode("ascii"), port or (443 if scheme == b"https" else 80),
                              self._ssl_context(scheme), limit=self._per_server, expiry=self._keepalive_expiry)
            if len(self._pools) >= self._max_servers:
                # Servers dropped by a reload are the least recently used: close their pools.
                stale = next(iter(self._pools))
                self._used.pop(stale, None)
                self._pools.pop(stale).close()
        self._pools[origin] = pool  # re-inserted last: the dict's order is least recently used first
        now = time.monotonic()
        self._used[origin] = now
        if now - self._swept >= IDLE_POOL_SECONDS / 4:
            self._swept = now
            self._close_idle(now - IDLE_POOL_SECONDS)
        return pool

    def _close_idle(self, before: float) -> None:
        """Close the pools unused since `before` whose connections are all idle; the oldest come first."""
        for origin in list(self._pools):
            if self._used.get(origin, 0.0) >= before:
                break
            pool = self._pools[origin]
            if pool.idle:
                del self._pools[origin]
                self._used.pop(origin, None)
                pool.close()

    def __len__(self) -> int:
        """Pools held: one per server origin used within IDLE_POOL_SECONDS, at most."""
        return len(self._pools)

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        self._used.clear()
        for pool in pools.values():
            pool.close()


def as_response(answer: Answer) -> httpx.Response:
    """An http1 answer as an httpx Response, whose body httpx decodes (gzip, deflate) as it reads it."""
    return httpx.Response(status_code=answer.status, headers=answer.headers, stream=_BodyStream(answer),
                          extensions={"http_version": b"HTTP/1.1"})


class _BodyStream(httpx.AsyncByteStream):
    """An http1 answer's body, read as an httpx Response's."""

    def __init__(self, answer: Answer) -> None:
        self._answer = answer

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._answer.chunks():
            yield chunk

    async def aclose(self) -> None:
        self._answer.close()


class _NoCookies(httpx.Cookies):
    def extract_cookies(self, response: httpx.Response) -> None:
        pass


_NO_COOKIES = _NoCookies()


class _CookielessClient(httpx.AsyncClient):
    """A client without a cookie jar.

    llama-server sets no cookies, and a jar would hand one server's cookie to every other server on the
    same host, as cookies ignore ports. Skipping it also saves httpx's per-response cookie extraction,
    which builds a urllib request from each response: about 5% of a 1,000-server daemon's CPU.
    """

    @property
    def cookies(self) -> httpx.Cookies:
        return _NO_COOKIES

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        pass  # nothing to keep: httpx assigns the constructor's (empty) cookies here


def new_client(*, verify: bool | ssl.SSLContext = True) -> httpx.AsyncClient:
    """The one client a process shares: a small connection pool per server, no redirects, no proxies from the env.

    The watcher probes a server with at most one poll and one canary at a time, so a few connections per server
    always suffice; the watcher's semaphore bounds the total, and can change on reload without a new client.
    """
    # llama-server closes a connection idle for 5 s (it answers "Keep-Alive: timeout=5"); reusing one near that
    # moment races its close and fails the request as a reset, so idle connections are given up a second earlier.
    transport = PerServerTransport(
        verify=verify, per_server=CONNECTIONS_PER_SERVER, keepalive_expiry=LLAMA_KEEPALIVE_SECONDS - 1.0
    )
    return _CookielessClient(
        follow_redirects=False,
        trust_env=False,
        transport=transport,
        headers={"User-Agent": USER_AGENT},
    )
