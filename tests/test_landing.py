"""The landing page in a real headless Chromium: the summary on-call reads first, then every server, worst first."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from specwatch.daemon import landing, peering
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.serve import Exposition
from specwatch.daemon.web import WebApp
from tests.support.fakes import peer_round
from tests.support.wire import FakeLlama

pytestmark = pytest.mark.real

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# 22 servers as on-call meets them: 4 serving fill-ins and 1 on a build that fixes all but post_sampling_probs,
# 1 speculating without drafting, 2 that specwatch cannot check (a wrong key, never polled), 13 clean and 1 clean
# on a build that drafts with real logprobs.
FAKES = {
    **{f"draft-{i}": FakeLlama.draft() for i in range(4)},
    "fixed": FakeLlama.fixed_build(),
    "fixed-all": FakeLlama.future_fixed(),
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
    # Never polled, and out of every peer group: the others are compared without waiting for its first poll.
    servers.append({"name": NEVER, "url": "http://never:1", "peer_group": "none"})
    watcher = make_watcher(FAKES, servers=servers)

    async def probe() -> None:
        for name in FAKES:
            await watcher.tick(name)  # its poll, then its canaries and the peer probes it made due
        while watcher._rounds:
            await asyncio.gather(*watcher._rounds)
        # A peer-probe round of every server (the daemon asks it at each member's phase after its canaries), counted
        # once each has had its turn.
        await peer_round(watcher, FAKES)
        # As the daemon's next tick does, once a group of this size may be compared again.
        await asyncio.sleep(peering.SECONDS_PER_MEMBER * len(servers))
        watcher.peers.settle()

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
            assert summary.inner_text() == "5 of 22 serving fill-ins · 1 unproven · 2 unchecked · 14 clean"
            # Above the fold: on a laptop-sized window the summary shows without scrolling.
            box = summary.bounding_box()
            assert box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 720
            assert "alarm" in (summary.get_attribute("class") or "")
            page.screenshot(path=str(tmp_path / "landing.png"))

            rows = page.locator("#servers tbody tr")
            cells = [[c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(rows.count())]
            verdicts = [row[1] for row in cells]
            assert verdicts == ["fill_ins"] * 5 + ["unproven"] + ["unchecked"] * 2 + ["clean"] * 14
            by_name = {row[0]: row for row in cells}
            assert by_name["draft-0"][2].startswith("the server serves fill-in logprobs (fill-ins / tokens after the first: completion ")
            assert by_name["draft-0"][4] == "agrees with group tiny"  # its fill-ins are not compared, its tokens are
            assert by_name["draft-0"][5] == "up; speculation per /slots: on"
            assert by_name["draft-0"][6].endswith("s ago") and by_name["draft-0"][7].endswith("s ago")
            assert by_name["draft-0"][8] == "pool=eval"
            # Per endpoint, a fixed build shows what drafted with real logprobs apart from what serves fill-ins.
            endpoints = dict(line.split(": ", 1) for line in by_name["fixed"][3].splitlines())
            assert endpoints["completion_post_sampling"] == "fill-ins 31/31"
            assert endpoints["chat"] == endpoints["v1_completion_stream"] == "drafted 24, logprobs real"
            assert "completion_post_sampling 31/31" in by_name["fixed"][2]
            assert set(dict(line.split(": ", 1) for line in by_name["fixed-all"][3].splitlines()).values()) == {
                "drafted 24, logprobs real"}
            assert set(dict(line.split(": ", 1) for line in by_name["plain-00"][3].splitlines()).values()) == {
                "did not draft, logprobs real"}
            assert len(by_name["plain-00"][3].splitlines()) == 7
            assert by_name["ngram-quiet"][2].startswith("/slots says the server speculates, but no canary drafted")
            assert [by_name["locked"][i] for i in (1, 2, 4, 5)] == [
                "unchecked", "could not poll the server: unauthorized: HTTP 401 on /props", "", "down (unauthorized)"]
            assert by_name["locked"][6:8] == ["never", "never"]
            assert [by_name[NEVER][i] for i in (1, 2, 5)] == ["unchecked", "could not poll the server: not polled yet",
                                                             "not polled yet"]
            assert [by_name["plain-00"][i] for i in (1, 2, 5)] == [
                "clean", "logprobs are real: every token carries its alternatives", "up; speculation per /slots: off"]
            assert rows.nth(0).get_attribute("class") == "fill_ins"
            html = page.content()
            assert "sk-landing-secret" not in html and "<script>x" not in html
            page.get_by_role("link", name="Metrics").click()
            page.wait_for_load_state()
            assert page.url.endswith("/metrics")
            assert 'specwatch_verdict{pool="eval",server="draft-0",verdict="fill_ins"} 1.0' in page.inner_text("body")
        finally:
            browser.close()
