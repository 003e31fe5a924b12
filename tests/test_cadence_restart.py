"""A real llama-server stopped and restarted while watched: down is unknown, and a restart with speculation is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.core.state import Fleet
from specwatch.daemon.watch import Watcher
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.reasons import Reason
from specwatch.settings.schema import Settings

pytestmark = pytest.mark.real


async def test_stop_and_restart_with_speculation_while_watched(tmp_path: Path) -> None:
    model = write_cycle_model(tmp_path / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, log_dir=tmp_path).start()
    neighbour = LlamaServer.of_kind("plain", model, log_dir=tmp_path).start()
    restarted: LlamaServer | None = None
    settings = Settings(
        servers=[{"name": "target", "url": plain.url}, {"name": "neighbour", "url": neighbour.url}],
        canary_endpoints=["chat", "completion"],
    )
    client = new_client()
    watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints), Fetcher(client, settings.max_response_bytes))
    try:
        await watcher.poll("target")
        await watcher.canary("target")
        state = watcher.fleet.get("target")
        assert state.poll_success and state.model().poll.slots.speculative is False
        assert state.model().serving_fill_ins is False

        plain.stop()
        await watcher.poll("target")
        await watcher.poll("neighbour")
        state = watcher.fleet.get("target")
        assert (state.poll_success, state.model().poll, state.poll_failure_reason) == (False, None, Reason.CONNECTION_REFUSED)
        assert watcher.fleet.get("neighbour").poll_success is True

        # The operator brings it back on the same address, now with a draft model.
        restarted = LlamaServer.of_kind("draft", model, port=plain.port, log_dir=tmp_path).start()
        await watcher.poll("target")
        await watcher.canary("target")
        state = watcher.fleet.get("target")
        assert state.poll_success and state.model().poll.slots.speculative is True
        assert state.model().serving_fill_ins is True
        assert all(c.tally.fill_ins == c.tally.tokens - 1 for c in state.model().canaries.values())
    finally:
        await client.aclose()
        for server in (plain, neighbour, restarted):
            if server is not None:
                server.stop()
