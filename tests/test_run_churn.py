"""Memory under churn: servers come and go by reload for many cycles, and nothing kept per server outlives its server."""

from __future__ import annotations

import asyncio
import gc
import gzip
import os
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import specwatch.probe.http.client
from specwatch.daemon import logs
from specwatch.daemon.run import Daemon
from specwatch.settings.loading import load_settings
from tests.support.net import free_port
from tests.support.simfleet import FleetOptions, SimFleetThread, write_config

pytestmark = pytest.mark.slow

CYCLES = 60
PER_CYCLE = 12
WARM = 20
"""Cycles before the baseline: imports, first pools and the allocator's arenas are done by then."""


def _config(path: Path, cycle: int, answering: list[str]) -> None:
    # New names every cycle: a third on a rotating half of the servers that answer, the rest on new origins where
    # nothing listens (a server gone for good, or discovery's churn).
    urls = [answering[(cycle + i) % len(answering)] for i in range(PER_CYCLE // 3)]
    urls += [f"http://127.0.0.1:{free_port()}" for _ in range(PER_CYCLE - len(urls))]
    servers = [{"name": f"c{cycle}-{i}", "url": url, "labels": {"cycle": str(cycle)}} for i, url in enumerate(urls)]
    write_config(path, {"servers": servers, "poll_interval": "1s", "canary_interval": "1s", "poll_timeout": "500ms",
                        "canary_timeout": "900ms", "canary_tokens": 4, "canary_tokens_speculating": 4})


def _scrape(port: int) -> bytes:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return gzip.decompress(answer.read())


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _held(daemon: Daemon) -> dict[str, int]:
    """Everything that holds something per server."""
    watcher = daemon.watcher
    return {
        "fleet": len(daemon.fleet.snapshot()),
        "scheduled": len(daemon.schedule),
        "streaks": len({key[1] for key in watcher._streaks}),
        "in_flight": len(watcher._in_flight),
        "fds": len(os.listdir("/proc/self/fd")),
        **daemon.exposition.renderer.memo_sizes(),
    }


async def _between_probes(daemon: Daemon) -> dict[str, Any]:
    """What is held once every probe has ended, the schedule paused meanwhile so that no new one starts.

    A probe in flight holds its own objects (a busy machine has more of them in flight at any moment), which say
    nothing of what outlives a server; waiting for them to end, rather than for a while, holds on any machine.
    """
    watcher = daemon.watcher
    daemon.schedule.pause()
    try:
        # Every probe ends within its timeout (fetch._bounded); a wait far beyond is a leak. Polls started just before
        # the pause take their first step on the loop's next turn, so the wait begins after that turn.
        await asyncio.sleep(0)
        deadline = asyncio.get_running_loop().time() + 60
        while watcher._in_flight or watcher._rounds:
            assert asyncio.get_running_loop().time() < deadline, f"probes never ended: {sorted(watcher._in_flight)}"
            await asyncio.sleep(0.01)
        gc.collect()
        return {"objects": len(gc.get_objects()), "rss_kb": _rss_kb(), **_held(daemon)}
    finally:
        daemon.schedule.resume()


@pytest.mark.usefixtures("restored_logging")
async def test_churned_servers_leave_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An hour of reloads and discovery changes, compressed: connections idle for a second are closed, as after four.
    monkeypatch.setattr(specwatch.probe.http.client, "KEEPALIVE_SECONDS", 1.0)
    with open(os.devnull, "w") as quiet, SimFleetThread(FleetOptions(servers=8, latency_ms=1.0, spec_share=0.5)) as fleet:
        logs.configure("warning", json=True, stream=quiet)
        urls = [s.url for s in fleet.servers]
        config = tmp_path / "specwatch.yml"
        _config(config, 0, urls)
        daemon = Daemon(config, load_settings(config))
        port = free_port()
        running = asyncio.create_task(daemon.run("127.0.0.1", port))
        seen: list[dict[str, Any]] = []
        try:
            await asyncio.sleep(0.5)
            for cycle in range(1, CYCLES + 1):
                _config(config, cycle, urls)
                assert await daemon.reload() is None
                await asyncio.sleep(0.45)  # polls, canary rounds, failures and recoveries of this cycle's servers
                text = (await asyncio.to_thread(_scrape, port)).decode()
                assert f'server="c{cycle}-0"' in text and f'server="c{cycle - 1}-0"' not in text
                if cycle in (WARM, CYCLES):
                    await asyncio.sleep(2.5)  # the previous cycles' connections idle past KEEPALIVE_SECONDS, and closed
                    await asyncio.to_thread(_scrape, port)
                    seen.append({"cycle": cycle, **await _between_probes(daemon)})
        finally:
            daemon.stop()
            await asyncio.wait_for(running, 30)

    warm, last = seen
    for what in ("fleet", "scheduled", "streaks", "labels", "entries"):
        assert last[what] <= PER_CYCLE, (what, seen)
    assert last["blocks"] <= warm["blocks"], seen
    # Connections to the servers of the last cycles at most, not to every one ever watched.
    assert last["fds"] <= warm["fds"] + 2 * PER_CYCLE, seen
    churned = (CYCLES - WARM) * PER_CYCLE
    grown = last["objects"] - warm["objects"]
    assert grown < churned, f"{grown} more objects after {churned} servers came and went: {seen}"
    assert last["rss_kb"] - warm["rss_kb"] < 4 * 1024, f"RSS grew {last['rss_kb'] - warm['rss_kb']} KB: {seen}"
