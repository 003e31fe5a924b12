"""What /metrics costs the daemon at fleet scale: the background preparation and the gzipped scrapes, in CPU per second."""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from specwatch.core.state import Fleet
from specwatch.daemon import logs
from specwatch.daemon.cadence import Round
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.serve import Exposition
from specwatch.daemon.watch import Watcher
from specwatch.endpoints import Endpoint
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support.fakes import fake_fleet
from tests.support.simfleet import FleetOptions, is_speculating, lookalike

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                     "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
                     "text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def run(servers: int, seconds: int, scrapers: int, scrape_every: float, poll: float, canary: float) -> dict[str, float]:
    options = FleetOptions(servers=servers)
    names = [f"s{i:05d}" for i in range(servers)]
    fakes = {name: lookalike(i, options) for i, name in enumerate(names)}
    settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080", "labels": {"pool": "sim",
                                  "kind": "speculating" if is_speculating(i, 0.2) else "plain"}} for i, n in enumerate(names)])
    clock = Clock()
    async with fake_fleet(fakes).client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, 1 << 22), clock=clock)
        for name in names:
            await watcher.poll(name)
            await watcher.canary(name)
        exposition = Exposition(watcher.fleet, lambda: ExporterStatus(poll, canary))
        exposition.renderer.prepare()
        body = exposition.scrape(PROMETHEUS_ACCEPT, "gzip").body
        prepare_cpu = scrape_cpu = 0.0
        scrapes = 0
        endpoints = list(Endpoint)
        polls_per_second, canaries_per_second = servers / poll, servers / canary
        polled = canaried = 0.0
        for second in range(seconds):
            clock.now += 1.0
            # The probes of one second, spread as the schedule spreads them: not measured, they only change the state.
            polled += polls_per_second
            canaried += canaries_per_second
            while polled >= 1:
                polled -= 1
                await watcher.poll(names[int(clock.now * polls_per_second + polled) % servers])
            while canaried >= 1:
                canaried -= 1
                index = int(clock.now * canaries_per_second + canaried) % servers
                await watcher.canary(names[index], "", Round((endpoints[index % len(endpoints)],), full=False, rotation=True))
            started = time.thread_time()
            exposition.renderer.prepare()
            prepare_cpu += time.thread_time() - started
            if second % scrape_every < 1:
                started = time.thread_time()
                for _ in range(scrapers):
                    exposition.scrape(PROMETHEUS_ACCEPT, "gzip")
                scrape_cpu += time.thread_time() - started
                scrapes += scrapers
    return {"servers": servers, "seconds": seconds, "scrapes": scrapes, "body_gzip_bytes": len(body),
            "prepare_ms_per_s": prepare_cpu * 1000 / seconds, "scrape_ms_each": scrape_cpu * 1000 / max(1, scrapes),
            "core_share": (prepare_cpu + scrape_cpu) / seconds}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exposition", description=__doc__)
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=60, help="simulated seconds of polls, canaries and scrapes")
    parser.add_argument("--scrapers", type=int, default=2, help="Prometheus servers scraping (HA pairs: 2)")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--poll-interval", type=float, default=15.0)
    parser.add_argument("--canary-interval", type=float, default=60.0)
    args = parser.parse_args()
    logs.configure("error", json=True, stream=open(os.devnull, "w"))
    out = asyncio.run(run(args.servers, args.seconds, args.scrapers, args.scrape_every, args.poll_interval,
                          args.canary_interval))
    print(f"{out['servers']} servers, {out['seconds']} s, {out['scrapes']} gzip scrapes of {out['body_gzip_bytes']:,} bytes")
    print(f"  preparation: {out['prepare_ms_per_s']:.2f} ms CPU per second")
    print(f"  scrape:      {out['scrape_ms_each']:.2f} ms CPU each")
    print(f"  /metrics in all: {out['core_share'] * 100:.2f}% of a core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
