"""llama-server's own counters through specwatch's /sd: a real Prometheus scrapes real servers and records the drafted share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.chain import EXAMPLES, RULES, http_ok, prometheus_query
from tests.support.chain import prometheus as chain_prometheus
from tests.support.net import free_port
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real


def _write(path: Path, data: dict) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("llama-metrics")
    model = write_cycle_model(work / "cycle.gguf")
    plain = LlamaServer.of_kind("plain", model, ["--metrics"], log_dir=work).start()
    draft = LlamaServer.of_kind("draft", model, ["--metrics"], log_dir=work).start()
    config = _write(work / "specwatch.yml", {
        "servers": [{"name": "plain", "url": plain.url}, {"name": "draft", "url": draft.url}],
        "poll_interval": "1s", "canary_interval": "1s",
    })
    # specwatch picks its own port (no race for a free one); Prometheus is told where it landed.
    specwatch = ExporterProcess("--config", config).wait_started()
    exporter, server = f"127.0.0.1:{specwatch.port}", f"127.0.0.1:{free_port()}"
    # The example Prometheus config as a user gets it, with the test's addresses and 1s intervals.
    prometheus_config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    prometheus_config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    prometheus_config["rule_files"] = [str(RULES)]
    prometheus_config.pop("alerting")
    jobs = {job["job_name"]: job for job in prometheus_config["scrape_configs"]}
    jobs["specwatch"].update(scrape_interval="1s", static_configs=[{"targets": [exporter]}])
    jobs["llama-server"].update(scrape_interval="1s", http_sd_configs=[{"url": f"http://{exporter}/sd", "refresh_interval": "1s"}])
    prometheus = chain_prometheus(work, Path(_write(work / "prometheus.yml", prometheus_config)), server)
    try:
        prometheus.start()
        wait_until("Prometheus", lambda: http_ok(f"http://{server}/-/ready"), timeout=30, processes=[prometheus])
        yield f"http://{server}"
    finally:
        prometheus.stop()
        specwatch.stop()
        plain.stop()
        draft.stop()


def _values(prometheus: str, query: str) -> dict[str, float]:
    return {item["metric"].get("server", ""): float(item["value"][1]) for item in prometheus_query(prometheus, query)}


def test_the_llama_server_job_scrapes_every_server_through_sd(prometheus: str) -> None:
    wait_until("both llama-servers scraped", lambda: _values(prometheus, 'up{job="llama-server"}') == {"plain": 1, "draft": 1},
               timeout=40)
    tokens = _values(prometheus, '{__name__="llamacpp:tokens_predicted_total", job="llama-server"}')
    assert set(tokens) == {"plain", "draft"}


def test_the_recording_rules_show_the_drafted_share_per_server(prometheus: str) -> None:
    query = "server_model:llamacpp_drafted_tokens:ratio_rate5m"

    def shares() -> dict[str, float] | None:
        found = _values(prometheus, query)
        return found if set(found) == {"plain", "draft"} and found["draft"] > 0 else None

    found = wait_until("the drafted share of both servers", shares, timeout=60)
    # The canaries' own tokens: the draft-model server drafts most of them, the plain one none.
    assert found["plain"] == 0
    assert 0.3 < found["draft"] <= 1
    rate = _values(prometheus, "server_model:llamacpp_drafted_tokens:rate5m")
    assert rate["draft"] > 0 and rate["plain"] == 0
