"""The cached /metrics renderer: gzip from reused deflate runs, nothing rebuilt for unchanged servers, series per server."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import replace

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import exporter.daemon.collector
from exporter.daemon.collector import ExporterStatus, Exposition, SpecwatchCollector, gzip_member
from exporter.daemon.web import WebApp
from exporter.settings.schema import Settings
from tests.support.wire import FakeLlama


def _registry_text(collector: SpecwatchCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def test_gzip_member_of_separate_runs_is_one_valid_member() -> None:
    texts = [b"# HELP a x\n" + b"a{server=\"s\"} 1.0\n" * 500, b"", b"b 2.0\n" * 3, "é\n".encode()]
    member = gzip_member([exporter.daemon.collector._Block(text) for text in texts], tail=b"tail 1.0\n")
    expected = b"".join(texts) + b"tail 1.0\n"
    assert gzip.decompress(member) == expected
    assert zlib.decompress(member, wbits=31) == expected  # one member: a reader that stops after the first sees it all
    assert httpx.Response(200, headers={"Content-Encoding": "gzip"}, content=member).content == expected
    assert exporter.daemon.collector._crc32_combine is not None, "zlib's crc32_combine is found where CI runs"


def test_gzip_member_without_crc32_combine(monkeypatch) -> None:
    monkeypatch.setattr(exporter.daemon.collector, "_crc32_combine", None)
    texts = [b"a 1.0\n" * 100, b"b 2.0\n"]
    assert gzip.decompress(gzip_member([exporter.daemon.collector._Block(t) for t in texts])) == b"".join(texts)


async def test_gzipped_exposition_is_the_text_exposition_through_every_kind_of_change(make_watcher, clock) -> None:
    fakes = {"plain": FakeLlama.plain(tokens=8), "draft": FakeLlama.draft(tokens=8), "locked": FakeLlama.plain(api_key="k")}
    servers = [{"name": name, "url": f"http://{name}:8080", "labels": {"pool": "a"}} for name in fakes]
    watcher = make_watcher(fakes, servers=servers, canary_tokens=8)
    status = ExporterStatus(15.0, 60.0, last_reload_success_timestamp=1_700_000_000.5)
    collector = SpecwatchCollector(watcher.fleet, lambda: status)

    def same() -> None:
        text = collector.exposition()
        assert gzip.decompress(collector.exposition_gzip(b"extra 1\n")) == text + b"extra 1\n"
        assert text == _registry_text(collector)

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
    text = collector.exposition().decode()
    assert 'server="draft"' not in text and 'pool="b",server="plain"' in text and 'pool="a",server="plain"' not in text


async def test_an_unchanged_fleet_rebuilds_no_line(make_watcher, monkeypatch) -> None:
    fakes = {f"s{i}": FakeLlama.draft(tokens=8) if i % 2 else FakeLlama.plain(tokens=8) for i in range(6)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    collector = SpecwatchCollector(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    collector.exposition_gzip()
    built: list[str] = []
    for group in exporter.daemon.collector._GROUPS:
        original = getattr(exporter.daemon.collector, group.build)

        def counting(out, server, labels, original=original, name=group.build) -> None:
            built.append(name)
            original(out, server, labels)

        monkeypatch.setattr(exporter.daemon.collector, group.build, counting)
    collector.exposition()
    collector.exposition_gzip()
    assert built == []
    await watcher.poll("s1")  # a poll with the same answers: its timing and counters, nothing else
    collector.exposition()
    assert built == ["_poll_samples"]


async def test_series_per_server(make_watcher) -> None:
    """What a server costs on every scrape: a guard against families growing unnoticed."""
    fakes = {"plain": FakeLlama.plain(tokens=8), "draft": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    await asyncio.gather(*(watcher.poll(n) for n in fakes), *(watcher.canary(n) for n in fakes))
    text = SpecwatchCollector(watcher.fleet, lambda: ExporterStatus(15.0, 60.0)).exposition().decode()
    series = {name: sum(1 for line in text.splitlines() if line.startswith("specwatch_") and f'server="{name}"' in line)
              for name in fakes}
    # Per server: 10 poll series, 7 per canaried endpoint (8 with draft counts), 4 verdicts and 5 other canary series.
    assert series == {"plain": 10 + 7 * 5 + 4 + 5, "draft": 10 + 8 * 5 + 4 + 5}


@pytest.mark.parametrize("accept", [None, "application/openmetrics-text; version=1.0.0"])
def test_the_endpoint_serves_gzip_that_decompresses_to_the_plain_answer(accept: str | None) -> None:
    from exporter.daemon.state import Fleet

    exposition = Exposition(Fleet(Settings().servers), lambda: ExporterStatus(15.0, 60.0))
    app = WebApp(exposition.render, metrics_gzip=exposition.render_gzip, page=lambda: "", reload=lambda: None)
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
    collector = SpecwatchCollector(watcher.fleet, lambda: status)
    collector.prepare()
    prepared = collector.exposition()
    await watcher.canary("b")  # a new value, within the preparation's lifetime: served at the next preparation
    assert collector.exposition() == prepared
    collector.prepare()
    assert collector.exposition() != prepared and 'endpoint="chat",server="b"' in collector.exposition().decode()
    assert gzip.decompress(collector.exposition_gzip()) == collector.exposition()

    status = replace(status, reload_successful=False)  # a reload: served at once
    assert b"specwatch_config_last_reload_successful 0.0" in collector.exposition()
    collector.prepare()
    settings = Settings(servers=[{"name": "a", "url": "http://a:8080"}], canary_tokens=8)
    watcher.apply(settings, list(settings.servers))  # a server removed: served at once
    assert 'server="b"' not in collector.exposition().decode()

    collector.prepare()
    await watcher.poll("a")
    monkeypatch.setattr(exporter.daemon.collector, "PREPARED_FOR", 0.0)  # a preparation too old is not served
    assert collector.exposition() == _registry_text(collector)


def test_the_daemons_scrapes_serve_what_its_background_thread_prepared(monkeypatch) -> None:
    """The daemon's status function makes a new object per call: a scrape must still find the preparation current."""
    from exporter.daemon.run import Daemon
    from exporter.settings.loading import load_settings

    daemon = Daemon(None, load_settings(None))
    collector = daemon.exposition.collector
    collector.prepare()
    renders = []
    original = collector._render
    monkeypatch.setattr(collector, "_render", lambda: renders.append(1) or original())
    collector.exposition()
    collector.exposition_gzip()
    assert renders == []
    daemon.status = replace(daemon.status, reload_successful=False)  # a reload: rendered at once
    collector.exposition()
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
    from exporter.daemon.state import Fleet

    exposition = Exposition(Fleet(Settings().servers), lambda: ExporterStatus(15.0, 60.0))
    collected = []
    original = exposition.collector.collect
    monkeypatch.setattr(exposition.collector, "collect", lambda: collected.append(1) or original())
    app = WebApp(exposition.render, metrics_gzip=exposition.render_gzip, page=lambda: "", reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    try:
        for encoding in ("identity", "gzip"):
            headers = {"Accept-Encoding": encoding, **({"Accept": accept} if accept is not None else {})}
            content_type = httpx.get(f"http://{host}:{port}/metrics", headers=headers).headers["content-type"]
            assert content_type.startswith("application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4")
    finally:
        app.stop()
    assert bool(collected) is openmetrics
