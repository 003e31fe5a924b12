"""The whole alerting chain on real processes: llama-servers, specwatch, Prometheus, Alertmanager, a webhook."""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from specwatch.demo.llamaserver import LlamaRouter, LlamaServer, router_preset
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.endpoints import Endpoint
from tests.support.chain import (
    EXAMPLES,
    Delivery,
    WebhookReceiver,
    alert_rules,
    alertmanager_config,
    dashboard_queries,
    http_ok,
    prometheus_query,
    substitute,
    write_yaml,
)
from tests.support.chain import alertmanager as chain_alertmanager
from tests.support.chain import prometheus as chain_prometheus
from tests.support.chain import prometheus_config as example_prometheus_config
from tests.support.faults import Status
from tests.support.loopback import FaultServer
from tests.support.net import free_port
from tests.support.process import Process
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

pytestmark = pytest.mark.real

# Short intervals so the chain completes in seconds; the rules themselves are loaded unchanged.
POLL, CANARY, SCRAPE, EVALUATION, GROUP_WAIT = "1s", "2s", "1s", "1s", "1s"
PAGE = "SpecwatchServingFillInLogprobs"


def specwatch_config(servers: dict[str, str]) -> dict:
    config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
    (labels,) = {json.dumps(s.get("labels", {}), sort_keys=True) for s in config["servers"][:1]}
    config["servers"] = [{"name": name, "url": url, "labels": json.loads(labels)} for name, url in servers.items()]
    assert {"poll_interval", "canary_interval"} <= set(config)
    config.update(poll_interval=POLL, poll_timeout="900ms", canary_interval=CANARY)
    return config


def prometheus_config(exporter: str, alertmanager: str) -> dict:
    """examples/prometheus.yml with the test's addresses and intervals; everything else as a user gets it."""
    assert SCRAPE == EVALUATION
    config, jobs = example_prometheus_config(alertmanager, interval=SCRAPE)
    jobs["specwatch"].update(static_configs=[{"targets": [exporter]}])
    # llama-server's own /metrics, through the exporter's /sd, as the example sets it up.
    jobs["llama-server"].update(http_sd_configs=[{"url": f"http://{exporter}/sd", "refresh_interval": SCRAPE}])
    return config


@dataclass
class Chain:
    prometheus: str
    exporter: str
    receiver: WebhookReceiver
    page: Delivery
    page_alert: dict
    latency: float


def _page(receiver: WebhookReceiver) -> tuple[Delivery, dict] | None:
    for delivery, alert in receiver.alerts():
        if alert["labels"].get("alertname") == PAGE and alert["labels"].get("server") == "draft" and alert["status"] == "firing":
            return delivery, alert
    return None


def _has_series(prometheus: str, expr: str) -> bool:
    return bool(prometheus_query(prometheus, expr))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    work = tmp_path_factory.mktemp("chain")
    model = write_cycle_model(work / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, ["--metrics"], log_dir=work)
    draft = LlamaServer.of_kind("draft", model, ["--metrics"], log_dir=work)
    # A router with one loaded model and one never loaded: the router panels and the model variable have data.
    router = LlamaRouter(router_preset(work / "preset.ini", {
        "small": ["--model", str(model), "--metrics"], "cold": ["--model", str(model)],
    }), log_dir=work)
    # A server whose /completion fails: the canary failure panels have something to show.
    broken = FaultServer(FakeLlama.plain(tokens=None)).play(Status(500), "/completion").start()
    receiver = WebhookReceiver().start()
    ports = {name: free_port() for name in ("specwatch", "prometheus", "alertmanager")}
    exporter, prometheus_address, alertmanager_address = (f"127.0.0.1:{ports[n]}" for n in ports)
    prometheus = f"http://{prometheus_address}"

    config = write_yaml(work / "specwatch.yml", specwatch_config({
        "plain": plain.url, "draft": draft.url, "broken": broken.url, "router": router.url}))
    specwatch = Process("specwatch", [sys.executable, "-m", "specwatch", "run", "--config", config, "--listen", exporter,
                                      "--log-level", "debug"], work)
    alertmanager = chain_alertmanager(work, write_yaml(work / "alertmanager.yml", alertmanager_config(receiver.url, group_wait=GROUP_WAIT)),
                                      alertmanager_address)
    prometheus_process = chain_prometheus(work, write_yaml(work / "prometheus.yml", prometheus_config(exporter, alertmanager_address)),
                                          prometheus_address)
    processes = [specwatch, alertmanager, prometheus_process]
    try:
        plain.start()
        router.start()
        router.load("small")
        for process in processes:
            process.start()
        wait_until("specwatch, Alertmanager and Prometheus to be ready", lambda: all(
            http_ok(url) for url in (f"http://{exporter}/-/ready", f"http://{alertmanager_address}/-/ready",
                                     f"{prometheus}/-/ready")), timeout=30, processes=processes)
        # The plain server has been canaried and scraped, and the still-absent speculating server has failed
        # its polls, before the speculating server starts: the clock below measures only the fill-in path.
        wait_until("the plain server's verdict and the missing server's failures in Prometheus", lambda: _has_series(
            prometheus, 'specwatch_serving_placeholders{server="plain"}') and _has_series(
            prometheus, 'specwatch_poll_failures_total{server="draft"}'), timeout=30, processes=processes)

        started = time.monotonic()
        draft.start()
        healthy = time.monotonic() - started
        delivery, alert = wait_until("the fill-in page", lambda: _page(receiver), timeout=45, processes=processes)
        latency = delivery.at - started
        print(f"\nspeculating llama-server start -> page at the webhook: {latency:.1f}s "
              f"(server healthy after {healthy:.1f}s; poll {POLL}, canary {CANARY}, scrape {SCRAPE}, "
              f"evaluation {EVALUATION}, rule for: 0s, group_wait {GROUP_WAIT})")
        yield Chain(prometheus, exporter, receiver, delivery, alert, latency)
    finally:
        for process in reversed(processes):
            process.stop()
        draft.stop()
        plain.stop()
        router.stop()
        broken.stop()
        receiver.stop()


def test_prometheus_runs_the_repository_rules_unchanged(chain: Chain) -> None:
    with urllib.request.urlopen(f"{chain.prometheus}/api/v1/rules", timeout=10) as response:
        groups = json.loads(response.read())["data"]["groups"]
    loaded = {rule["name"]: rule for group in groups for rule in group["rules"] if rule["type"] == "alerting"}
    for rule in alert_rules():
        assert rule["alert"] in loaded
        assert loaded[rule["alert"]]["duration"] == _seconds(rule.get("for", "0s"))
        assert loaded[rule["alert"]]["annotations"] == rule["annotations"]


def _seconds(duration: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(duration[:-1]) * units[duration[-1]]


def test_the_speculating_server_pages_with_its_labels_and_annotations(chain: Chain) -> None:
    assert chain.page.path == "/specwatch-page", "critical alerts must reach the paging receiver"
    assert chain.page.body["receiver"] == "specwatch-page"
    rule = next(rule for rule in alert_rules() if rule["alert"] == PAGE)
    labels = chain.page_alert["labels"]
    # No instance label: the rule merges the replicas that watch the same server, so a server pages once.
    assert labels == {"alertname": PAGE, "severity": "critical", "job": "specwatch", "server": "draft", "pool": "eval"}
    annotations = chain.page_alert["annotations"]
    assert annotations["summary"] == "llama-server draft serves fill-in logprobs"
    assert annotations["description"].startswith("specwatch's canary on draft got fill-in")
    assert "restart it without speculative decoding" in annotations["description"]
    # However far its first round had come when it paged, every endpoint is named: serving fill-ins or not yet canaried.
    named = re.findall(r"(?:Endpoints serving them|count them as serving fill-ins too): ([a-z0-9_, ]+)\.",
                       annotations["description"])
    assert sorted(e for group in named for e in group.split(", ")) == sorted(e.value for e in Endpoint), annotations
    assert annotations["runbook_url"] == rule["annotations"]["runbook_url"]
    assert chain.latency < 45


def test_the_plain_server_causes_no_alert(chain: Chain) -> None:
    about_plain = [alert for _, alert in chain.receiver.alerts() if alert["labels"].get("server") == "plain"]
    assert about_plain == []
    assert prometheus_query(chain.prometheus, 'ALERTS{server="plain"}') == []
    (verdict,) = prometheus_query(chain.prometheus, 'specwatch_serving_placeholders{server="plain"}')
    assert verdict["value"][1] == "0"


def test_every_dashboard_query_returns_data(chain: Chain) -> None:
    queries = dashboard_queries()
    assert len(queries) > 30
    empty: list[str] = []

    def all_answer() -> bool:
        empty[:] = [str(q) for q in queries if not prometheus_query(chain.prometheus, substitute(q.expr))]
        return not empty

    try:
        wait_until("every dashboard query to return data", all_answer, timeout=15, interval=1.0)
    except AssertionError:
        raise AssertionError("dashboard queries without data:\n" + "\n".join(empty)) from None
