"""A gzipped scrape that comes on its interval finds the fleet's text compressed by the preparation just before it."""

from __future__ import annotations

import gzip

import pytest

from specwatch.daemon.exposition import serve
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.serve import Exposition, _period, _Scrapes
from tests.support.wire import FakeLlama


@pytest.mark.parametrize(("times", "period"), [
    ([0.0, 15.0, 30.0, 45.0], 15.0),
    ([0.0, 15.01, 29.98, 45.0], 15.0),  # Prometheus' milliseconds of jitter
    ([0.0, 7.0, 15.0, 22.0, 30.0, 37.0], 15.0),  # an HA pair at other phases
    ([0.0, 15.0], None),  # one gap says nothing yet
    ([0.0], None),
])
def test_the_scrape_interval_is_the_gap_most_scrapes_are_followed_after(times: list[float], period: float | None) -> None:
    found = _period(times, _Scrapes.TOLERANCE)
    assert found == period or (period is not None and found is not None and abs(found - period) <= 0.1)


def test_a_scrape_is_due_one_interval_after_the_last_until_it_comes() -> None:
    scrapes = _Scrapes()
    for at in (100.0, 115.0, 130.0):
        scrapes.seen(at)
    assert not scrapes.due(140.0, 1.3)
    assert scrapes.due(144.0, 1.3) and scrapes.due(145.2, 1.3)
    scrapes.seen(145.05)
    assert not scrapes.due(145.2, 1.3), "the scrape came: the next is an interval away"
    assert not scrapes.due(147.0, 1.3), "a scrape that never came is not waited for"


async def test_the_preparation_before_a_due_scrape_compresses_and_the_scrape_does_not(make_watcher, monkeypatch) -> None:
    fakes = {"a": FakeLlama.plain(tokens=8), "b": FakeLlama.draft(tokens=8)}
    watcher = make_watcher(fakes, canary_tokens=8)
    for name in fakes:
        await watcher.poll(name)
        await watcher.canary(name)
    exposition = Exposition(watcher.fleet, lambda: ExporterStatus(15.0, 60.0))
    made: list[str] = []
    original = serve._GzipPrefix.__init__

    def counting(self, generation: int, parts: tuple[bytes, ...]) -> None:
        import threading

        made.append(threading.current_thread().name)
        original(self, generation, parts)

    monkeypatch.setattr(serve._GzipPrefix, "__init__", counting)
    clock = [1000.0]
    monkeypatch.setattr(serve.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(serve, "_prepare_forever", lambda *args: None)  # this test prepares, not a thread
    for at in (1000.0, 1015.0, 1030.0):
        clock[0] = at
        exposition.renderer.prepare()
        exposition.scrape(None, "gzip")
    assert len(made) == 3, "scrapes nobody foresaw compress the text themselves"
    clock[0] = 1040.0
    await watcher.poll("a")
    exposition.prepare()
    assert len(made) == 3, "no scrape is due: nothing is compressed ahead"
    clock[0] = 1044.2
    await watcher.poll("b")
    exposition.prepare()
    assert len(made) == 4, "a scrape is due within a preparation: compressed now"
    clock[0] = 1045.0
    body = exposition.scrape(None, "gzip").body
    assert len(made) == 4, "the scrape found it compressed"
    assert gzip.decompress(body).startswith(exposition.renderer.text())
