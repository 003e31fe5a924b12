"""CPU of one probe request on a new connection: the bare exchange, each client compared, the fetcher's, a whole poll.

An arm per client that was weighed for the probes (docs/development.md, How specwatch speaks HTTP), so the choice can
be measured again: aiohttp alone (what the fetcher is built on), httpx with one client per server and with no
keep-alive (its shared pool scans every connection it holds on each request: 18 ms at 1,000 servers, not run).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable, Sequence

import aiohttp
import httpx

from specwatch.probe import probes
from specwatch.probe.http.client import CONNECTIONS_PER_SERVER, new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.targets import ServerConfig
from tests.support.simfleet import FleetOptions, SimFleetProcess, SimServer

KEEPALIVE_WAIT = 5.6
"""Longer than the fleet's keep-alive timeout: every round opens its connections anew, as a 15 s poll does."""


class _Bare(asyncio.Protocol):
    """GET /props and nothing else: what the exchange costs without any layer of ours."""

    def __init__(self, done: asyncio.Future[bytes]) -> None:
        self.done, self.received = done, bytearray()

    def data_received(self, data: bytes) -> None:
        self.received += data
        head, _, body = bytes(self.received).partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                       if line.startswith(b"content-length:")), None)
        if length is not None and len(body) >= length and not self.done.done():
            self.done.set_result(body[:length])

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError("closed before the answer"))


async def bare(server: SimServer) -> None:
    running = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = running.create_future()
    transport, _ = await running.create_connection(lambda: _Bare(done), server.host, server.port)
    transport.write(b"GET /props HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: specwatch\r\n\r\n" % (server.host.encode(), server.port))
    await done
    transport.close()


async def measure(servers: Sequence[SimServer], rounds: int, concurrency: int) -> dict[str, list[float]]:
    """Milliseconds of process CPU per server for each way, one figure per round; the ways take turns."""
    fetcher = Fetcher(new_client(), 1 << 20)
    configs = {server.url: ServerConfig(name=f"sim{i}", url=server.url) for i, server in enumerate(servers)}
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, limit_per_host=CONNECTIONS_PER_SERVER))
    unpooled = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
    per_server = {server.url: httpx.AsyncClient() for server in servers}

    async def plain_aiohttp(server: SimServer) -> None:
        async with session.get(f"{server.url}/props") as response:
            await response.read()

    async def httpx_unpooled(server: SimServer) -> None:
        (await unpooled.get(f"{server.url}/props")).read()

    async def httpx_per_server(server: SimServer) -> None:
        (await per_server[server.url].get(f"{server.url}/props")).read()

    ways: dict[str, Callable[[SimServer], Awaitable[object]]] = {
        "bare exchange, GET /props": bare,
        "aiohttp session, GET /props": plain_aiohttp,
        "httpx, no keep-alive": httpx_unpooled,
        "httpx, a client per server": httpx_per_server,
        "fetcher, GET /props": lambda s: fetcher.get_json(f"{s.url}/props", headers={}, timeout=10),
        "poll, /props + /slots": lambda s: probes.poll(fetcher, configs[s.url], timeout=10),  # ask_always: /slots too
    }
    limit = asyncio.Semaphore(concurrency)

    async def one(way: Callable[[SimServer], Awaitable[object]], server: SimServer) -> None:
        async with limit:
            await way(server)

    figures: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            await asyncio.sleep(KEEPALIVE_WAIT)
            before = os.times()
            await asyncio.gather(*(one(way, s) for s in servers))
            await asyncio.sleep(0.3)  # the closes, counted too
            after = os.times()
            spent = (after.user - before.user) + (after.system - before.system)
            figures[name].append(1000 * spent / len(servers))
    await fetcher.client.aclose()
    await session.close()
    await unpooled.aclose()
    await asyncio.gather(*(client.aclose() for client in per_server.values()))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.request_cpu", description=__doc__)
    parser.add_argument("--servers", type=int, default=1000, help="simulated servers, each asked once a round (1000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per way; the median is shown (5)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight, as max_concurrency (64)")
    parser.add_argument("--loop", choices=("daemon", "asyncio"), default="daemon",
                        help="the daemon's loop (specwatch.loop: uvloop where installed) or asyncio's own")
    args = parser.parse_args(argv)
    if args.loop == "daemon":
        from specwatch import loop  # not at the top: a checkout from before it (on PYTHONPATH) runs with --loop asyncio

        factory = loop.factory()
    else:
        factory = asyncio.new_event_loop
    with SimFleetProcess(FleetOptions(servers=args.servers, latency_ms=20)) as fleet, \
            asyncio.Runner(loop_factory=factory) as runner:
        figures = runner.run(measure(fleet.servers, args.rounds, args.concurrency))
    print(f"ms of CPU per server on a new connection, {args.servers} servers, {args.loop} loop "
          f"({factory.__module__}), median of {args.rounds} rounds (min-max)")
    for name, values in figures.items():
        print(f"  {name:<28} {statistics.median(values):6.3f}  ({min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
