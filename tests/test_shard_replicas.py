"""Two specwatch replicas watching the same servers, on real processes: one page per incident, not one per replica.

Real llama-servers (one plain, one speculating), two `specwatch run` replicas with the same config, a Prometheus
scraping both under the one `specwatch` job with the repository's rules unchanged, and an Alertmanager with
examples/alertmanager.yml whose webhooks land in a local receiver. Then one replica goes away (nothing pages; its
ticket is pending), then the other (SpecwatchFleetUnwatched is pending). Separately, the pair is rolled as an upgrade
does it: one replica stopped, started again and known again, then the other; the page stays the one notification.

Timings, with the short intervals below (poll 1s, canary 2s, scrape 1s, evaluation 1s, group_wait 1s,
group_interval 2s):
- the page reaches the webhook after the speculating server's first canary (all five endpoints are canaried within
  a canary interval or two), a scrape, an evaluation and group_wait: about 5s after every process is ready;
- a second page would follow the second replica's proof within a scrape, an evaluation and a group_interval (the
  group has changed), so once both replicas' proof is in Prometheus, QUIET seconds (several group_intervals and
  evaluations) without a delivery show there is none;
- a stopped replica's target is down at the next scrape, which also marks its series stale, and the next evaluation
  sees it: SpecwatchExporterDown turns pending then, and SpecwatchFleetUnwatched would turn pending at the same
  evaluation if it were going to. Their `for:` (5m each) is not waited out: pending is the evidence.
The waits for conditions have generous timeouts for a loaded machine; the counts asserted are exact.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.chain import (
    EXAMPLES,
    REPO,
    Delivery,
    WebhookReceiver,
    active_alerts,
    addresses,
    alert_rules,
    alert_samples_since,
    alertmanager_config,
    evaluated_since,
    http_ok,
    prometheus_api,
    prometheus_query,
    stay_quiet,
    write_yaml,
)
from tests.support.chain import alertmanager as chain_alertmanager
from tests.support.chain import prometheus as chain_prometheus
from tests.support.chain import prometheus_config as example_prometheus_config
from tests.support.process import Process
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]

POLL, CANARY, SCRAPE, EVALUATION, GROUP_WAIT, GROUP_INTERVAL = "1s", "2s", "1s", "1s", "1s", "2s"
# How long to watch for a delivery that must not come: three group_intervals, and more than that many evaluations.
QUIET = 6.0
INTERVAL = float(EVALUATION.removesuffix("s"))
JOB = "specwatch"
PAGE = "SpecwatchServingFillInLogprobs"
UNWATCHED = "SpecwatchFleetUnwatched"
EXPORTER_DOWN = "SpecwatchExporterDown"
LABELS = {"pool": "eval"}
# The checks docs/sharding.md recommends for a dashboard: servers no replica watches, and replicas per server.
UNWATCHED_SERVERS = ('max(specwatch_configured_servers{job="specwatch"})'
                     ' - count(count by (server) (specwatch_verdict{job="specwatch"}))')
WATCHERS = 'count by (server) (count by (server, instance) (specwatch_verdict{job="specwatch"}))'


def specwatch_config(servers: dict[str, str]) -> dict:
    """examples/specwatch.yml with the test's servers and short intervals; every replica reads this same file."""
    config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
    assert {"poll_interval", "canary_interval"} <= set(config)
    config["servers"] = [{"name": name, "url": url, "labels": LABELS} for name, url in servers.items()]
    config.update(poll_interval=POLL, poll_timeout="900ms", canary_interval=CANARY)
    return config


def prometheus_config(replicas: list[str], alertmanager: str) -> dict:
    """examples/prometheus.yml scraping every replica under its one specwatch job, with the test's intervals."""
    assert SCRAPE == EVALUATION
    config, jobs = example_prometheus_config(alertmanager, interval=SCRAPE)
    jobs[JOB]["static_configs"] = [{"targets": replicas}]
    return config


def replicas_reporting(prometheus: str, server: str, verdict: str) -> set[str]:
    """The replicas (instance) whose last scrape says `server` has `verdict`."""
    found = prometheus_query(prometheus, f'specwatch_verdict{{job="{JOB}",server="{server}",verdict="{verdict}"}} == 1')
    return {series["metric"]["instance"] for series in found}


def fleet_checks(prometheus: str) -> tuple[str, dict[str, str]]:
    """The docs' two checks: servers no replica watches, and how many replicas watch each server."""
    (unwatched,) = prometheus_query(prometheus, UNWATCHED_SERVERS)
    watchers = {series["metric"]["server"]: series["value"][1] for series in prometheus_query(prometheus, WATCHERS)}
    return unwatched["value"][1], watchers


def _seconds(duration: str) -> float:
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def test_the_sharding_guide_recommends_the_checks_proven_here() -> None:
    guide = (REPO / "docs" / "sharding.md").read_text(encoding="utf-8")
    assert UNWATCHED_SERVERS in guide
    assert WATCHERS in guide


@dataclass
class Pair:
    """Two replicas (a, b) watching a plain and a speculating llama-server, with Prometheus, Alertmanager, a webhook."""

    a: str
    b: str
    replicas: dict[str, Process]
    prometheus: str
    prometheus_process: Process
    alertmanager: Process
    receiver: WebhookReceiver
    began: float
    """Unix time every process was ready."""
    ready: float
    """Monotonic time of the same moment."""

    @property
    def processes(self) -> list[Process]:
        return [*self.replicas.values(), self.alertmanager, self.prometheus_process]

    def running(self) -> list[Process]:
        return [p for p in self.processes if p.exited() is None]


@contextlib.contextmanager
def ha_pair(tmp_path: Path) -> Iterator[Pair]:
    model = write_cycle_model(tmp_path / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, log_dir=tmp_path)
    draft = LlamaServer.of_kind("draft", model, log_dir=tmp_path)
    receiver = WebhookReceiver().start()
    a, b, prometheus_address, alertmanager_address = addresses(4, plain.port, draft.port)
    prometheus = f"http://{prometheus_address}"
    processes: list[Process] = []
    try:
        plain.start()
        draft.start()
        config = write_yaml(tmp_path / "specwatch.yml", specwatch_config({"plain": plain.url, "draft": draft.url}))
        replicas = {address: Process(f"specwatch-{name}", [
            sys.executable, "-m", "specwatch", "run", "--config", config, "--listen", address,
        ], tmp_path) for name, address in (("a", a), ("b", b))}
        alertmanager = chain_alertmanager(tmp_path, write_yaml(tmp_path / "alertmanager.yml", alertmanager_config(
            receiver.url, group_wait=GROUP_WAIT, group_interval=GROUP_INTERVAL)), alertmanager_address)
        prometheus_process = chain_prometheus(
            tmp_path, write_yaml(tmp_path / "prometheus.yml", prometheus_config([a, b], alertmanager_address)), prometheus_address)
        processes = [*replicas.values(), alertmanager, prometheus_process]
        for process in processes:
            process.start()
        wait_until("both replicas, Alertmanager and Prometheus to be ready", lambda: all(http_ok(url) for url in (
            f"http://{a}/-/ready", f"http://{b}/-/ready", f"http://{alertmanager_address}/-/ready",
            f"{prometheus}/-/ready")), timeout=30, processes=processes)
        yield Pair(a, b, replicas, prometheus, prometheus_process, alertmanager, receiver, time.time(), time.monotonic())
    finally:
        for process in reversed(processes):
            process.stop()
        draft.stop()
        plain.stop()
        receiver.stop()


def test_two_replicas_page_once_and_losing_one_pages_nothing(tmp_path: Path) -> None:
    started = time.monotonic()
    with ha_pair(tmp_path) as pair:
        a, b, replicas, prometheus, receiver = pair.a, pair.b, pair.replicas, pair.prometheus, pair.receiver
        alertmanager, prometheus_process, processes = pair.alertmanager, pair.prometheus_process, pair.processes
        test_began, ready = pair.began, pair.ready

        # Prometheus runs the repository's alerts as they are: same names, for: and labels.
        loaded = {rule["name"]: (rule["duration"], rule["labels"]) for group in prometheus_api(prometheus, "/api/v1/rules")[
            "groups"] for rule in group["rules"] if rule["type"] == "alerting"}
        assert loaded == {rule["alert"]: (_seconds(rule.get("for", "0s")), rule["labels"]) for rule in alert_rules()}

        # 1. One page, listing the speculating server once, although both replicas prove it.
        first: Delivery = wait_until("the fill-in page", lambda: next(iter(receiver.deliveries), None), timeout=45,
                                     processes=processes)
        paged = first.at - ready
        wait_until("both replicas' proof of fill-ins, and both replicas' clean verdict on the plain server, in "
                   "Prometheus", lambda: replicas_reporting(prometheus, "draft", "fill_ins") == {a, b}
                   and replicas_reporting(prometheus, "plain", "clean") == {a, b}, timeout=30, processes=processes)
        both_proved = time.time()
        wait_until("a few evaluations after both proofs", evaluated_since(prometheus, both_proved, 3, INTERVAL), timeout=30,
                   processes=processes)
        stay_quiet(receiver, QUIET, deliveries=1)

        assert first.path == "/specwatch-page"
        assert first.body["receiver"] == "specwatch-page"
        assert first.body["status"] == "firing"
        assert first.body["groupLabels"] == {"alertname": PAGE, "job": JOB, "server": "draft"}
        # One alert without instance: the rule merges the two replicas' series, so the server is listed once.
        assert [(x["status"], x["labels"]) for x in first.body["alerts"]] == [
            ("firing", {"alertname": PAGE, "severity": "critical", "job": JOB, "server": "draft", **LABELS})]
        assert len(active_alerts(prometheus, PAGE)) == 1
        assert active_alerts(prometheus, UNWATCHED) == []
        assert fleet_checks(prometheus) == ("0", {"plain": "2", "draft": "2"})

        # 2. One replica goes away; the other still watches both servers. Nothing pages, its ticket is pending.
        replicas[a].stop()
        stopped_one = time.time()
        down = wait_until(f"{EXPORTER_DOWN} pending for the stopped replica",
                          lambda: active_alerts(prometheus, EXPORTER_DOWN), timeout=30,
                          processes=[replicas[b], alertmanager, prometheus_process])
        assert [(x["labels"]["instance"], x["labels"]["severity"], x["state"]) for x in down] == [
            (a, "warning", "pending")]
        wait_until("a few evaluations after the replica's series went stale", evaluated_since(
            prometheus, time.time(), 3, INTERVAL), timeout=30, processes=[replicas[b], prometheus_process])
        assert alert_samples_since(prometheus, f'alertname="{UNWATCHED}"', stopped_one) == []
        assert active_alerts(prometheus, UNWATCHED) == []
        assert [(x["state"], x["labels"]["server"]) for x in active_alerts(prometheus, PAGE)] == [("firing", "draft")]
        assert replicas_reporting(prometheus, "draft", "fill_ins") == {b}
        assert fleet_checks(prometheus) == ("0", {"plain": "1", "draft": "1"})
        stay_quiet(receiver, QUIET, deliveries=1)

        # 3. Both replicas gone: nothing watches the fleet, and the alert that pages for it is pending.
        replicas[b].stop()
        unwatched = wait_until(f"{UNWATCHED} pending", lambda: active_alerts(prometheus, UNWATCHED), timeout=30,
                               processes=[alertmanager, prometheus_process])
        assert [(x["labels"], x["state"]) for x in unwatched] == [
            ({"alertname": UNWATCHED, "severity": "critical"}, "pending")]
        wait_until(f"{EXPORTER_DOWN} pending for both replicas", lambda: len(active_alerts(
            prometheus, EXPORTER_DOWN)) == 2, timeout=30, processes=[alertmanager, prometheus_process])
        assert sorted(x["labels"]["instance"] for x in active_alerts(prometheus, EXPORTER_DOWN)) == sorted([a, b])
        # keep_firing_for holds the page through the gap: no resolved notification either.
        assert [(x["state"], x["labels"]["server"]) for x in active_alerts(prometheus, PAGE)] == [("firing", "draft")]

        # The whole run: one notification, the page; the plain server never fired or notified.
        assert [(d.path, len(d.body["alerts"])) for d in receiver.deliveries] == [("/specwatch-page", 1)]
        assert alert_samples_since(prometheus, 'server="plain",alertstate="firing"', test_began) == []
        listed = [(x["labels"]["alertname"], x["labels"]["server"]) for d in receiver.deliveries for x in d.body["alerts"]]
        print(f"\ntwo replicas: {len(receiver.deliveries)} notification(s) {listed} at the webhook, the page "
              f"{paged:.1f}s after every process was ready; {time.monotonic() - started:.0f}s in all")


def _page_started(prometheus: str) -> list[tuple[str, str, str]]:
    """The page's alerts in Prometheus as (server, state, activeAt): a resolve and re-fire would give a new activeAt."""
    return [(x["labels"]["server"], x["state"], x["activeAt"]) for x in active_alerts(prometheus, PAGE)]


def test_rolling_the_replicas_one_at_a_time_pages_nothing_new(tmp_path: Path) -> None:
    """The HA pair rolled as an upgrade does it: a stopped, started again, known again; then b the same way."""
    started = time.monotonic()
    with ha_pair(tmp_path) as pair:
        prometheus, receiver = pair.prometheus, pair.receiver
        wait_until("the fill-in page", lambda: next(iter(receiver.deliveries), None), timeout=45, processes=pair.processes)

        def both_know() -> bool:
            return (replicas_reporting(prometheus, "draft", "fill_ins") == {pair.a, pair.b}
                    and replicas_reporting(prometheus, "plain", "clean") == {pair.a, pair.b})

        wait_until("both replicas' verdicts in Prometheus", both_know, timeout=30, processes=pair.processes)
        known = time.time()
        page = _page_started(prometheus)
        assert [(server, state) for server, state, _ in page] == [("draft", "firing")]
        roll_began = time.time()

        rolled: list[str] = []
        for address in (pair.a, pair.b):
            replica = pair.replicas[address]
            replica.stop()
            stopped = time.monotonic()
            wait_until(f"Prometheus to see {address} down", lambda address=address: prometheus_query(
                prometheus, f'up{{job="{JOB}",instance="{address}"}} == 0'), timeout=30, processes=pair.running())
            # A few evaluations without the replica: its series are stale, as in a real roll.
            wait_until("a few evaluations without it", evaluated_since(prometheus, time.time(), 3, INTERVAL), timeout=30,
                       processes=pair.running())
            replica.start()
            back = time.monotonic()
            wait_until(f"{address} to know both verdicts again, in Prometheus", both_know, timeout=30,
                       processes=pair.processes)
            rolled.append(f"{address} away {back - stopped:.1f}s, known again in Prometheus {time.monotonic() - back:.1f}s "
                          "after its start")
            assert _page_started(prometheus) == page, "the page resolved or restarted while a replica was away"

        wait_until("a few evaluations after the roll", evaluated_since(prometheus, time.time(), 3, INTERVAL), timeout=30,
                   processes=pair.processes)
        stay_quiet(receiver, QUIET, deliveries=1)

        # One notification for the incident, the page, before the roll; no resolved one, no second page.
        assert receiver.sequence(pair.ready)[0][1:] == ("/specwatch-page", "firing", [(PAGE, "draft", "firing")])
        assert len(receiver.deliveries) == 1
        assert _page_started(prometheus) == page
        # The plain server raised nothing, not even a pending ticket: the twin's clean verdict covered each gap. (Before
        # either exporter's first canary of it, both rightly say unchecked: on a loaded machine a rule evaluation falls
        # there, and its pending ticket is the start's, not the roll's. The window begins once both know it.)
        assert alert_samples_since(prometheus, 'server="plain"', known) == []
        # (Prometheus' own start, before its first scrape of either replica, is outside this window.)
        assert alert_samples_since(prometheus, f'alertname="{UNWATCHED}"', roll_began) == []
        # Each replica's ExporterDown went pending while it was away, and nothing but the page fired.
        assert {x["metric"]["instance"] for x in alert_samples_since(
            prometheus, f'alertname="{EXPORTER_DOWN}",alertstate="pending"', roll_began)} == {pair.a, pair.b}
        assert [x["metric"]["alertname"] for x in alert_samples_since(prometheus, 'alertstate="firing"', pair.began)] == [PAGE]
        print(f"\nrolled HA pair: {'; '.join(rolled)}; webhook: {receiver.sequence(pair.ready)}; "
              f"{time.monotonic() - started:.0f}s in all")
