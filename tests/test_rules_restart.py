"""specwatch killed with SIGKILL mid-incident and started again, on the real alerting chain: one page, no timer reset.

Real llama-servers (one plain, one speculating), a server whose /completion fails (its canaries on three endpoints
fail: SpecwatchCanaryFailing and SpecwatchVerdictUnchecked go pending) and an address where nothing listens
(SpecwatchServerDown pending); the speculating server's /props contradicts its /slots (SpecwatchSpeculationContradiction
pending). All watched by one `specwatch run` at the DEFAULT intervals (poll 15s, canary 60s:
examples/specwatch.yml as it is, but for the servers), because how soon a restarted exporter knows every verdict
again is the point. Prometheus scrapes and evaluates every second with the repository's rules; Alertmanager runs
examples/alertmanager.yml with group_wait 1s and group_interval 2s, so a resolved or second notification would come
within seconds. Then the exporter is SIGKILLed, stays away for a few evaluations (its series go stale) and is
started again on the same address.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.chain import (
    EXAMPLES,
    WebhookReceiver,
    active_alerts,
    addresses,
    alert_samples_since,
    alertmanager_config,
    evaluated_since,
    http_ok,
    prometheus_query,
    stay_quiet,
    write_yaml,
)
from tests.support.chain import alertmanager as chain_alertmanager
from tests.support.chain import prometheus as chain_prometheus
from tests.support.chain import prometheus_config as example_prometheus_config
from tests.support.faults import Status
from tests.support.loopback import FaultServer
from tests.support.metrics import Samples, find, scrape
from tests.support.process import Process
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

pytestmark = [pytest.mark.real, pytest.mark.slow]

SCRAPE, GROUP_WAIT, GROUP_INTERVAL = "1s", "1s", "2s"
INTERVAL = 1.0
# Three group_intervals and more evaluations: a resolved or second notification would arrive within it.
QUIET = 6.0
PAGE = "SpecwatchServingFillInLogprobs"
VERDICTS = ("clean", "fill_ins", "unproven", "unchecked")
EXPECTED = {"plain": "clean", "draft": "fill_ins", "broken": "unchecked", "down": "unchecked"}
# Generous for a loaded 2-core machine; bench/exporter_restart.py measures it (about 2s on real servers).
KNOWN_WITHIN = 30.0


def specwatch_config(servers: dict[str, str]) -> dict:
    """examples/specwatch.yml with the test's servers; its intervals are the defaults and stay."""
    config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
    assert (config["poll_interval"], config["canary_interval"]) == ("15s", "60s")
    config["servers"] = [{"name": name, "url": url} for name, url in servers.items()]
    return config


def verdicts(samples: Samples) -> dict[str, str | None]:
    found = {}
    for server in EXPECTED:
        on = [v for v in VERDICTS if find(samples, "specwatch_verdict", server=server, verdict=v) == 1]
        found[server] = on[0] if len(on) == 1 else None
    return found


def exporter_verdicts(address: str) -> dict[str, str | None] | None:
    try:
        return verdicts(scrape(f"http://{address}/metrics"))
    except Exception:  # noqa: BLE001 - not listening yet
        return None


def prometheus_verdicts(prometheus: str) -> dict[str, str]:
    return {x["metric"]["server"]: x["metric"]["verdict"]
            for x in prometheus_query(prometheus, 'specwatch_verdict{job="specwatch"} == 1')}


def active(prometheus: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, str]]:
    """Prometheus' active alerts as {(alertname, labels): (state, activeAt)}; a reset `for:` gives a new activeAt."""
    return {(x["labels"]["alertname"], tuple(sorted(x["labels"].items()))): (x["state"], x["activeAt"])
            for x in active_alerts(prometheus)}


def test_an_exporter_killed_mid_incident_pages_once_and_keeps_every_timer(tmp_path: Path) -> None:
    model = write_cycle_model(tmp_path / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, log_dir=tmp_path)
    draft = LlamaServer.of_kind("draft", model, log_dir=tmp_path)
    broken = FaultServer(FakeLlama.plain()).play(Status(500), "/completion").start()
    receiver = WebhookReceiver().start()
    exporter, prometheus_address, alertmanager_address, nobody = addresses(4, plain.port, draft.port, broken.port)
    prometheus = f"http://{prometheus_address}"
    processes: list[Process] = []
    began = time.monotonic()
    try:
        plain.start()
        draft.start()
        config = write_yaml(tmp_path / "specwatch.yml", specwatch_config({
            "plain": plain.url, "draft": draft.url, "broken": broken.url, "down": f"http://{nobody}"}))
        specwatch = Process("specwatch", [sys.executable, "-m", "specwatch", "run", "--config", config, "--listen",
                                          exporter], tmp_path)
        alertmanager = chain_alertmanager(tmp_path, write_yaml(tmp_path / "alertmanager.yml", alertmanager_config(
            receiver.url, group_wait=GROUP_WAIT, group_interval=GROUP_INTERVAL)), alertmanager_address)
        prometheus_config, jobs = example_prometheus_config(alertmanager_address, interval=SCRAPE)
        jobs["specwatch"]["static_configs"] = [{"targets": [exporter]}]
        jobs["llama-server"]["http_sd_configs"] = [{"url": f"http://{exporter}/sd", "refresh_interval": SCRAPE}]
        prometheus_process = chain_prometheus(tmp_path, write_yaml(tmp_path / "prometheus.yml", prometheus_config),
                                              prometheus_address)
        processes = [specwatch, alertmanager, prometheus_process]
        for process in processes:
            process.start()
        wait_until("specwatch, Alertmanager and Prometheus to be ready", lambda: all(http_ok(url) for url in (
            f"http://{exporter}/-/ready", f"http://{alertmanager_address}/-/ready", f"{prometheus}/-/ready")),
            timeout=30, processes=processes)
        ready, ready_at = time.time(), time.monotonic()

        # The incident: the speculating server pages; the tickets of the broken and the down server are pending.
        wait_until("the fill-in page", lambda: receiver.deliveries, timeout=45, processes=processes)
        wait_until("every verdict in Prometheus", lambda: prometheus_verdicts(prometheus) == EXPECTED, timeout=30,
                   processes=processes)
        pending = {("SpecwatchServerDown", "down"), ("SpecwatchVerdictUnchecked", "down"),
                   ("SpecwatchVerdictUnchecked", "broken"), ("SpecwatchCanaryFailing", "broken"),
                   ("SpecwatchSpeculationContradiction", "draft")}
        wait_until("the broken and the down server's tickets pending", lambda: pending <= {
            (name, dict(labels)["server"]) for name, labels in active(prometheus)}, timeout=30, processes=processes)
        wait_until("a few evaluations more", evaluated_since(prometheus, time.time(), 3, INTERVAL), timeout=30,
                   processes=processes)
        before = active(prometheus)
        assert {(name, dict(labels)["server"], state) for (name, labels), (state, _) in before.items()} == {
            (PAGE, "draft", "firing"), ("SpecwatchServerDown", "down", "pending"),
            ("SpecwatchVerdictUnchecked", "down", "pending"), ("SpecwatchVerdictUnchecked", "broken", "pending"),
            ("SpecwatchCanaryFailing", "broken", "pending"), ("SpecwatchSpeculationContradiction", "draft", "pending")}, before

        # SIGKILL: no shutdown code runs. Prometheus sees the target down and its series stale for a few evaluations.
        specwatch.kill()
        killed_at, killed = time.monotonic(), time.time()
        wait_until("Prometheus to see the exporter down", lambda: prometheus_query(
            prometheus, f'up{{job="specwatch",instance="{exporter}"}} == 0'), timeout=30, processes=processes[1:])
        wait_until("a few evaluations without it", evaluated_since(prometheus, time.time(), 3, INTERVAL), timeout=30,
                   processes=processes[1:])
        assert prometheus_query(prometheus, 'specwatch_verdict{job="specwatch"}') == [], "the series did not go stale"

        specwatch.start()
        restarted = time.monotonic()
        wait_until("the restarted exporter to be ready", lambda: http_ok(f"http://{exporter}/-/ready"), timeout=30,
                   interval=0.05, processes=processes)
        ready_after = time.monotonic() - restarted
        wait_until("every verdict as before at the restarted exporter", lambda: exporter_verdicts(exporter) == EXPECTED,
                   timeout=KNOWN_WITHIN, interval=0.1, processes=processes)
        known_after = time.monotonic() - restarted
        wait_until("every verdict as before in Prometheus", lambda: prometheus_verdicts(prometheus) == EXPECTED,
                   timeout=30, processes=processes)
        in_prometheus = time.monotonic() - restarted
        wait_until("a few evaluations after", evaluated_since(prometheus, time.time(), 3, INTERVAL), timeout=30,
                   processes=processes)
        stay_quiet(receiver, QUIET, deliveries=1)

        # One notification for the incident: the page, before the kill. No resolved one, no second page.
        sequence = receiver.sequence(ready_at)
        assert [(path, status, alerts) for _, path, status, alerts in sequence] == [
            ("/specwatch-page", "firing", [(PAGE, "draft", "firing")])]
        # Every alert active before the kill is still active, in the same state and since the same moment: the page
        # never resolved and no ticket's `for:` started again. Nothing else is active.
        assert active(prometheus) == before
        # The gap itself turned only the exporter-level guards pending, and nothing but the page ever fired.
        during = {x["metric"]["alertname"] for x in alert_samples_since(prometheus, 'alertstate="pending"', killed)}
        assert during - {name for name, _ in before} <= {"SpecwatchExporterDown", "SpecwatchFleetUnwatched",
                                                          "SpecwatchVerdictUnchecked"}, during
        assert [x["metric"]["alertname"] for x in alert_samples_since(prometheus, 'alertstate="firing"', ready)] == [PAGE]
        # The plain server, clean before, is clean after, paged nobody and filed nothing, even while `unchecked`.
        assert alert_samples_since(prometheus, 'server="plain",alertstate="firing"', ready) == []
        plain_pending = sorted({x["metric"]["alertname"] for x in alert_samples_since(prometheus, 'server="plain"', ready)})
        assert known_after < KNOWN_WITHIN
        print(f"\nexporter SIGKILLed {restarted - killed_at:.1f}s; restarted: /-/ready {ready_after:.1f}s, every verdict "
              f"as before {known_after:.1f}s at the exporter, {in_prometheus:.1f}s in Prometheus (poll 15s, canary 60s); "
              f"pending for the plain server meanwhile: {plain_pending or 'nothing'}; webhook: {sequence}; "
              f"{time.monotonic() - began:.0f}s in all")
    finally:
        for process in reversed(processes):
            process.stop()
        draft.stop()
        plain.stop()
        broken.stop()
        receiver.stop()
