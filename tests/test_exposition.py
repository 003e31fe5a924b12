"""The /metrics exposition: a golden file, promtool's lint, and the served endpoint."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from specwatch.core.state import Fleet
from specwatch.daemon.discovery import SourceStatus
from specwatch.daemon.exposition.registry import SpecwatchCollector
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.serve import Exposition
from specwatch.daemon.watch import Watcher
from specwatch.daemon.web import WebApp
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support.fakes import fake_fleet, peer_round
from tests.support.wire import FakeLlama

GOLDEN = Path(__file__).parent / "golden" / "metrics.prom"


async def _exposition() -> str:
    fakes = {"plain": FakeLlama.plain(tokens=8), "draft": FakeLlama.draft(tokens=8), "locked": FakeLlama.plain(api_key="k")}
    settings = Settings(servers=[
        {"name": "plain", "url": "http://plain:8080", "labels": {"pool": "eval"}},
        {"name": "draft", "url": "http://draft:8080", "labels": {"pool": "serve"}},
        {"name": "locked", "url": "http://locked:8080"},
    ], canary_endpoints=["chat", "completion_stream"])
    ticks = itertools.count()
    client = fake_fleet(fakes).client()
    watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, settings.max_response_bytes),
                      clock=lambda: 1_700_000_000.0, monotonic=lambda: next(ticks) * 0.25)
    for name in ("plain", "draft", "locked"):
        await watcher.poll(name)
        await watcher.ask_meta(name)
        await watcher.canary(name)
    await peer_round(watcher, ("plain", "draft", "locked"))  # the locked server refuses it (a failure by reason)
    await client.aclose()
    registry = CollectorRegistry(auto_describe=False)
    sources = (SourceStatus("file_sd[0]", 2, True, 1_699_999_000.0), SourceStatus("http_sd[0]", 0, False, None))
    registry.register(SpecwatchCollector(watcher.fleet, lambda: ExporterStatus(15.0, 60.0, True, 1_699_999_000.0,
                                                                               discovery=sources)))
    return generate_latest(registry).decode()


def test_exposition_matches_the_golden_file() -> None:
    text = asyncio.run(_exposition())
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "exposition changed; rerun with UPDATE_GOLDEN=1 if intended and review the diff"


@pytest.mark.real
def test_golden_file_passes_promtool_lint() -> None:
    result = subprocess.run(["promtool", "check", "metrics"], input=GOLDEN.read_bytes(), capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_no_sample_carries_a_timestamp() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for f in text_string_to_metric_families(GOLDEN.read_text()) for s in f.samples]
    assert len(samples) > 50
    assert all(s.timestamp is None for s in samples)


def test_endpoint_serves_metrics_landing_page_and_health() -> None:
    exposition = Exposition(Fleet(Settings().servers), lambda: ExporterStatus(15.0, 60.0))
    from specwatch.core.verdict import Verdict
    from specwatch.daemon import landing

    reloads = []
    row = landing.Row(server="a<b>", url="http://h:1", verdict=Verdict.UNCHECKED, summary="not polled yet", poll="not polled")
    app = WebApp(exposition.scrape, page=lambda: landing.render([row]), reload=lambda: reloads.append(1) or None)
    host, port = app.start("127.0.0.1", 0)
    try:
        base = f"http://{host}:{port}"
        metrics = httpx.get(f"{base}/metrics")
        assert metrics.status_code == 200 and "specwatch_build_info{" in metrics.text
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        om = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.text.rstrip().endswith("# EOF")
        landing = httpx.get(f"{base}/")
        assert 'href="metrics"' in landing.text and "a&lt;b&gt;" in landing.text and "<b>" not in landing.text
        assert httpx.get(f"{base}/-/healthy").text == "OK\n"
        assert httpx.get(f"{base}/nope").status_code == 404
        assert httpx.get(f"{base}/-/reload").status_code == 405
        assert httpx.post(f"{base}/-/reload").status_code == 200 and reloads == [1]
    finally:
        app.stop()


def test_listens_on_ipv6_loopback() -> None:
    from specwatch.daemon.web import parse_listen

    app = WebApp(Exposition(Fleet(), lambda: ExporterStatus(15.0, 60.0)).scrape, page=lambda: "", reload=lambda: None)
    host, port = app.start(*parse_listen("[::1]:0"))
    try:
        assert host == "::1" and httpx.get(f"http://[::1]:{port}/-/healthy").status_code == 200
    finally:
        app.stop()


def test_a_stalled_client_is_dropped_and_others_are_served(capfd) -> None:
    import socket

    app = WebApp(Exposition(Fleet(), lambda: ExporterStatus(15.0, 60.0)).scrape, page=lambda: "", reload=lambda: None,
                 client_timeout=0.5)
    host, port = app.start("127.0.0.1", 0)
    try:
        stalled = socket.create_connection((host, port))
        stalled.sendall(b"GET /metr")  # and then nothing
        assert httpx.get(f"http://{host}:{port}/-/healthy").status_code == 200
        stalled.settimeout(5)
        assert stalled.recv(100) == b""  # closed by the server after client_timeout
        stalled.close()
        assert "Traceback" not in capfd.readouterr().err
    finally:
        app.stop()


@pytest.mark.real
def test_daemon_serves_the_fast_text_and_openmetrics_with_process_metrics() -> None:
    from specwatch.daemon.run import Daemon
    from specwatch.settings.loading import load_settings

    daemon = Daemon(None, load_settings(None))
    app = daemon.web_app()
    host, port = app.start("127.0.0.1", 0)
    try:
        text = httpx.get(f"http://{host}:{port}/metrics").text
        openmetrics = httpx.get(f"http://{host}:{port}/metrics",
                                headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    finally:
        app.stop()
    for body in (text, openmetrics):
        assert "specwatch_build_info{" in body and "process_cpu_seconds_total" in body and "python_info{" in body
    assert text.count("# TYPE specwatch_servers gauge") == 1
    lint = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_the_reference_documents_exactly_the_exposed_metrics() -> None:
    import re

    from tests.support import markdown

    def named(text: str) -> set[str]:
        return set(re.findall(r"specwatch_[a-z_]+[a-z]", text))

    exposed = set(re.findall(r"^# TYPE (specwatch_[a-z_]+) ", GOLDEN.read_text(), flags=re.M))
    assert named(markdown.section(markdown.DOCS / "reference.md", "Metrics")) == exposed
    assert named((markdown.ROOT / "README.md").read_text()) <= exposed
