"""The fill-in page on the real chain names every endpoint: those serving fill-ins and those not yet canaried.

A server canaried clean restarts with n-gram speculation. specwatch canaries its endpoints one after another, chat
last, and on a large model each canary takes seconds: here its chat endpoints answer 8 seconds late. The page fires on
the first endpoints' proof and is not sent again when chat turns out to serve fill-ins too, so the page on-call
receives must name chat and chat_stream already, as not yet canaried. One `specwatch run`, one Prometheus with the
repository's rules, one Alertmanager with examples/alertmanager.yml, a webhook.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from specwatch.endpoints import Endpoint
from tests.support.chain import (
    EXAMPLES,
    Delivery,
    WebhookReceiver,
    active_alerts,
    addresses,
    alertmanager_config,
    http_ok,
    prometheus_query,
    stay_quiet,
    write_yaml,
)
from tests.support.chain import alertmanager as chain_alertmanager
from tests.support.chain import prometheus as chain_prometheus
from tests.support.chain import prometheus_config as example_prometheus_config
from tests.support.faults import Late
from tests.support.loopback import FaultServer
from tests.support.process import Process
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

pytestmark = [pytest.mark.real, pytest.mark.slow]

# A canary_interval long enough for the slow chat canaries' timeout (capped by it); the change gets its round at once.
POLL, CANARY, SCRAPE, GROUP_WAIT = "1s", "20s", "1s", "1s"
CHAT_LATE = 8.0
PAGE = "SpecwatchServingFillInLogprobs"
SERVING = re.compile(r"Endpoints serving them: ([a-z0-9_, ]+)\.")
PENDING = re.compile(r"Not yet canaried since the server started or changed, so count them as serving fill-ins too: "
                     r"([a-z0-9_, ]+)\.")


def _named(description: str, pattern: re.Pattern[str]) -> set[str]:
    match = pattern.search(description)
    return set(match.group(1).split(", ")) if match else set()


def _pages(receiver: WebhookReceiver) -> list[tuple[Delivery, dict]]:
    return [(d, a) for d, a in receiver.alerts() if a["labels"].get("alertname") == PAGE and a["status"] == "firing"]


def test_a_page_sent_before_the_round_ends_names_the_endpoints_not_yet_canaried(tmp_path: Path) -> None:
    every = {endpoint.value for endpoint in Endpoint}
    assert len(every) == 7
    server = FaultServer(FakeLlama.plain()).start()
    receiver = WebhookReceiver().start()
    exporter, prometheus_address, manager_address = addresses(3, server.port)
    prometheus = f"http://{prometheus_address}"
    processes: list[Process] = []
    try:
        config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
        config["servers"] = [{"name": "ngram", "url": server.url}]
        config.update(poll_interval=POLL, poll_timeout="900ms", canary_interval=CANARY)
        assert "canary_endpoints" not in config, "every endpoint is canaried by default"
        specwatch = Process("specwatch", [sys.executable, "-m", "specwatch", "run", "--config",
                                          write_yaml(tmp_path / "specwatch.yml", config), "--listen", exporter], tmp_path)
        manager = chain_alertmanager(tmp_path, write_yaml(tmp_path / "alertmanager.yml", alertmanager_config(
            receiver.url, group_wait=GROUP_WAIT)), manager_address)
        prometheus_config, jobs = example_prometheus_config(manager_address, interval=SCRAPE)
        jobs["specwatch"]["static_configs"] = [{"targets": [exporter]}]
        jobs["llama-server"]["http_sd_configs"] = [{"url": f"http://{exporter}/sd", "refresh_interval": SCRAPE}]
        processes = [specwatch, manager, chain_prometheus(tmp_path, write_yaml(tmp_path / "prometheus.yml",
                                                                                prometheus_config), prometheus_address)]
        for process in processes:
            process.start()
        wait_until("specwatch, Alertmanager and Prometheus to be ready", lambda: all(http_ok(url) for url in (
            f"http://{exporter}/-/ready", f"http://{manager_address}/-/ready", f"{prometheus}/-/ready")),
            timeout=30, processes=processes)
        # Clean on every endpoint first: what the restart must not let the page read as "these are fine".
        wait_until("every endpoint canaried clean, in Prometheus", lambda: len(prometheus_query(
            prometheus, 'specwatch_canary_checked{server="ngram"} == 1 and on (endpoint) '
            'specwatch_canary_placeholder_tokens{server="ngram"} == 0')) == 7, timeout=30, processes=processes)

        # The restart: speculation on (per /slots), a new process (another media marker), chat slow to answer.
        server.play(Late(CHAT_LATE), "/v1/chat/completions")
        server.fake = FakeLlama.draft(media_marker="<__media_restartedWithNgramModXXXXXXXXXXXXXXXX__>")
        restarted = time.monotonic()
        delivery, page = wait_until("the fill-in page", lambda: next(iter(_pages(receiver)), None), timeout=30,
                                    processes=processes)
        latency = delivery.at - restarted
        serving, pending = (_named(page["annotations"]["description"], p) for p in (SERVING, PENDING))
        # Sent before the round ended (chat answers late; on a busy machine other canaries may still be running too),
        # the page names what is not yet canaried as such: no endpoint left out.
        assert pending, page["annotations"]["description"]
        if latency < CHAT_LATE:
            assert {"chat", "chat_stream"} <= pending, page["annotations"]["description"]
        assert serving | pending == every and not serving & pending, page["annotations"]["description"]

        # The round ends: the alert now names all seven as serving and none pending, but no second page is sent.
        def fully_named() -> bool:
            (alert,) = [a for a in active_alerts(prometheus, PAGE) if a["labels"]["server"] == "ngram"]
            described = alert["annotations"]["description"]
            return _named(described, SERVING) == every and not _named(described, PENDING)

        wait_until("the round to end and the alert to name all seven", fully_named, timeout=2 * CHAT_LATE + 15,
                   interval=0.5, processes=processes)
        round_ended = time.monotonic() - restarted
        stay_quiet(receiver, 3, deliveries=1)
        print(f"\nrestart -> page at the webhook: {latency:.1f}s, naming {len(serving)} serving and {sorted(pending)} "
              f"not yet canaried; every endpoint named serving in Prometheus after {round_ended:.1f}s; one notification")
    finally:
        for process in reversed(processes):
            process.stop()
        server.stop()
        receiver.stop()
