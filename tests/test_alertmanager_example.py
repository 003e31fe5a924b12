"""examples/alertmanager.yml on the real chain: a second server going bad while a page is open pages again, at once;
a fleet that flips at once pages once, and a server going bad alone still pages.

Real llama-servers: a plain one, a speculating one, and a second speculating one started only once the first page
has reached the webhook. One `specwatch run` (poll 1s, canary 2s), one Prometheus (scrape and evaluation 1s, the
repository's rules) sending to two Alertmanagers: one with examples/alertmanager.yml as it is (one page per server),
one with the alternative its page route offers in a comment chosen (one page per alert and job). Both with group_wait
1s and group_interval 20s, a stand-in for the example's 1m: long enough to tell "paged group_wait after the alert
fired" from "added to the open page at the group's next group_interval".

The fleet: 25 look-alike servers of one build in one pool; 20 restart onto a build that speculates by default within
5s, then one of the others goes bad alone. Alertmanager runs the example as it is but for the fleet route's group_wait,
scaled like the canaries (1m in the example, one default canary interval; 15s for 2s canaries).
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
    Delivery,
    WebhookReceiver,
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
from tests.support.loopback import FaultServer
from tests.support.process import Process
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

pytestmark = [pytest.mark.real, pytest.mark.slow]

POLL, CANARY, SCRAPE, GROUP_WAIT, GROUP_INTERVAL = "1s", "2s", "1s", "1s", "20s"
PAGE = "SpecwatchServingFillInLogprobs"
# The second server's page may come this long after Prometheus fires its alert: group_wait, an evaluation, slack.
PROMPTLY = 5.0


def _seconds(duration: str) -> float:
    return float(duration.removesuffix("s"))


def _servers(delivery: Delivery) -> list[tuple[str, str]]:
    return [(x["labels"]["server"], x["status"]) for x in delivery.body["alerts"]]


def test_a_second_bad_server_gets_its_own_page_while_the_first_is_open(tmp_path: Path) -> None:
    model = write_cycle_model(tmp_path / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, log_dir=tmp_path)
    first = LlamaServer.of_kind("draft", model, log_dir=tmp_path)
    second = LlamaServer.of_kind("draft", model, log_dir=tmp_path)  # not started yet: its polls fail until it is
    chosen, alternative = WebhookReceiver().start(), WebhookReceiver().start()
    exporter, prometheus_address, chosen_address, alternative_address = addresses(4, plain.port, first.port, second.port)
    prometheus = f"http://{prometheus_address}"
    processes: list[Process] = []
    began = time.monotonic()
    try:
        plain.start()
        first.start()
        config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
        config["servers"] = [{"name": n, "url": s.url} for n, s in (("plain", plain), ("first", first), ("second", second))]
        config.update(poll_interval=POLL, poll_timeout="900ms", canary_interval=CANARY)
        specwatch = Process("specwatch", [sys.executable, "-m", "specwatch", "run", "--config",
                                          write_yaml(tmp_path / "specwatch.yml", config), "--listen", exporter], tmp_path)
        managers = []
        for name, receiver, address, alt in (("chosen", chosen, chosen_address, False),
                                              ("alternative", alternative, alternative_address, True)):
            work = tmp_path / name
            work.mkdir()
            managers.append(chain_alertmanager(work, write_yaml(work / "alertmanager.yml", alertmanager_config(
                receiver.url, alternative=alt, group_wait=GROUP_WAIT, group_interval=GROUP_INTERVAL)), address))
        prometheus_config, jobs = example_prometheus_config(chosen_address, interval=SCRAPE)
        (manager,) = prometheus_config["alerting"]["alertmanagers"]
        manager["static_configs"] = [{"targets": [chosen_address, alternative_address]}]  # both get every alert
        jobs["specwatch"]["static_configs"] = [{"targets": [exporter]}]
        jobs["llama-server"]["http_sd_configs"] = [{"url": f"http://{exporter}/sd", "refresh_interval": SCRAPE}]
        prometheus_process = chain_prometheus(tmp_path, write_yaml(tmp_path / "prometheus.yml", prometheus_config),
                                              prometheus_address)
        processes = [specwatch, *managers, prometheus_process]
        for process in processes:
            process.start()
        wait_until("specwatch, both Alertmanagers and Prometheus to be ready", lambda: all(http_ok(url) for url in (
            f"http://{exporter}/-/ready", f"http://{chosen_address}/-/ready", f"http://{alternative_address}/-/ready",
            f"{prometheus}/-/ready")), timeout=30, processes=processes)

        wait_until("the first server's page at both webhooks", lambda: chosen.deliveries and alternative.deliveries,
                   timeout=45, processes=processes)
        second.start()
        started = time.monotonic()
        wait_until("the second server's alert firing in Prometheus", lambda: prometheus_query(
            prometheus, f'ALERTS{{alertname="{PAGE}",server="second",alertstate="firing"}}'), timeout=30,
            interval=0.1, processes=processes)
        fired = time.monotonic()
        wait_until("two notifications at each webhook", lambda: len(chosen.deliveries) == 2 and len(
            alternative.deliveries) == 2, timeout=_seconds(GROUP_INTERVAL) + 15, processes=processes)
        stay_quiet(chosen, 5, deliveries=2)
        stay_quiet(alternative, 0, deliveries=2)

        seen = {name: receiver.sequence(started) for name, receiver in (("chosen", chosen), ("alternative", alternative))}
        # The example as it is: one page per server, each its own group (what a pager merges by); the second one comes
        # group_wait after its alert fired, although the first server's page is still open.
        c1, c2 = chosen.deliveries
        assert [(_servers(d), d.body["groupLabels"].get("server")) for d in (c1, c2)] == [
            ([("first", "firing")], "first"), ([("second", "firing")], "second")]
        assert c1.body["groupKey"] != c2.body["groupKey"]
        assert c2.at - fired < PROMPTLY, seen
        assert c2.at - c1.at < _seconds(GROUP_INTERVAL), "the second page waited for the first page's group_interval"
        # The alternative: the second server is only added to the open page, at the group's next group_interval, under
        # the same group key, so a pager that merges by group (PagerDuty's dedup_key) never pages again for it.
        a1, a2 = alternative.deliveries
        assert [_servers(d) for d in (a1, a2)] == [[("first", "firing")], [("first", "firing"), ("second", "firing")]]
        assert a1.body["groupKey"] == a2.body["groupKey"]
        assert a2.at - a1.at >= _seconds(GROUP_INTERVAL) - 1, seen
        # Nothing about the plain server at either.
        assert all(server != "plain" for d in (c1, c2, a1, a2) for server, _ in _servers(d))
        print(f"\nsecond server healthy at 0s, its alert firing in Prometheus at {fired - started:.1f}s; "
              f"example (per server): {seen['chosen']}; alternative (per alert and job): {seen['alternative']}; "
              f"{time.monotonic() - began:.0f}s in all")
    finally:
        for process in reversed(processes):
            process.stop()
        second.stop()
        first.stop()
        plain.stop()
        chosen.stop()
        alternative.stop()


FLEET_PAGE = "SpecwatchFleetServingFillInLogprobs"
OLD_BUILD, NEW_BUILD = "b11434-release", "b11500-ngram-mod-default"
FLIPPING, PEERS = 20, 4
# The fleet route's group_wait (1m in the example, one default canary interval) scaled to this test's 2s canaries.
FLEET_GROUP_WAIT = "15s"


def _lookalike(name: str, build: str, *, drafting: bool) -> FakeLlama:
    """A server as a restart leaves it: `build`, speculating (every token after the first a fill-in) or not."""
    kind = FakeLlama.draft if drafting else FakeLlama.plain
    path = f"/models/{name}.gguf"
    return kind(tokens=None, build_info=build, model_alias=path, model_path=path, n_ctx=4096,
                media_marker=f"<__media_{name}_{build}_{drafting}__>")


def _page_servers(delivery: Delivery) -> list[str]:
    return sorted(a["labels"]["server"] for a in delivery.body["alerts"])


def test_a_fleet_that_flips_at_once_pages_once_and_a_lone_server_still_pages(tmp_path: Path) -> None:
    names = [f"flip-{i:02d}" for i in range(FLIPPING)] + [f"peer-{i}" for i in range(PEERS)] + ["lone"]
    servers = {name: FaultServer(_lookalike(name, OLD_BUILD, drafting=False)).start() for name in names}
    receiver = WebhookReceiver().start()
    exporter, prometheus_address, manager_address = addresses(3, *(s.port for s in servers.values()))
    prometheus = f"http://{prometheus_address}"
    processes: list[Process] = []
    try:
        config = yaml.safe_load((EXAMPLES / "specwatch.yml").read_text())
        config["servers"] = [{"name": n, "url": s.url, "labels": {"pool": "eval"}} for n, s in servers.items()]
        config.update(poll_interval=POLL, poll_timeout="900ms", canary_interval=CANARY)
        specwatch = Process("specwatch", [sys.executable, "-m", "specwatch", "run", "--config",
                                          write_yaml(tmp_path / "specwatch.yml", config), "--listen", exporter], tmp_path)
        # The example as it is, but for the fleet route's group_wait, scaled like the canaries.
        manager_config = alertmanager_config(receiver.url)
        (fleet_route,) = [r for r in manager_config["route"]["routes"] if r["matchers"] == [f'alertname = "{FLEET_PAGE}"']]
        assert fleet_route["group_wait"] == "1m"
        fleet_route["group_wait"] = FLEET_GROUP_WAIT
        manager = chain_alertmanager(tmp_path, write_yaml(tmp_path / "alertmanager.yml", manager_config), manager_address)
        prometheus_config, jobs = example_prometheus_config(manager_address, interval=SCRAPE)
        jobs["specwatch"]["static_configs"] = [{"targets": [exporter]}]
        del jobs["llama-server"]  # the look-alikes' own /metrics are not what this test is about
        prometheus_process = chain_prometheus(tmp_path, write_yaml(tmp_path / "prometheus.yml", prometheus_config),
                                              prometheus_address)
        processes = [specwatch, manager, prometheus_process]
        for process in processes:
            process.start()
        wait_until("specwatch, Alertmanager and Prometheus to be ready", lambda: all(http_ok(url) for url in (
            f"http://{exporter}/-/ready", f"http://{manager_address}/-/ready", f"{prometheus}/-/ready")), timeout=30,
            processes=processes)
        wait_until("every server clean in Prometheus", lambda: prometheus_query(
            prometheus, f'count(specwatch_verdict{{verdict="clean"}} == 1) == {len(names)}'), timeout=90, interval=0.5,
            processes=processes)
        assert receiver.deliveries == []

        # The upgrade: every flipping server restarts on a build that speculates by default, one every 0.25s.
        started = time.monotonic()
        for name in names[:FLIPPING]:
            servers[name].fake = _lookalike(name, NEW_BUILD, drafting=True)
            time.sleep(0.25)
        flipped = time.monotonic() - started
        wait_until("every flipped server's own page firing in Prometheus (and inhibited)", lambda: len(prometheus_query(
            prometheus, f'ALERTS{{alertname="{PAGE}", alertstate="firing"}}')) == FLIPPING, timeout=30, interval=0.2,
            processes=processes)
        fleet = wait_until("the fleet page", lambda: receiver.deliveries, timeout=_seconds(FLEET_GROUP_WAIT) + 30,
                           processes=processes)[0]
        paged = fleet.at - started
        # Longer than the per-server page's group_wait (10s): a page that escaped inhibition would have come by now.
        stay_quiet(receiver, 12, deliveries=1)
        assert fleet.path == "/specwatch-page"
        assert fleet.body["groupLabels"] == {"alertname": FLEET_PAGE, "job": "specwatch", "pool": "eval", "build": NEW_BUILD}
        assert _page_servers(fleet) == names[:FLIPPING], "the fleet page must name every server of the flip, once"
        assert {a["status"] for a in fleet.body["alerts"]} == {"firing"}
        assert fleet.body["commonAnnotations"]["summary"] == (
            f"llama-servers of build {NEW_BUILD} serve fill-in logprobs all at once (job specwatch, pool eval)")
        counts = sorted({int(a["annotations"]["description"].split(" servers of build")[0].rsplit(" ", 1)[1])
                         for a in fleet.body["alerts"]})
        assert counts and counts[0] >= 5 and counts[-1] <= FLIPPING, counts

        # One server of the old build goes bad on its own: its own page, as before the fleet page existed.
        servers["lone"].fake = _lookalike("lone", OLD_BUILD, drafting=True)
        alone = time.monotonic()
        wait_until("the lone server's own page", lambda: len(receiver.deliveries) == 2, timeout=45, processes=processes)
        lone = receiver.deliveries[1]
        assert lone.path == "/specwatch-page"
        assert lone.body["groupLabels"] == {"alertname": PAGE, "job": "specwatch", "server": "lone"}
        assert _page_servers(lone) == ["lone"]
        stay_quiet(receiver, 5, deliveries=2)
        print(f"\n{FLIPPING} servers flipped within {flipped:.1f}s; one notification at {paged:.1f}s naming "
              f"{len(fleet.body['alerts'])} servers of build {NEW_BUILD} (counts in descriptions {counts}); "
              f"the lone server paged {lone.at - alone:.1f}s after it flipped; {len(receiver.deliveries)} notifications")
    finally:
        for process in reversed(processes):
            process.stop()
        for server in servers.values():
            server.stop()
        receiver.stop()
