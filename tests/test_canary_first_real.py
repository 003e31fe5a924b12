"""The canary first on real one-slot llama-servers of one model on a loaded machine (issue 37): the daemon's first
canaries are answered before the peer probe's first question arrives, and the drafting replica's fill-in verdict comes
within the canary timeout of its first canary, with peers as without."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from specwatch.core.state import Fleet
from specwatch.core.verdict import Verdict
from specwatch.daemon.schedule import Schedule
from specwatch.daemon.watch import Watcher
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.peerprobe import PATH, prompts
from specwatch.settings.schema import Settings
from tests.support import builds
from tests.support.builds import PREBUILT
from tests.support.proxy import Exchange, Proxy

pytestmark = [pytest.mark.real, pytest.mark.slow]

ALIAS = "cycle"
ENDPOINTS = list(Endpoint)
"""Every endpoint: the first full round is long enough (seven canaries) that a peer probe would meet it."""
CANARY_PATHS = {TABLE[endpoint].path for endpoint in ENDPOINTS}
INTERVAL = 10.0
"""canary_interval and canary_timeout (the timeout may not be longer)."""


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LlamaServer]]:
    """Two one-slot replicas of the cycle model on build 11549 (the prebuilt one starts in seconds), one drafting."""
    work = tmp_path_factory.mktemp("canary-first")
    model = write_cycle_model(work / "cycle.gguf")
    kinds = {"plain": [], "draft": ["-md", str(model), "--spec-type", "draft-simple"]}
    started: dict[str, LlamaServer] = {}
    try:
        for name, extra in kinds.items():
            started[name] = LlamaServer(model, ["-a", ALIAS, *extra], build=builds.get(PREBUILT), parallel=1,
                                        log_dir=work).start()
        yield started
    finally:
        for server in started.values():
            server.close()


@contextlib.contextmanager
def loaded_machine() -> Iterator[None]:
    """A busy loop on every CPU for as long as the test watches."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(10)


def _question(exchange: Exchange) -> bool:
    return exchange.path == PATH and json.loads(exchange.body).get("prompt") in set(prompts())


def canaries(exchanges: list[Exchange]) -> list[Exchange]:
    """The canaries' requests, in the order they arrived (the v1_completion canary asks the peer probe's path)."""
    return sorted((e for e in exchanges if e.path in CANARY_PATHS and not _question(e)), key=lambda e: e.arrived)


def questions(exchanges: list[Exchange]) -> list[Exchange]:
    """The peer probe's requests, in the order they arrived."""
    return sorted((e for e in exchanges if _question(e)), key=lambda e: e.arrived)


@dataclass
class Run:
    exchanges: dict[str, list[Exchange]]
    verdict_after: float | None
    """Seconds from the drafting replica's first canary's arrival to its fill_ins verdict."""


async def _watch(servers: dict[str, LlamaServer], *, peers: bool, timeout: float = 40.0) -> Run:
    """The daemon's watcher and schedule on both replicas, each behind a recording proxy, until the drafting replica's
    verdict is fill_ins and (with peers) each replica answered the peer probe's first round."""
    with contextlib.ExitStack() as stack:
        proxies = {name: stack.enter_context(Proxy([server.url])) for name, server in servers.items()}
        settings = Settings(
            servers=[{"name": name, "url": proxy.url, **({} if peers else {"peer_group": "none"})}
                     for name, proxy in proxies.items()],
            poll_interval=1, canary_interval=INTERVAL, canary_timeout=INTERVAL, canary_endpoints=ENDPOINTS)
        fleet = Fleet(settings.servers, settings.canary_endpoints)
        client = new_client()
        watcher = Watcher(settings, fleet, Fetcher(client, settings.max_response_bytes))
        verdict_at: list[float] = []
        canaried = watcher._canaried

        def timed(server, key, endpoint, measured, change) -> None:  # type: ignore[no-untyped-def]
            canaried(server, key, endpoint, measured, change)
            if server.name == "draft" and not verdict_at and fleet.get("draft").model().decision.verdict is Verdict.FILL_INS:
                verdict_at.append(time.monotonic())

        watcher._canaried = timed  # type: ignore[method-assign]
        schedule = Schedule(watcher)
        schedule.start(list(settings.servers))
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                asked = all(len(questions(list(proxy.exchanges))) >= 1 for proxy in proxies.values())
                if verdict_at and (asked or not peers):
                    break
                await asyncio.sleep(0.05)
        finally:
            schedule.shutdown()
            await watcher.close()
            await client.aclose()
        exchanges = {name: list(proxy.exchanges) for name, proxy in proxies.items()}
    first = canaries(exchanges["draft"])
    return Run(exchanges, verdict_at[0] - first[0].arrived if verdict_at and first else None)


async def test_the_first_canaries_go_before_the_peer_probe_and_the_verdict_comes_as_fast_as_without_peers(
        servers: dict[str, LlamaServer]) -> None:
    with loaded_machine():
        paired = await _watch(servers, peers=True)
        alone = await _watch(servers, peers=False)
    for name in servers:
        asked = questions(paired.exchanges[name])
        assert len(asked) >= 1, (name, paired.exchanges[name])
        first_round = canaries(paired.exchanges[name])[:len(ENDPOINTS)]
        # Every canary of the first full round was answered before the first question arrived at the server.
        assert len(first_round) == len(ENDPOINTS) and max(c.answered for c in first_round) <= asked[0].arrived, (
            name, first_round, asked[0])
        assert not questions(alone.exchanges[name])
    assert paired.verdict_after is not None and alone.verdict_after is not None
    assert paired.verdict_after <= INTERVAL, paired.verdict_after  # within the canary timeout of its first canary
    assert alone.verdict_after <= INTERVAL, alone.verdict_after
