"""What comparing peer groups costs the daemon at fleet scale: CPU per peer-probe answer, in groups of a given size."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time

import structlog

from specwatch.core.state import Fleet
from specwatch.daemon.cadence import round_of
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


async def run(servers: int, group: int) -> tuple[float, float]:
    """(seconds of comparing per answer, seconds per answer in all) over one round after the first."""
    fakes = {f"s{i:05d}": FakeLlama.plain(tokens=None, model_alias=f"model-{i // group}",
                                          token_probability=0.7 - 0.00001 * i)  # no two answers alike
             for i in range(servers)}
    settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080"} for n in fakes], canary_endpoints=["completion"])
    async with fake_fleet(fakes).client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(client, settings.max_response_bytes))
        board = watcher.peers = _Timed(watcher.fleet, time.monotonic, time.time, max_gap=settings.poll_interval,
                                       interval=settings.canary_interval)
        for name in fakes:
            await watcher.poll(name)
            await watcher.ask_meta(name)
        now = round_of(time.time(), settings.canary_interval)
        for name in fakes:
            await watcher.peer_round(name, "", (now,))  # the first round: every standing new
        board.settle()
        board.spent = 0.0
        started = time.perf_counter()
        for name in fakes:
            await watcher.peer_round(name, "", (now + 1,))
        board._compared_at.clear()  # the round is counted now, not SECONDS_PER_MEMBER later
        board.settle()
        return board.spent / servers, (time.perf_counter() - started) / servers


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_cpu", description=__doc__)
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--group-sizes", default="2,10,100,1000", help="comma-separated peer group sizes to measure")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    for size in (int(s) for s in args.group_sizes.split(",")):
        comparing, answer = asyncio.run(run(args.servers, size))
        print(f"{args.servers} servers in groups of {size}: {comparing * 1000:.3f} ms of comparing per peer-probe answer "
              f"({answer * 1000:.2f} ms per answer in all, fake servers on loopback)")


if __name__ == "__main__":
    main()
