"""Peer groups and shards: a sharded exporter compares only the groups it watches whole; the rest Prometheus compares."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from specwatch.core.state import Fleet
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.text import TextRenderer
from specwatch.daemon.run import Daemon
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.conftest import FakeClock
from tests.support.fakes import fake_fleet, intervals
from tests.support.metrics import find, parse
from tests.support.wire import FakeLlama

Build = Callable[..., Watcher]


@pytest.fixture
async def watcher_of(clock: FakeClock) -> AsyncIterator[Build]:
    clients: list[httpx.AsyncClient] = []

    def build(fakes: dict[str, FakeLlama], servers: list[dict], *, configured_only: bool) -> Watcher:
        settings = Settings(servers=servers, canary_endpoints=["completion"])
        client = fake_fleet(fakes).client()
        clients.append(client)
        ticks = itertools.count()
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(client, settings.max_response_bytes), clock=clock, monotonic=lambda: float(next(ticks)))
        watcher.peers.configured_only = configured_only
        return watcher

    yield build
    for client in clients:
        await client.aclose()


async def _samples(watcher: Watcher, clock: FakeClock, rounds: int = 1) -> dict:
    """`rounds` canary_intervals, each server ticked with the canaries and peer probes due; then /metrics."""
    await intervals(watcher, clock, rounds)
    return parse(TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0)).text().decode())


# One shard of a pool eval-a, eval-b, eval-c (eval-c requantized) watches eval-a and eval-c: two of three.
FAKES = {"eval-a": FakeLlama.plain(tokens=None), "eval-c": FakeLlama.plain(tokens=None, ftype="Q4_0")}


async def test_unsharded_two_of_three_would_name_the_good_replica_too(watcher_of: Build, clock: FakeClock) -> None:
    # Why a shard must not compare a group it may see only part of: with no majority, both sides are named.
    watcher = watcher_of(FAKES, [{"name": n, "url": f"http://{n}:8080"} for n in FAKES], configured_only=False)
    samples = await _samples(watcher, clock)
    assert find(samples, "specwatch_peer_agreement", server="eval-a") == 0
    assert find(samples, "specwatch_peer_agreement", server="eval-c") == 0


async def test_a_shard_leaves_a_group_by_model_name_to_prometheus(watcher_of: Build, clock: FakeClock) -> None:
    watcher = watcher_of(FAKES, [{"name": n, "url": f"http://{n}:8080"} for n in FAKES], configured_only=True)
    samples = await _samples(watcher, clock)
    fingerprints = {dict(labels)["server"]: dict(labels) for (metric, labels) in samples
                    if metric == "specwatch_model_fingerprint_info"}
    for name in FAKES:
        assert find(samples, "specwatch_peer_agreement", server=name) is None
        # The fingerprint still goes out with its group, for the rules that compare it across shards.
        assert fingerprints[name]["peer_group"] != ""
    assert fingerprints["eval-c"]["ftype"] == "Q4_0" != fingerprints["eval-a"]["ftype"]


async def test_a_shard_compares_a_configured_group_it_watches_whole(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {**FAKES, "eval-b": FakeLlama.plain(tokens=None)}
    servers = [{"name": n, "url": f"http://{n}:8080", "peer_group": "eval"} for n in fakes]
    watcher = watcher_of(fakes, servers, configured_only=True)
    samples = await _samples(watcher, clock, rounds=3)  # a round counts once the next one is over
    agreement = {n: find(samples, "specwatch_peer_agreement", server=n, peer_group="eval") for n in fakes}
    assert agreement == {"eval-a": 1, "eval-b": 1, "eval-c": 0}


@pytest.mark.parametrize(("flag", "configured", "only"), [
    (None, None, False), ("0/1", None, False), ("1/2", None, True), (None, "2/3", True), ("0/1", "2/3", False),
])
async def test_the_daemon_compares_only_configured_groups_when_sharded(flag: str | None, configured: str | None,
                                                                     only: bool) -> None:
    settings = Settings(servers=[{"name": "eval-a", "url": "http://eval-a:8080"}], shard=configured)
    daemon = Daemon(None, settings, shard=flag)
    try:
        assert daemon.watcher.peers.configured_only is only
    finally:
        await daemon.client.aclose()
