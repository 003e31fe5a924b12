"""Reload on SIGHUP and POST /-/reload against a real `specwatch run`: bad configs refused, fleets changed live."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.loopback import FaultServer
from tests.support.metrics import Samples, scrape, value
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

RELOAD_OK = "specwatch_config_last_reload_successful"
RELOAD_AT = "specwatch_config_last_reload_success_timestamp_seconds"


def samples(exporter: ExporterProcess) -> Samples:
    return scrape(f"{exporter.url()}/metrics")


def servers_in(found: dict) -> set[str]:
    return {dict(labels)["server"] for _, labels in found if "server" in dict(labels)}


def write(path: Path, servers: list[dict], **extra: object) -> None:
    path.write_text(yaml.safe_dump({"servers": servers, "poll_interval": "1s", "poll_timeout": "250ms",
                                    "canary_interval": "1s", "canary_endpoints": ["chat"], "canary_tokens": 8, **extra}))


@pytest.fixture
def fleet():
    with FaultServer(FakeLlama.plain(tokens=8)) as a, FaultServer(FakeLlama.draft(tokens=8)) as b, \
            FaultServer(FakeLlama.plain(tokens=8)) as c:
        yield {"a": a, "b": b, "c": c}


@pytest.fixture
def running(tmp_path, fleet):
    config = tmp_path / "specwatch.yml"
    write(config, [{"name": n, "url": fleet[n].url} for n in ("a", "b")])
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        wait_until("a and b up", lambda: value(samples(exporter), "specwatch_up", server="a") == 1 and
                 value(samples(exporter), "specwatch_up", server="b") == 1, timeout=15, alive=exporter.process)
        yield exporter, config


def reload_events(exporter: ExporterProcess, event: str) -> int:
    return sum(e.get("event") == event for e in exporter.events())


def still_polled(*servers: FaultServer, seconds: float = 1.0) -> bool:
    """True when every one of `servers` answered another poll within `seconds`."""
    before = [s.count("/props") for s in servers]
    time.sleep(seconds)
    return all(s.count("/props") > b for s, b in zip(servers, before, strict=True))


@pytest.mark.real
def test_a_bad_config_is_refused_and_the_old_one_keeps_running(running, fleet, tmp_path) -> None:
    exporter, config = running
    first = samples(exporter)
    assert value(first, RELOAD_OK) == 1
    loaded_at = value(first, RELOAD_AT)
    assert loaded_at is not None and abs(loaded_at - time.time()) < 60

    write(config, [{"name": "a", "url": "ftp://nowhere"}, {"name": "a", "url": fleet["c"].url, "colour": "red"}])
    answer = httpx.post(f"{exporter.url()}/-/reload", timeout=30)
    assert answer.status_code == 500
    assert answer.text.startswith("reload failed, the previous configuration keeps running:\n")
    assert f"invalid config file {str(config)!r} (3 problems):" in answer.text
    assert "servers[0] (a).url: 'ftp://nowhere' is not an http:// or https:// URL" in answer.text
    assert "servers[1] (a).colour: unknown key" in answer.text
    assert "servers[1].name: 'a' is already used by servers[0]; names must be unique" in answer.text

    after = samples(exporter)
    assert value(after, RELOAD_OK) == 0
    assert value(after, RELOAD_AT) == loaded_at
    assert servers_in(after) == {"a", "b"}
    assert still_polled(fleet["a"], fleet["b"])
    assert fleet["c"].count() == 0
    [failed] = [e for e in exporter.events() if e.get("event") == "reload_failed"]
    assert "is not an http:// or https:// URL" in failed["error"]

    config.write_text("servers:\n  - name: a\n    url: [unclosed\n")
    exporter.signal(signal.SIGHUP)
    wait_until("the SIGHUP reload to fail", lambda: reload_events(exporter, "reload_failed") == 2, timeout=10, alive=exporter.process)
    assert value(samples(exporter), RELOAD_OK) == 0
    assert still_polled(fleet["a"])
    assert exporter.process.poll() is None


@pytest.mark.real
def test_sighup_swaps_the_fleet_without_a_restart(running, fleet) -> None:
    exporter, config = running
    loaded_at = value(samples(exporter), RELOAD_AT)
    time.sleep(0.05)  # the new timestamp must be able to differ
    write(config, [{"name": "b", "url": fleet["b"].url}, {"name": "c", "url": fleet["c"].url, "labels": {"pool": "eval"}}])
    exporter.signal(signal.SIGHUP)

    def swapped() -> dict | None:
        found = samples(exporter)
        return found if value(found, "specwatch_up", server="c", pool="eval") == 1 else None

    found = wait_until("c to appear", swapped, timeout=15, alive=exporter.process)
    assert servers_in(found) == {"b", "c"}
    assert value(found, "specwatch_servers") == 2
    assert value(found, RELOAD_OK) == 1
    assert value(found, RELOAD_AT) > loaded_at
    assert value(found, "specwatch_up", server="b") == 1
    # a is no longer probed at all, not merely hidden.
    time.sleep(0.5)
    assert not still_polled(fleet["a"])
    (reloaded,) = [e for e in exporter.events() if e.get("event") == "reloaded"]
    assert (reloaded["servers"], reloaded["added"], reloaded["removed"], reloaded["changed"]) == (2, 1, 1, ["servers"])


@pytest.mark.real
def test_post_reload_recovers_after_a_failed_one(running, fleet, tmp_path) -> None:
    exporter, config = running
    write(config, [{"name": "a", "url": fleet["a"].url, "api_key_file": str(tmp_path / "missing.key")}])
    refused = httpx.post(f"{exporter.url()}/-/reload", timeout=30)
    assert refused.status_code == 500
    assert f"api_key_file {str(tmp_path / 'missing.key')!r} cannot be read: No such file or directory" in refused.text
    assert value(samples(exporter), RELOAD_OK) == 0

    write(config, [{"name": "a", "url": fleet["a"].url}, {"name": "c", "url": fleet["c"].url}])
    accepted = httpx.post(f"{exporter.url()}/-/reload", timeout=30)
    assert (accepted.status_code, accepted.text) == (200, "configuration reloaded\n")
    found = wait_until("c up", lambda: (f := samples(exporter)) and value(f, "specwatch_up", server="c") == 1 and f, timeout=15)
    assert servers_in(found) == {"a", "c"}
    assert value(found, RELOAD_OK) == 1
    assert httpx.get(f"{exporter.url()}/-/reload", timeout=10).status_code == 405
