"""What comparing peer groups costs the daemon at fleet scale: CPU per canary, in groups of a given size."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import structlog

from specwatch.core.state import Fleet
from specwatch.daemon.peering import PeerBoard
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support.fakes import fake_fleet
from tests.support.wire import FakeLlama


class _Timed(PeerBoard):
    """The board, counting the seconds it spends placing models and comparing groups."""

    spent = 0.0

    def touch(self, name: str) -> None:
        started = time.perf_counter()
        super().touch(name)
        self.spent += time.perf_counter() - started

    def settle(self) -> None:
        started = time.perf_counter()
        super().settle()
        self.spent += time.perf_counter() - started


async def run(servers: int, group: int, endpoint: str, tokens: int) -> tuple[float, float]:
    """(seconds of comparing per canary, seconds per canary in all) over one round after a first one."""
    fakes = {f"s{i:05d}": FakeLlama.plain(tokens=tokens, model_alias=f"model-{i // group}") for i in range(servers)}
    settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080"} for n in fakes], canary_endpoints=[endpoint])
    async with fake_fleet(fakes).client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(client, settings.max_response_bytes))
        board = watcher.peers = _Timed(watcher.fleet, time.monotonic, tolerance=settings.peer_tolerance,
                                       confirmations=settings.peer_confirmations, max_gap=settings.poll_interval)
        for name in fakes:
            await watcher.poll(name)
            await watcher.ask_meta(name)
        for name in fakes:
            await watcher.canary(name)  # the first round: every standing is new
        board.spent = 0.0
        started = time.perf_counter()
        for name in fakes:
            await watcher.canary(name)
        return board.spent / servers, (time.perf_counter() - started) / servers


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_cpu", description=__doc__)
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--group-sizes", default="2,10,100,1000", help="comma-separated peer group sizes to measure")
    parser.add_argument("--endpoint", default="chat", help="the one canary endpoint (default chat)")
    parser.add_argument("--tokens", type=int, default=32, help="tokens in each answer (default 32)")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    for size in (int(s) for s in args.group_sizes.split(",")):
        comparing, canary = asyncio.run(run(args.servers, size, args.endpoint, args.tokens))
        print(f"{args.servers} servers in groups of {size}: {comparing * 1000:.3f} ms of comparing per canary "
              f"({canary * 1000:.2f} ms per canary in all, in-process fake servers)")


if __name__ == "__main__":
    main()
