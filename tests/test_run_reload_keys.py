"""Every configuration key takes effect on reload: the running daemon's parts show the new value, none keeps its old one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwatch.core import reference
from specwatch.daemon.run import Daemon
from specwatch.probe.logprobs import logprobs_of
from specwatch.probe.readers import Token
from specwatch.settings.loading import load_settings
from specwatch.settings.schema import Settings

SERVERS = [{"name": name, "url": f"http://127.0.0.1:{port}"} for port, name in enumerate("abcdefgh", start=9)]


def _server(daemon: Daemon, name: str = "a"):
    state = daemon.fleet.get(name)
    assert state is not None
    return state.config


# key: (new value, what the running daemon must show afterwards)
CHANGES: dict[str, tuple[Any, Callable[[Daemon], bool]]] = {
    "servers": ([{"name": "c", "url": "http://127.0.0.1:11"}], lambda d: [s.config.name for s in d.fleet.snapshot()] == ["c"]),
    "poll_interval": ("7s", lambda d: d.watcher.settings.poll_interval == 7.0 and d.status.poll_interval == 7.0),
    "canary_interval": ("90s", lambda d: d.watcher.settings.canary_interval == 90.0 and d.status.canary_interval == 90.0),
    "poll_timeout": ("2s", lambda d: d.watcher.settings.timeout_for(_server(d), canary=False) == 2.0),
    "canary_timeout": ("9s", lambda d: d.watcher.settings.timeout_for(_server(d), canary=True) == 9.0),
    "canary_tokens": (12, lambda d: d.watcher.settings.canary_tokens == 12),
    "canary_tokens_speculating": (20, lambda d: d.watcher.settings.canary_tokens_speculating == 20),
    "canary_endpoints": (["chat"], lambda d: [e.value for e in d.watcher.settings.canary_endpoints] == ["chat"]
                         and all(s.endpoints == tuple(d.watcher.settings.canary_endpoints) for s in d.fleet.snapshot())),
    "max_concurrency": (3, lambda d: d.watcher.concurrency == 3),
    "max_response_bytes": (2048, lambda d: d.watcher.fetcher.max_bytes == 2048),
    # Retired keys: read, and said to be ignored (a warning the reload logs), never refused.
    "peer_tolerance": (0.25, lambda d: any(w.startswith("peer_tolerance is no longer used") for w in d.settings.warnings)),
    "peer_confirmations": (5, lambda d: any(w.startswith("peer_confirmations is no longer used")
                                            for w in d.settings.warnings)),
    "shard": ("1/2", lambda d: 0 < len(d.fleet.snapshot()) < len(SERVERS)),
    # "{tmp}" is the test's own directory, where a target file waits.
    "file_sd_configs": ([{"files": ["{tmp}/targets-*.json"]}], lambda d: "10.9.9.9:8080" in {s.config.name for s in d.fleet.snapshot()}),
    "http_sd_configs": ([{"url": "http://127.0.0.1:9/sd"}], lambda d: [s.source for s in d.discovery.status()] == ["http_sd[0]"]),
    "peer_uniform": (["tiny"], lambda d: d.watcher.peers.uniform == {"tiny"}),
    "peer_references": ({"tiny": "{tmp}/tiny.reference.json"}, lambda d: list(d.watcher.peers.references) == ["tiny"]),
}


def test_the_table_covers_every_settings_key() -> None:
    assert set(CHANGES) == set(Settings.model_fields)


@pytest.mark.parametrize("key", sorted(CHANGES))
async def test_a_reloaded_key_takes_effect(key: str, tmp_path: Path) -> None:
    config = tmp_path / "specwatch.yml"
    config.write_text(yaml.safe_dump({"servers": SERVERS}))
    (tmp_path / "targets-a.json").write_text('[{"targets": ["10.9.9.9:8080"]}]')
    reference.write(tmp_path / "tiny.reference.json", {0: logprobs_of([Token(-0.5, 1, text=" A", top=(" A", -0.5))])}, {})
    daemon = Daemon(config, load_settings(config))
    try:
        new, shows = CHANGES[key]
        assert not shows(daemon), f"{key}: the check passes before the reload, so it proves nothing"
        new = yaml.safe_load(yaml.safe_dump(new).replace("{tmp}", str(tmp_path)))
        config.write_text(yaml.safe_dump({"servers": SERVERS, key: new}))
        assert await daemon.reload() is None
        assert shows(daemon), f"{key} did not take effect on reload"
    finally:
        daemon.schedule.shutdown()
        await daemon.discovery.close()
        await daemon.client.aclose()
