"""The one HTTP client a process shares: aiohttp, a few connections per server, no redirects, proxies or cookies."""

from __future__ import annotations

import ssl
from types import TracebackType

import aiohttp
from aiohttp.abc import AbstractResolver

USER_AGENT = "specwatch"
LLAMA_KEEPALIVE_SECONDS = 5.0
KEEPALIVE_SECONDS = LLAMA_KEEPALIVE_SECONDS - 1.0
"""An idle connection is given up this long after its answer: llama-server closes one idle for 5 s ("Keep-Alive:
timeout=5"), and reusing one near that moment races its close."""
CONNECTIONS_PER_SERVER = 6
"""The watcher probes a server with at most one poll and one canary or peer probe at a time, the peer probe's burst
of copies asked at once among them: a few connections always suffice."""
DNS_CACHE_SECONDS = 30.0
"""A host name is looked up at most this often: at 1,000 servers a lookup per poll would keep the resolver's few
threads busy, and a moved server is found again within this."""


class Client:
    """aiohttp's sessions and connectors, made on first use inside the running loop (aiohttp binds them to it)."""

    def __init__(self, *, verify: bool | ssl.SSLContext = True, resolver: AbstractResolver | None = None) -> None:
        self._verify = verify
        self._resolver = resolver
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session every request goes through, its connections kept alive between requests."""
        return self._sessions.get(False) or self._open(closing=False)

    @property
    def closing(self) -> aiohttp.ClientSession:
        """The session for a request whose connection must end with it: it asks the server to close, and never reuses.

        llama-server closes the connection after a streamed answer without saying so (build 11434), and aiohttp pools a
        connection by the answer's headers alone: a request sent on it before the close arrived would be lost.
        """
        return self._sessions.get(True) or self._open(closing=True)

    def _open(self, *, closing: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=0,  # the watcher's semaphore bounds the total, and can change on reload
            limit_per_host=CONNECTIONS_PER_SERVER,
            keepalive_timeout=None if closing else KEEPALIVE_SECONDS,
            force_close=closing,  # sends `Connection: close`, and closes the connection when its answer is read
            ttl_dns_cache=DNS_CACHE_SECONDS,
            ssl=self._verify,
            resolver=self._resolver,
        )
        # No cookie jar: llama-server sets none, and a jar would hand one server's cookie to every other server on the
        # same host, as cookies ignore ports. trust_env=False: HTTP(S)_PROXY and .netrc are never read.
        session = self._sessions[closing] = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT},
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
        return session

    def forget_names(self) -> None:
        """Drop every cached name lookup: servers that went away (a reload, discovery) leave none behind."""
        for session in self._sessions.values():
            connector = session.connector
            if isinstance(connector, aiohttp.TCPConnector):
                connector.clear_dns_cache()

    async def aclose(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()


def new_client(*, verify: bool | ssl.SSLContext = True) -> Client:
    """The one client a process shares: a few connections per server, no redirects, no proxies from the environment."""
    return Client(verify=verify)
