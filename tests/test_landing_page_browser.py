"""The landing page in a real headless Chromium: the summary on-call reads first, then every server, worst first."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from exporter.daemon import landing
from exporter.daemon.exposition.samples import ExporterStatus
from exporter.daemon.exposition.serve import Exposition
from exporter.daemon.web import WebApp
from tests.support.wire import FakeLlama

pytestmark = pytest.mark.real

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# 20 servers as on-call meets them: 4 serving fill-ins, 1 speculating without drafting, 2 that specwatch cannot
# check (a wrong key, never polled), 13 clean.
FAKES = {
    **{f"draft-{i}": FakeLlama.draft() for i in range(4)},
    "ngram-quiet": FakeLlama(speculative=True, drafts=0),
    "locked": FakeLlama.plain(api_key="other"),
    **{f"plain-{i:02d}": FakeLlama.plain() for i in range(13)},
}
NEVER = "<script>x</script>"


@pytest.fixture
def served(make_watcher, tmp_path: Path):
    key = tmp_path / "key"
    key.write_text("sk-landing-secret")
    servers = [{"name": name, "url": f"http://{name}:8080", "labels": {"pool": "eval" if name.startswith("draft") else "serve"}}
               for name in FAKES]
    next(s for s in servers if s["name"] == "locked")["api_key_file"] = str(key)  # a key the server refuses
    servers.append({"name": NEVER, "url": "http://never:1"})
    watcher = make_watcher(FAKES, servers=servers, canary_endpoints=["chat", "completion"])

    async def probe() -> None:
        for name in FAKES:
            await watcher.poll(name)
            if watcher.fleet.get(name).poll_success:  # as the daemon does: no canary for a server that did not answer
                await watcher.canary(name)

    asyncio.run(probe())
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    page = lambda: landing.render([row for s in watcher.fleet.snapshot() for row in landing.rows(s, watcher._clock())])  # noqa: E731
    app = WebApp(exposition.scrape, page=page, reload=lambda: None)
    host, port = app.start("127.0.0.1", 0)
    yield f"http://{host}:{port}/"
    app.stop()


def test_landing_page_in_chromium(served: str, tmp_path: Path) -> None:
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium package is required (see the README's test command)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(served)
            summary = page.locator("#summary")
            assert summary.inner_text() == "4 of 20 serving fill-ins · 1 unproven · 2 unchecked · 13 clean"
            # Above the fold: on a laptop-sized window the summary shows without scrolling.
            box = summary.bounding_box()
            assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 720
            assert "alarm" in (summary.get_attribute("class") or "")
            page.screenshot(path=str(tmp_path / "landing.png"))

            rows = page.locator("#servers tbody tr")
            cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(rows.count())]
            verdicts = [row[1] for row in cells]
            assert verdicts == ["fill_ins"] * 4 + ["unproven"] + ["unchecked"] * 2 + ["clean"] * 13
            by_name = {row[0]: row for row in cells}
            assert by_name["draft-0"][2].startswith("the server serves fill-in logprobs (fill-ins / tokens after the first: chat ")
            assert by_name["draft-0"][3] == "up; speculation per /slots: on"
            assert by_name["draft-0"][4].endswith("s ago") and by_name["draft-0"][5].endswith("s ago")
            assert by_name["draft-0"][6] == "pool=eval"
            assert by_name["ngram-quiet"][2].startswith("/slots says the server speculates, but no canary drafted")
            assert by_name["locked"][1:4] == ["unchecked", "could not poll the server: unauthorized: HTTP 401 on /props", "down (unauthorized)"]
            assert by_name["locked"][4:6] == ["never", "never"]
            assert by_name[NEVER][1:4] == ["unchecked", "could not poll the server: not polled yet", "not polled yet"]
            assert by_name["plain-00"][1:4] == ["clean", "logprobs are real: every token carries its alternatives",
                                                "up; speculation per /slots: off"]
            assert rows.nth(0).get_attribute("class") == "fill_ins"
            html = page.content()
            assert "sk-landing-secret" not in html and "<script>x" not in html
            page.get_by_role("link", name="Metrics").click()
            page.wait_for_load_state()
            assert page.url.endswith("/metrics")
            assert 'specwatch_verdict{pool="eval",server="draft-0",verdict="fill_ins"} 1.0' in page.inner_text("body")
        finally:
            browser.close()
