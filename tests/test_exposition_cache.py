"""The cached /metrics renderer: nothing rebuilt for unchanged servers, gzip reused per preparation, series per server."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import replace

import httpx
import pytest
import structlog.testing
from prometheus_client import CollectorRegistry, generate_latest

from specwatch.daemon.exposition import samples
from specwatch.daemon.exposition.registry import SpecwatchCollector
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.serve import Exposition
from specwatch.daemon.exposition.text import TextRenderer
from specwatch.daemon.peering import SECONDS_PER_MEMBER
from specwatch.daemon.web import WebApp
from specwatch.endpoints import Endpoint
from specwatch.settings.schema import Settings
from tests.support.fakes import peer_round
from tests.support.wire import FakeLlama


def _registry_text(fleet, status) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpecwatchCollector(fleet, status))
    return generate_latest(registry)


def test_every_server_family_is_rendered_by_exactly_one_group() -> None:
    from specwatch.daemon.exposition.catalog import SERVER

    grouped = [f for g in samples.GROUPS for f in g.families]
    assert sorted(grouped) == sorted(f.name for f in SERVER) and len(grouped) == len(set(grouped))


async def test_gzipped_exposition_is_the_text_exposition_through_every_kind_of_change(make_watcher, clock) -> None:
    fakes = {"plain": FakeLlama.plain(tokens=8), "draft": FakeLlama.draft(tokens=8), "locked": FakeLlama.plain(api_key="k")}
    servers = [{"name": name, "url": f"http://{name}:8080", "labels": {"pool": "a"}} for name in fakes]
    watcher = make_watcher(fakes, servers=servers, canary_tokens=8)
    status = ExporterStatus(15.0, 60.0, last_reload_success_timestamp=1_700_000_000.5)
    exposition = Exposition(watcher.fleet, lambda: status)

    def same() -> None:
        # What changed since is prepared now: else a body the preparing thread made before the change may be served.
        exposition.prepare()
        text = exposition.renderer.text()
        plain, zipped = exposition.scrape(None, "identity"), exposition.scrape(None, "gzip")
        assert zipped.gzipped and not plain.gzipped
        assert gzip.decompress(zipped.body).startswith(text) and plain.body.startswith(text)
        assert text == _registry_text(watcher.fleet, lambda: status)

    same()
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    same()
    clock.advance(15)
    await watcher.poll("plain")
    same()
    fakes["draft"].fill_ins = set()
    await watcher.canary("draft")
    same()
    kept = [{**servers[0], "labels": {"pool": "b"}}, servers[2]]
    settings = Settings(servers=kept, canary_tokens=8)
    watcher.apply(settings, list(settings.servers))
    same()
    text = exposition.renderer.text().decode()
    assert 'server="draft"' not in text and 'pool="b",server="plain"' in text and 'pool="a",server="plain"' not in text


async def test_an_unchanged_fleet_rebuilds_no_line(make_watcher, monkeypatch) -> None:
    fakes = {f"s{i}": FakeLlama.draft(tokens=8) if i % 2 else FakeLlama.plain(tokens=8) for i in range(6)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    renderer = TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    renderer.text()
    built: list[str] = []

    def counting(group: samples.Group) -> samples.Group:
        def build(out, server) -> None:
            built.append(group.samples.__name__)
            group.samples(out, server)

        return replace(group, samples=build)

    monkeypatch.setattr("specwatch.daemon.exposition.text.GROUPS", tuple(counting(g) for g in samples.GROUPS))
    renderer.text()
    renderer.text()
    assert built == []
    await watcher.poll("s1")  # a poll with the same answers: its timing and counters, nothing else
    renderer.text()
    assert built == ["poll_samples"]


async def test_series_per_server(make_watcher) -> None:
    """What a server costs on every scrape: a guard against families growing unnoticed."""
    fakes = {"plain": FakeLlama.plain(tokens=8), "draft": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    await asyncio.gather(*(watcher.ask_meta(n) for n in fakes))
    await peer_round(watcher, fakes)
    # Answers ending within SECONDS_PER_MEMBER of each other are compared together at the next tick: this is it.
    await asyncio.sleep(2 * SECONDS_PER_MEMBER)
    watcher.peers.settle()
    text = TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0)).text().decode()
    series = {name: sum(1 for line in text.splitlines() if line.startswith("specwatch_") and f'server="{name}"' in line)
              for name in fakes}
    # Per server: 10 poll series, 8 per canaried endpoint (9 with draft counts; one of them, specwatch_canary_checked,
    # is there before the first canary too), 4 verdicts, 5 other canary series and 9 of peers (both report tiny.gguf, so
    # they are one group: its fingerprint, agreement, evidence, noise, noisy flag, floor and missed rounds, and its
    # peer probes by outcome; failures by reason only once one failed).
    endpoints = len(Endpoint)
    assert series == {"plain": 10 + 8 * endpoints + 4 + 5 + 9, "draft": 10 + 9 * endpoints + 4 + 5 + 9}


@pytest.mark.parametrize("accept", [None, "application/openmetrics-text; version=1.0.0"])
def test_the_endpoint_serves_gzip_that_decompresses_to_the_plain_answer(accept: str | None) -> None:
    from specwatch.core.state import Fleet

    exposition = Exposition(Fleet(Settings().servers), lambda: ExporterStatus(15.0, 60.0))
    app = WebApp(exposition.scrape, page=lambda: "", reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    try:
        headers = {"Accept": accept} if accept else {}
        plain = httpx.get(f"http://{host}:{port}/metrics", headers={**headers, "Accept-Encoding": "identity"})
        zipped = httpx.get(f"http://{host}:{port}/metrics", headers={**headers, "Accept-Encoding": "gzip"})
    finally:
        app.stop()
    assert "content-encoding" not in plain.headers and zipped.headers["content-encoding"] == "gzip"
    assert zipped.headers["content-type"] == plain.headers["content-type"]

    def specwatch_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if "specwatch_" in line]

    assert specwatch_lines(zipped.text) == specwatch_lines(plain.text) and len(specwatch_lines(plain.text)) > 20


async def test_a_scrape_serves_what_was_just_prepared_unless_servers_or_settings_changed(make_watcher, monkeypatch) -> None:
    fakes = {"a": FakeLlama.plain(tokens=8), "b": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes))
    status = ExporterStatus(15.0, 60.0)
    renderer = TextRenderer(watcher.fleet, lambda: status)
    renderer.prepare()
    prepared, text = renderer.versioned()
    await watcher.canary("b")  # a new value, within the preparation's lifetime: served at the next preparation
    assert renderer.versioned()[0] == prepared and renderer.text() == b"".join(text)
    renderer.prepare()
    assert renderer.versioned()[0] != prepared and renderer.text() != b"".join(text)
    assert 'endpoint="chat",server="b"' in renderer.text().decode()

    status = replace(status, reload_successful=False)  # a reload: served at once
    assert b"specwatch_config_last_reload_successful 0.0" in renderer.text()
    renderer.prepare()
    settings = Settings(servers=[{"name": "a", "url": "http://a:8080"}], canary_tokens=8)
    watcher.apply(settings, list(settings.servers))  # a server removed: served at once
    assert 'server="b"' not in renderer.text().decode()

    renderer.prepare()
    await watcher.poll("a")
    monkeypatch.setattr("specwatch.daemon.exposition.text.PREPARED_FOR", 0.0)  # a preparation too old is not served
    assert renderer.text() == _registry_text(watcher.fleet, lambda: status)


async def test_the_scrapes_of_one_preparation_compress_the_fleet_once(make_watcher, monkeypatch) -> None:
    fakes = {"a": FakeLlama.plain(tokens=8), "b": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    exposition.renderer.prepare()
    from specwatch.daemon.exposition import serve

    made: list[bytes] = []
    original = serve._GzipPrefix.__init__

    def counting(self, generation: int, parts: tuple[bytes, ...]) -> None:
        made.append(b"".join(parts))
        original(self, generation, parts)

    monkeypatch.setattr(serve._GzipPrefix, "__init__", counting)
    bodies = [exposition.scrape(None, "gzip").body for _ in range(3)]
    fleet_text = exposition.renderer.text()
    for body in bodies:
        # One member: a reader that stops after the first (httpx, urllib3) sees it all.
        assert zlib.decompress(body, wbits=31).startswith(fleet_text) and b"process_cpu_seconds_total" in gzip.decompress(body)
        assert zlib.decompress(body, wbits=31) == gzip.decompress(body)
    assert made == [fleet_text], "the fleet's text is compressed once per preparation, the process metrics at each scrape"


def test_the_daemons_scrapes_serve_what_its_background_thread_prepared(monkeypatch) -> None:
    """The daemon's status function makes a new object per call: a scrape must still find the preparation current."""
    from specwatch.daemon.run import Daemon
    from specwatch.settings.loading import load_settings

    daemon = Daemon(None, load_settings(None))
    renderer = daemon.exposition.renderer
    renderer.prepare()
    renders = []
    original = renderer._render
    monkeypatch.setattr(renderer, "_render", lambda status: renders.append(1) or original(status))
    daemon.exposition.scrape(None, None)
    daemon.exposition.scrape(None, "gzip")
    assert renders == []
    daemon.status = replace(daemon.status, reload_successful=False)  # a reload: rendered at once
    daemon.exposition.scrape(None, None)
    assert renders == [1]


PROMETHEUS_2 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;"
                "version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")


@pytest.mark.parametrize(("accept", "openmetrics"), [
    (None, False), ("", False), ("*/*", False), ("text/plain", False), (PROMETHEUS_2, False), (PROMETHEUS_3, False),
    ("application/openmetrics-text; version=1.0.0", True),
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75", True),
    ("application/openmetrics-text;version=1.0.0,text/plain;q=0", True),
])
def test_the_text_format_is_served_to_every_scraper_that_accepts_it(accept: str | None, openmetrics: bool, monkeypatch) -> None:
    """Prometheus lists OpenMetrics first but accepts the text format, which the incremental renderer serves; rendering
    OpenMetrics means collecting every family afresh (1.5 s at 1,000 servers), so only a scraper that asks for nothing
    else gets it, as Go exporters do unless told otherwise."""
    from specwatch.core.state import Fleet

    exposition = Exposition(Fleet(Settings().servers), lambda: ExporterStatus(15.0, 60.0))
    collected = []
    original = exposition.collector.collect
    monkeypatch.setattr(exposition.collector, "collect", lambda: collected.append(1) or original())
    app = WebApp(exposition.scrape, page=lambda: "", reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    try:
        for encoding in ("identity", "gzip"):
            headers = {"Accept-Encoding": encoding, **({"Accept": accept} if accept is not None else {})}
            content_type = httpx.get(f"http://{host}:{port}/metrics", headers=headers).headers["content-type"]
            assert content_type.startswith("application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4")
    finally:
        app.stop()
    assert bool(collected) is openmetrics


def _fails_once(group: samples.Group, failures: list[int], fleet=None) -> samples.Group:
    """The group, raising at its first use (on a server of `fleet`): a render that fails half-way, its memos half
    brought up to date."""
    def build(out, server) -> None:
        # GROUPS is the module's: any other exposition still rendering in this process (a preparer thread of an
        # earlier test's daemon) renders through it too, and must not take the one fault.
        if not failures and (fleet is None or any(server is s for s in fleet.snapshot())):
            failures.append(1)
            raise RuntimeError("injected fault in " + group.samples.__name__)
        group.samples(out, server)

    return replace(group, samples=build)


def _errors_total(body: str) -> float:
    (value,) = [line.split()[-1] for line in body.splitlines() if line.startswith("specwatch_exposition_errors_total ")]
    return float(value)


async def test_a_scrape_whose_render_fails_is_answered_500_logged_counted_and_the_next_one_is_whole(make_watcher,
                                                                                                   monkeypatch) -> None:
    fakes = {"a": FakeLlama.plain(tokens=8), "b": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    failures: list[int] = []
    faulty = tuple(_fails_once(g, failures, watcher.fleet) if g.samples is samples.canary_samples else g
                   for g in samples.GROUPS)
    monkeypatch.setattr("specwatch.daemon.exposition.text.GROUPS", faulty)
    # The scrape's own render meets the fault, never this exposition's preparer (its first wakes a second after the
    # first scrape: a loaded machine can take that long between two requests).
    monkeypatch.setattr("specwatch.daemon.exposition.serve.PREPARE_SECONDS", 3600.0)
    app = WebApp(exposition.scrape, page=lambda: "", reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    try:
        with structlog.testing.capture_logs() as logs:
            failed = httpx.get(f"http://{host}:{port}/metrics")
            good = httpx.get(f"http://{host}:{port}/metrics")
    finally:
        app.stop()
    assert (failed.status_code, failed.text) == (500, "error collecting metrics: RuntimeError\n")
    assert [e for e in logs if e["event"] == "metrics_render_failed"] == [{
        "event": "metrics_render_failed", "log_level": "error", "during": "scrape",
        "error": "RuntimeError: injected fault in canary_samples", "exposition_errors_total": 1}]
    assert good.status_code == 200 and _errors_total(good.text) == 1
    # Every line, the failed group's included: nothing half-made is served as current.
    fleet = good.text[: good.text.index("# HELP process_")].encode()
    assert fleet == _registry_text(watcher.fleet, lambda: ExporterStatus(15.0, 60.0, exposition_errors=1))


async def test_a_failing_background_preparation_is_counted_logged_once_and_scrapes_still_work(make_watcher,
                                                                                              monkeypatch) -> None:
    import threading
    import time

    watcher = make_watcher({"a": FakeLlama.plain(tokens=8)}, canary_tokens=8)
    await watcher.poll("a")
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    snapshot = watcher.fleet.snapshot
    broken = threading.Event()
    broken.set()

    def in_the_background_broken():
        if broken.is_set() and threading.current_thread().name == "specwatch-metrics":
            raise KeyError("injected fault in the fleet's snapshot")
        return snapshot()

    monkeypatch.setattr(watcher.fleet, "snapshot", in_the_background_broken)
    monkeypatch.setattr("specwatch.daemon.exposition.serve.PREPARE_SECONDS", 0.01)

    def errors_total() -> float:
        return _errors_total(exposition.scrape(None, None).body.decode())

    with structlog.testing.capture_logs() as logs:
        assert errors_total() == 0  # the first scrape starts the background preparation
        deadline = time.monotonic() + 10
        while errors_total() < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        broken.clear()
        time.sleep(0.05)  # a preparation that met the fault just before has counted it
        counted = errors_total()
        time.sleep(0.1)
        after = exposition.scrape(None, None).body.decode()
    assert counted >= 5 and _errors_total(after) == counted, "failures stop being counted once it prepares again"
    assert [e for e in logs if e["event"] == "metrics_render_failed"] == [{
        "event": "metrics_render_failed", "log_level": "error", "during": "prepare",
        "error": "KeyError: \"injected fault in the fleet's snapshot\"", "exposition_errors_total": 1}]
    assert 'specwatch_up{server="a"} 1.0' in after
