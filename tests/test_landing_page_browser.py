"""The landing page in a real headless Chromium: the table an SRE reads, and the link to /metrics."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from exporter.daemon.collector import ExporterStatus, Exposition
from exporter.daemon.run import landing_row
from exporter.daemon.web import WebApp
from tests.fakes import FakeLlama

pytestmark = pytest.mark.real

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


@pytest.fixture
def served(make_watcher, tmp_path: Path):
    key = tmp_path / "key"
    key.write_text("sk-landing-secret")
    watcher = make_watcher(
        {"plain": FakeLlama.plain(), "draft": FakeLlama.draft(), "locked": FakeLlama.plain(api_key="other")},
        servers=[
            {"name": "plain", "url": "http://plain:8080"},
            {"name": "draft", "url": "http://draft:8080"},
            {"name": "locked", "url": "http://locked:8080", "api_key_file": str(key)},
            {"name": "<script>x</script>", "url": "http://never:1"},
        ],
    )

    async def probe() -> None:
        for name in ("plain", "draft", "locked"):
            await watcher.poll(name)
            await watcher.canary(name)

    asyncio.run(probe())
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    app = WebApp(exposition.render, servers=lambda: [landing_row(s) for s in watcher.fleet.snapshot()], reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    yield f"http://{host}:{port}/"
    app.stop()


def test_landing_page_in_chromium(served: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium package is required (see the README's test command)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(served)
            rows = page.locator("#servers tbody tr")
            cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(rows.count())]
            by_name = {row[0]: row for row in cells}
            assert by_name["plain"][2:] == ["up; speculation per /slots: off", "clean",
                                            "logprobs are real: every token carries its alternatives"]
            assert by_name["draft"][3] == "fill_ins"
            assert by_name["draft"][4].startswith("the server serves fill-in logprobs (fill-ins / tokens after the first: chat ")
            assert by_name["locked"][2:4] == ["down (unauthorized)", "unchecked"]
            assert by_name["<script>x</script>"][2:] == ["not polled yet", "unchecked", "could not poll the server: not polled yet"]
            assert rows.nth(1).get_attribute("class") == "fill_ins"
            html = page.content()
            assert "sk-landing-secret" not in html and "<script>x" not in html
            page.screenshot(path=str(tmp_path / "landing.png"), full_page=True)
            page.get_by_role("link", name="Metrics").click()
            page.wait_for_load_state()
            assert page.url.endswith("/metrics")
            assert 'specwatch_serving_placeholders{server="draft"} 1.0' in page.inner_text("body")
        finally:
            browser.close()
