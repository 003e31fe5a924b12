"""A real `specwatch run` meeting an emptied config, no config at all, and a misspelled variable."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest

from tests.support.loopback import FaultServer
from tests.support.metrics import scrape, value
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama


@pytest.mark.real
def test_an_emptied_config_is_refused_on_reload_and_the_fleet_stays_watched(tmp_path: Path) -> None:
    with FaultServer(FakeLlama.plain(tokens=8)) as llama:
        config = tmp_path / "specwatch.yml"
        config.write_text(f"servers:\n  - {{name: a, url: '{llama.url}'}}\npoll_interval: 1s\ncanary_endpoints: [chat]\n")
        with ExporterProcess("--config", str(config)) as exporter:
            exporter.wait_started()
            metrics = f"{exporter.url()}/metrics"
            wait_until("a up", lambda: value(scrape(metrics), "specwatch_up", server="a") == 1, timeout=15, alive=exporter.process)

            config.write_text("")  # : > specwatch.yml
            exporter.signal(signal.SIGHUP)
            wait_until("the reload to be refused", lambda: any(e.get("event") == "reload_failed" for e in exporter.events()), timeout=15)
            [failed] = [e for e in exporter.events() if e.get("event") == "reload_failed"]
            assert "lists no servers" in failed["error"]
            found = scrape(metrics)
            assert value(found, "specwatch_config_last_reload_successful") == 0
            assert value(found, "specwatch_up", server="a") == 1
            assert value(found, "specwatch_up", server="local-9931") is None
            assert value(found, "specwatch_up", server="local-8080") is None

            config.write_text("servers: []\n")
            answer = httpx.post(f"{exporter.url()}/-/reload", timeout=30)
            assert answer.status_code == 500 and "lists no servers" in answer.text
            before = llama.count("/props")
            wait_until("a to be polled still", lambda: llama.count("/props") > before, timeout=15, alive=exporter.process)


@pytest.mark.real
def test_no_config_at_all_logs_a_warning_with_the_way_out(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SPECWATCH_")}
    env["SPECWATCH_POLL_INTERVALL"] = "30s"
    with ExporterProcess(env=env) as exporter:
        exporter.wait_started()
        events = exporter.events()
        [default] = [e for e in events if e.get("event") == "watching_default_target"]
        # llama-server's default address of either build: 9931 from build 11521, 8080 before.
        assert default["level"] == "warning" and default["urls"] == ["http://127.0.0.1:9931", "http://127.0.0.1:8080"]
        assert "--config" in default["hint"] and "llama-server listens on 9931 from build 11521 and on 8080 before" in default["hint"]
        [warning] = [e for e in events if e.get("event") == "config_warning"]
        assert "SPECWATCH_POLL_INTERVALL" in warning["warning"] and "SPECWATCH_POLL_INTERVAL?" in warning["warning"]
        exporter.signal(signal.SIGHUP)
        wait_until("the warning again on reload", lambda: sum(e.get("event") == "config_warning" for e in exporter.events()) == 2, timeout=15, alive=exporter.process)
