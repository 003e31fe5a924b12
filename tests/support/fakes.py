"""Look-alikes served from loopback sockets to the daemon's own client: each host name of a fake fleet resolves to the
port its look-alike listens on, so a test runs the very path production runs (aiohttp, sockets, the fetcher).

The MockTransport adapter (`respond`) is for tests of the look-alikes themselves, which drive them with httpx.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpx
from aiohttp.abc import AbstractResolver, ResolveResult

from specwatch.probe.http.client import Client
from tests.support.loopback import FaultServer
from tests.support.net import HOST, free_port
from tests.support.wire import Answer, Lookalike, Request

_open: list[FaultServer] = []
"""Every look-alike served for a test: tests/conftest.py stops them when the test ends."""


def to_wire(request: httpx.Request) -> Request:
    return Request(request.method, request.url.path, dict(request.url.params),
                   {name.lower(): value for name, value in request.headers.items()}, request.read())


def to_httpx(answer: Answer) -> httpx.Response:
    return httpx.Response(answer.status, headers=[("Content-Type", answer.content_type), *answer.headers], content=answer.body)


def respond(lookalike: Lookalike, request: httpx.Request) -> httpx.Response:
    """`lookalike`'s answer to `request` through httpx.MockTransport, for tests of the look-alikes themselves."""
    requests = getattr(lookalike, "requests", None)
    if requests is not None:
        requests.append(to_wire(request))
    return to_httpx(lookalike.answer(to_wire(request)))


class _Recording(Lookalike):
    """A look-alike that also keeps each request in its own `requests` list, as tests read them."""

    def __init__(self, inner: Lookalike) -> None:
        self.inner = inner

    def answer(self, request: Request) -> Answer:
        requests = getattr(self.inner, "requests", None)
        if requests is not None:
            requests.append(request)
        return self.inner.answer(request)


class Handler(Lookalike):
    """An httpx-style handler (a function of an httpx.Request to an httpx.Response) served as a look-alike."""

    def __init__(self, handler: Callable[[httpx.Request], httpx.Response]) -> None:
        self.handler = handler

    def answer(self, request: Request) -> Answer:
        url = httpx.URL(f"http://fake{request.path}", params=request.query)
        got = self.handler(httpx.Request(request.method, url, headers=request.headers, content=request.body))
        got.read()
        kind = got.headers.get("content-type", "application/json")
        extra = tuple((k, v) for k, v in got.headers.items() if k.lower() not in ("content-type", "content-length"))
        return Answer(got.status_code, kind, (got.content,), extra)


class Names(AbstractResolver):
    """A fake fleet's host names, each resolved to its look-alike's loopback port; any other name to the fleet's
    default, else to a port where nothing listens, so a server missing from the fleet refuses its connections."""

    def __init__(self) -> None:
        self.ports: dict[str, int] = {}
        self.default = free_port()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        return [{"hostname": host, "host": HOST, "port": self.ports.get(host, self.default), "family": socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


class FakeFleet:
    """Look-alikes by host name, each served on a loopback port, and clients whose names resolve to them."""

    def __init__(self, fakes: Mapping[str, Lookalike]) -> None:
        self.names = Names()
        self.servers: dict[str, FaultServer] = {}
        for host, fake in fakes.items():
            self.add(host, fake)

    def add(self, host: str, fake: Lookalike, *, tls: ssl.SSLContext | None = None) -> FaultServer:
        """Serve `fake` as `host` from now on (over TLS with `tls`)."""
        server = self.standby(host, fake, tls=tls).start()
        return server

    def standby(self, host: str, fake: Lookalike, *, tls: ssl.SSLContext | None = None) -> FaultServer:
        """`fake` as `host`, on a port of its own that refuses connections until the server is started (and again
        once it is stopped): a server that goes away and comes back at one address."""
        server = FaultServer(_Recording(fake), tls=tls)
        server.port = free_port()
        _open.append(server)
        self.servers[host] = server
        self.names.ports[host] = server.port
        return server

    def client(self, *, verify: bool | ssl.SSLContext = True) -> Client:
        """A client of the daemon's own kind whose host names are this fleet's."""
        return Client(verify=verify, resolver=self.names)

    def connect(self) -> Callable[[], Client]:
        """What `check` takes to make its client."""
        return self.client


def fake_fleet(fakes: Mapping[str, Lookalike]) -> FakeFleet:
    return FakeFleet(fakes)


def serving(answer: Lookalike | Callable[[httpx.Request], httpx.Response]) -> Callable[[], Client]:
    """What `check` takes to make its client: every host name answered by one look-alike (or httpx-style handler)."""
    fleet = FakeFleet({})
    fleet.names.default = fleet.add("*", answer if isinstance(answer, Lookalike) else Handler(answer)).port
    return fleet.client


def stop_all() -> None:
    """Stop every look-alike a test started."""
    while _open:
        _open.pop().stop()


async def peer_round(watcher: Any, names: Iterable[str]) -> None:
    """The peer probe's current round asked of each of `names` in turn, then their groups compared."""
    import asyncio

    from specwatch.daemon.cadence import round_of

    now = round_of(watcher._clock(), watcher.settings.canary_interval)
    names = list(names)
    for name in names:
        await watcher.peer_round(name, "", (now,))
    await asyncio.sleep(0)
    watcher.peers._compared_at.clear()  # a group is compared at most so often (SECONDS_PER_MEMBER): compare now
    watcher.peers.settle()


async def intervals(watcher: Any, clock: Any, times: int = 1) -> None:
    """A canary_interval goes by, a poll_interval at a time, every server's tick running at each with the canaries and
    peer probes it made due, `times` over: the daemon's schedule, without its scheduler."""
    import asyncio
    import math

    settings = watcher.settings
    polls = max(1, math.ceil(settings.canary_interval / settings.poll_interval))
    for _ in range(times):
        for _ in range(polls):
            clock.advance(settings.canary_interval / polls)
            for state in watcher.fleet.snapshot():
                await watcher.tick(state.config.name)
            while watcher._rounds:
                await asyncio.gather(*watcher._rounds)
        watcher.peers.settle()
