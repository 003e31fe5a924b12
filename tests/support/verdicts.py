"""A daemon's verdicts endpoint in-process: a watcher over look-alikes, polled and canaried once, on a loopback port."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from specwatch.core.state import Fleet
from specwatch.daemon import api
from specwatch.daemon.watch import Watcher
from specwatch.daemon.web import WebApp
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support.fakes import fake_fleet
from tests.support.wire import FakeLlama


@asynccontextmanager
async def serving(fakes: Mapping[str, FakeLlama], labels: Mapping[str, Mapping[str, str]]) -> AsyncIterator[str]:
    """The URL of a daemon watching `fakes` (by name, each with its `labels`), every verdict fresh."""
    servers = [{"name": name, "url": f"http://{name}:8080", "labels": dict(labels.get(name, {}))} for name in fakes]
    settings = Settings(servers=servers, canary_tokens=8, canary_tokens_speculating=8)
    async with fake_fleet(fakes).client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, settings.max_response_bytes))
        for name in fakes:
            await watcher.poll(name)
            for key in watcher.fleet.get(name).models:
                await watcher.canary(name, key)

        def verdicts(query: dict[str, list[str]]) -> dict[str, object]:
            return api.verdicts(watcher.fleet.snapshot(), settings, api.parse_selection(query), time.time())

        # Only the verdicts endpoint is asked: /metrics and the page answer nothing here.
        app = WebApp(lambda accept, encoding: None, page=lambda: "", reload=lambda: None, verdicts=verdicts)
        host, port = app.start("127.0.0.1", 0)
        try:
            yield f"http://{host}:{port}"
        finally:
            app.stop()
