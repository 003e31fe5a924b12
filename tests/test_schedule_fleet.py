"""Fleet scale: a thousand simulated llama-servers due within one interval and polled by the real daemon; a fast /metrics."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.state import Fleet
from specwatch.daemon.exposition.registry import SpecwatchCollector
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.text import TextRenderer
from specwatch.daemon.run import Daemon
from specwatch.daemon.watch import Watcher
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.reasons import Reason
from specwatch.settings.loading import load_settings
from specwatch.settings.schema import Settings
from tests.support.net import free_port
from tests.support.simfleet import FleetOptions, SimFleetProcess, SimFleetThread, build_config, write_config
from tests.support.wire import FakeLlama

pytestmark = pytest.mark.slow

FLEET = 1000
POLL_INTERVAL = 10.0


@pytest.fixture(scope="module")
def thousand_servers() -> Iterator[SimFleetProcess]:
    # A process of its own, so the fleet's CPU does not slow the daemon's event loop.
    with SimFleetProcess(FleetOptions(servers=FLEET, base_port=0, spec_share=0.2, latency_ms=5.0)) as fleet:
        yield fleet


async def test_a_thousand_servers_are_all_due_within_one_interval_and_all_polled(thousand_servers: SimFleetProcess, tmp_path: Path) -> None:
    config = tmp_path / "fleet.yaml"
    write_config(config, build_config([s.as_dict() for s in thousand_servers.servers],
                                      poll_interval=f"{POLL_INTERVAL:g}s", canary_interval="1h"))
    settings = load_settings(config)
    daemon = Daemon(config, settings)
    # Each server's first poll as the schedule sets it, before its job starts any: the schedule, which no machine's
    # speed changes.
    daemon.schedule.sync(settings.servers)
    first_runs = list(daemon.schedule.next_polls().values())
    port = free_port()
    requests_before = thousand_servers.stats()["by_path"].get("/props", 0)
    started = time.time()
    running = asyncio.create_task(daemon.run("127.0.0.1", port))
    first_success: dict[str, float] = {}
    try:
        # Long enough for a starved machine; how fast a thousand polls go is bench.benchmark's to measure.
        while time.time() < started + 6 * POLL_INTERVAL and len(first_success) < FLEET:
            await asyncio.sleep(0.25)
            for server in daemon.fleet.snapshot():
                if server.poll_success and server.config.name not in first_success:
                    first_success[server.config.name] = time.time() - started
        scrape = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        snapshot = daemon.fleet.snapshot()
        watched = time.time() - started
    finally:
        daemon.stop()
        await asyncio.wait_for(running, 30)

    assert len(first_success) == FLEET, f"{FLEET - len(first_success)} servers were never polled successfully"
    # Every server's first poll is due within one interval of the start, spread across it rather than in one burst
    # (each tenth of the interval gets a share): the schedule, which no machine's speed changes.
    assert len(first_runs) == FLEET
    offsets = sorted(at - min(first_runs) for at in first_runs)
    assert offsets[-1] < POLL_INTERVAL, f"the last first poll is due {offsets[-1]:.1f}s after the first"
    tenths = [sum(1 for at in offsets if k <= 10 * at / POLL_INTERVAL < k + 1) for k in range(10)]
    assert min(tenths) >= FLEET / 10 / 2, tenths
    polled = thousand_servers.stats()["by_path"].get("/props", 0) - requests_before
    intervals = watched / POLL_INTERVAL
    assert FLEET <= polled <= FLEET * (intervals + 1), f"{polled} polls in {intervals:.1f} intervals: hammered"
    for server in snapshot:
        speculating = server.config.labels["kind"] == "speculating"
        assert server.model().poll is not None and server.model().poll.slots is not None
        assert server.model().poll.slots.speculative is speculating
        assert server.model().poll.props.speculative is False  # /props says "none" on every server, as real ones do
    up = [s for family in text_string_to_metric_families(scrape) if family.name == "specwatch_up" for s in family.samples]
    assert len(up) == FLEET and all(s.value == 1 for s in up)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as answer:
        return answer.read().decode()


async def test_simulated_servers_answer_like_llama_server(monkeypatch) -> None:
    """The simulated fleet is only worth benchmarking if specwatch reaches the real verdicts on it."""
    monkeypatch.setenv("SIMFLEET_TEST_KEY", "sim-key")
    with SimFleetThread(FleetOptions(servers=4, spec_share=0.5, latency_ms=1.0, api_key="sim-key")) as fleet:
        servers = [{"name": s.name, "url": s.url, "api_key_env": "SIMFLEET_TEST_KEY"} for s in fleet.servers]
        settings = Settings(servers=servers, canary_tokens=16, canary_tokens_speculating=16)
        client = new_client()
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, settings.max_response_bytes))
        try:
            names = [s.name for s in fleet.servers]
            await asyncio.gather(*(watcher.poll(n) for n in names), *(watcher.canary(n) for n in names))
        finally:
            await client.aclose()
        stats = fleet.fleet.stats.as_dict()
    for sim in fleet.servers:
        state = watcher.fleet.get(sim.name)
        assert state is not None and state.poll_success, state
        assert state.model().poll.slots.speculative is sim.speculative
        assert state.model().serving_fill_ins is sim.speculative
        for endpoint in Endpoint:
            tally = state.model().canaries[endpoint].tally
            assert tally is not None and tally.tokens == 16
            assert tally.fill_ins == (15 if sim.speculative else 0), (sim.name, endpoint)
    # Connections are reused: a stream's connection ends with it (llama-server closes it), and the poll and the other
    # canaries, running at once, share at most two.
    streams = sum(1 for endpoint in Endpoint if TABLE[endpoint].streaming)
    assert stats["connections"] <= (2 + streams) * len(fleet.servers)


async def test_simulated_servers_refuse_a_missing_api_key() -> None:
    with SimFleetThread(FleetOptions(servers=1, latency_ms=0.0, api_key="sim-key")) as fleet:
        async with httpx.AsyncClient() as client:
            health = await client.get(f"{fleet.servers[0].url}/health")
            props = await client.get(f"{fleet.servers[0].url}/props")
            authorised = await client.get(f"{fleet.servers[0].url}/props", headers={"Authorization": "Bearer sim-key"})
    assert health.status_code == 200
    assert props.status_code == 401 and props.json()["error"]["type"] == "authentication_error"
    assert authorised.status_code == 200 and authorised.json()["total_slots"] == 1


def _registry_text(collector: SpecwatchCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


async def test_fast_exposition_is_byte_identical_to_generate_latest(make_watcher, monkeypatch, clock) -> None:
    monkeypatch.setenv("FLEET_KEY", "right-key")
    fakes = {
        "plain": FakeLlama.plain(),
        "draft": FakeLlama.draft(),
        "noslots": FakeLlama.plain(slots_enabled=False),
        "locked": FakeLlama.plain(api_key="other-key"),
        "odd": FakeLlama.draft(model_alias='we"ird\\name\nx'),
    }
    servers = [
        {"name": "plain", "url": "http://plain:8080", "labels": {"pool": "eval", "zone": 'a"b\\c\nd'}},
        {"name": "draft", "url": "http://draft:8080", "labels": {"pool": "eval"}},
        {"name": "noslots", "url": "http://noslots:8080"},
        {"name": "locked", "url": "http://locked:8080", "api_key_env": "FLEET_KEY"},
        {"name": "odd", "url": "http://odd:8080", "labels": {"family": "user-model", "aaa": "first"}},
        {"name": "gone", "url": "http://gone:8080"},
    ]
    watcher = make_watcher(fakes, servers=servers, canary_tokens=8)
    status = ExporterStatus(15.0, 60.0, last_reload_success_timestamp=1_700_000_000.5)
    collector = SpecwatchCollector(watcher.fleet, lambda: status)
    renderer = TextRenderer(watcher.fleet, lambda: status)
    names = [s["name"] for s in servers]

    def same() -> None:
        assert renderer.text() == _registry_text(collector)

    same()  # nothing polled yet: headers only
    await asyncio.gather(*(watcher.poll(n) for n in names), *(watcher.canary(n) for n in names))
    same()
    clock.advance(15)
    await asyncio.gather(*(watcher.poll(n) for n in names))  # new timings, same answers: cached lines reused
    same()
    fakes["draft"].fill_ins = set()  # the canary's verdict changes: that server's lines are rebuilt
    await watcher.canary("draft")
    fakes["plain"].slots_enabled = False
    await watcher.poll("plain")
    same()
    kept = [s for s in servers if s["name"] != "noslots"]
    kept[0] = {**kept[0], "labels": {"pool": "other"}}
    settings = Settings(servers=kept, canary_tokens=8)
    watcher.apply(settings, list(settings.servers))
    status = replace(status, reload_successful=False, last_reload_success_timestamp=None)
    same()
    text = renderer.text().decode()
    assert 'server="noslots"' not in text and 'pool="other",server="plain"' in text
    assert f"specwatch_poll_failures_total{{reason=\"{Reason.CONNECTION_REFUSED.value}\",server=\"gone\"}} 2.0" in text


async def test_fast_exposition_rebuilds_only_what_changed(make_watcher, monkeypatch) -> None:
    """Not a timing test (the benchmark gives figures): a scrape must not redo the work for servers that did not change."""
    from specwatch.daemon.exposition import samples

    built: list[str] = []
    canaries = next(i for i, g in enumerate(samples.GROUPS) if g.samples is samples.canary_samples)
    original = samples.GROUPS[canaries]

    def counting(out, server) -> None:
        built.append(server.config.name)
        samples.canary_samples(out, server)

    groups = list(samples.GROUPS)
    groups[canaries] = replace(original, samples=counting)
    monkeypatch.setattr("specwatch.daemon.exposition.text.GROUPS", tuple(groups))
    fakes = {f"s{i}": (FakeLlama.draft(tokens=8) if i % 5 == 0 else FakeLlama.plain(tokens=8)) for i in range(FLEET)}
    watcher = make_watcher(fakes, canary_tokens=8, canary_endpoints=["chat"])
    names = list(fakes)
    await asyncio.gather(*(watcher.poll(n) for n in names), *(watcher.canary(n) for n in names))
    collector = SpecwatchCollector(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    renderer = TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    first = renderer.text()
    assert len(built) == FLEET
    await asyncio.gather(*(watcher.poll(n) for n in names))
    await watcher.canary("s7")
    built.clear()
    second = renderer.text()
    assert built == ["s7"], "only the server with a new canary result has its canary lines rebuilt"
    assert second != first
    assert second == _registry_text(collector)
