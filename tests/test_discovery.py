"""Discovery in (file_sd, http_sd) and out (/sd): targets from files and endpoints, refreshed live; bad ones keep the old."""

from __future__ import annotations

import json
import signal
import ssl
from pathlib import Path

import httpx
import pytest
import structlog
import yaml

from specwatch.daemon.discovery import Discovery, servers_from_groups, targets_out
from specwatch.problems import ConfigError
from specwatch.settings.loading import load_settings
from specwatch.settings.schema import Settings
from specwatch.settings.targets import FileSDConfig
from tests.support.certs import make_certs, server_tls
from tests.support.fakes import fake_fleet
from tests.support.faults import Redirect, Respond
from tests.support.loopback import FaultServer
from tests.support.metrics import scrape, value
from tests.support.net import refused_url
from tests.support.process import ExporterProcess
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama, FakeRouter

SOURCE = FileSDConfig(files=["unused"])
BAD_GROUPS = [
    ({"targets": ["a:1"]}, "must be a list of target groups: [{targets: [HOST:PORT, ...], labels: {...}}]"),
    ([["a:1"]], "[0]: not a mapping with targets and labels"),
    ([{"targets": "a:1"}], "[0].targets: must be a list of HOST:PORT strings"),
    ([{"targets": ["a:1"], "labels": {"pool": 3}}], "[0].labels: must map label names to string values"),
    ([{"targets": ["a:1"], "lables": {}}], "[0].lables: unknown key (did you mean labels?)"),
    ([{"targets": ["a:1"]}, {"targets": ["b:1"], "weight": 3}], "[1].weight: unknown key (allowed: targets, labels)"),
    ([{"labels": {"pool": "a"}}], "[0].targets: must be a list of HOST:PORT strings"),
    ([{"targets": ["a:1", "b:1"], "labels": {"server": "x"}}], "[0].labels.server: names one target, and this group has 2"),
    ([{"targets": ["a:1"], "labels": {"endpoint": "x"}}],
     "[0] target 'a:1': labels: label name(s) ['endpoint'] are reserved by specwatch"),
    ([{"targets": ["a:1"]}, {"targets": ["a:1"]}], "[1] target 'a:1': the name 'a:1' is already used in this source"),
    ([{"targets": ["a:99999"]}], "[0] target 'a:99999': url: 'http://a': Port out of range 0-65535"),
    ([{"targets": ["not a target"]}], "[0].targets: a target is HOST:PORT, with no spaces"),
    ([{"targets": ["http://a:1"]}],
     "[0].targets: 'http':// in a target: a target is HOST:PORT, as in Prometheus; set the source's scheme: https for TLS"),
    ([{"targets": ["a$b:1"]}], "[0] target 'a$b:1': url: 'http://a$b': 'a$b' is not a host name or address"),
    # A host alone: Prometheus would scrape port 80; specwatch never assumes it (llama-server listens on 9931 or 8080).
    ([{"targets": ["a:1", "llama-b"]}],
     "[0] target 'llama-b': url: 'http://llama-b' gives no port: llama-server listens on 9931 from build 11521 and on "
     "8080 before; give the port, e.g. 'http://llama-b:9931' (an explicit ':80' for a front end on port 80)"),
]


@pytest.mark.parametrize(("data", "problem"), BAD_GROUPS, ids=[p for _, p in BAD_GROUPS])
def test_each_bad_target_list_gives_its_exact_error(data: object, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        servers_from_groups(data, SOURCE, "file 't.json'")
    assert caught.value.problems == [problem]


def test_a_key_file_gone_since_the_config_was_loaded_is_named_once(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-discovered")
    source = FileSDConfig(files=["unused"], api_key_file=key)
    key.unlink()
    with pytest.raises(ConfigError) as caught:
        servers_from_groups([{"targets": ["a:1"]}], source, "file 't.json'")
    assert caught.value.problems == [f"[0] target 'a:1': api_key_file {str(key)!r} cannot be read: No such file or directory"]


def test_targets_become_servers_named_by_label_or_address() -> None:
    source = FileSDConfig(files=["unused"], scheme="https", labels={"fleet": "eval"})
    servers = servers_from_groups([
        {"targets": ["10.0.0.5:8080", "10.0.0.6:8080"], "labels": {"pool": "a", "__meta_zone": "z1"}},
        {"targets": ["10.0.0.7:8080"], "labels": {"server": "big-one", "pool": "b"}},
    ], source, "here")
    assert [(s.name, s.url, s.labels) for s in servers] == [
        ("10.0.0.5:8080", "https://10.0.0.5:8080", {"fleet": "eval", "pool": "a"}),
        ("10.0.0.6:8080", "https://10.0.0.6:8080", {"fleet": "eval", "pool": "a"}),
        ("big-one", "https://10.0.0.7:8080", {"fleet": "eval", "pool": "b"}),
    ]


def test_a_meta_label_sets_the_peer_group_and_no_series_label() -> None:
    servers = servers_from_groups([
        {"targets": ["a:1"], "labels": {"pool": "a", "__specwatch_peer_group": "eval"}},
        {"targets": ["b:1"], "labels": {"__specwatch_peer_group": "none"}},
        {"targets": ["c:1"], "labels": {"__specwatch_peer_group": ""}},  # empty is unset, as in Prometheus
    ], SOURCE, "here")
    assert [(s.peer_group, s.labels) for s in servers] == [("eval", {"pool": "a"}), ("none", {}), (None, {})]


def test_a_config_with_discovery_alone_is_valid_and_has_no_default_target(tmp_path: Path) -> None:
    config = tmp_path / "specwatch.yml"
    config.write_text("file_sd_configs:\n  - files: [/etc/specwatch/targets/*.json]\n")
    settings = load_settings(config)
    assert (settings.servers, settings.default_target, settings.discovers) == ([], False, True)
    config.write_text("servers: []\nhttp_sd_configs:\n  - url: http://sd.internal/targets\n")
    assert load_settings(config).http_sd_configs[0].refresh_interval == 60.0


async def test_file_sd_adds_changes_removes_and_keeps_the_old_targets_of_a_broken_file(tmp_path: Path) -> None:
    changes = []
    discovery = Discovery(on_change=lambda: changes.append(1))
    discovery.configure(Settings(file_sd_configs=[{"files": [str(tmp_path / "*.json"), str(tmp_path / "*.yml")]}]))
    first, second = tmp_path / "a.json", tmp_path / "b.yml"
    first.write_text(json.dumps([{"targets": ["10.0.0.1:8080", "10.0.0.2:8080"]}]))
    second.write_text("- targets: ['10.0.0.3:8080']\n  labels: {server: three}\n")
    try:
        assert await discovery.refresh_all()
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:8080", "10.0.0.2:8080", "three"]
        (status,) = discovery.status()
        assert (status.source, status.targets, status.ok) == ("file_sd[0]", 3, True)

        assert not await discovery.refresh_all()  # nothing changed: nothing re-read

        first.write_text("")  # a write caught half-way: refused, the old targets stay
        assert not await discovery.refresh_all()
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:8080", "10.0.0.2:8080", "three"]
        assert discovery.status()[0].ok is False

        # A key given twice: refused as Prometheus refuses it, rather than the last one winning unseen.
        first.write_text('[{"targets": ["10.0.0.1:8080"], "targets": ["10.0.0.9:8080"]}]')
        with structlog.testing.capture_logs() as logged:
            assert not await discovery.refresh_all()
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:8080", "10.0.0.2:8080", "three"]
        assert any("key 'targets' given twice (first at line 1, column 3) at line 1, column 33" in str(e.get("error")) for e in logged), logged

        first.write_text(json.dumps([{"targets": ["10.0.0.1:8080"], "labels": {"pool": "eval"}}]))
        assert await discovery.refresh_all()
        assert [(s.name, s.labels) for s in discovery.servers()] == [("10.0.0.1:8080", {"pool": "eval"}), ("three", {})]
        assert discovery.status()[0].ok is True

        second.unlink()  # removing a file is meant: its targets go
        assert await discovery.refresh_all()
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:8080"]
        assert discovery.servers(taken=["10.0.0.1:8080"]) == []  # a static server of that name wins
    finally:
        await discovery.close()


async def test_a_file_sd_target_without_a_port_is_named_and_every_other_target_is_kept(tmp_path: Path) -> None:
    """A host alone refuses its file (as any bad target does), saying which target and why; that file keeps the targets
    it had, and the other files and sources theirs."""
    discovery = Discovery()
    discovery.configure(Settings(file_sd_configs=[{"files": [str(tmp_path / "*.json")]}, {"files": [str(tmp_path / "*.yml")]}]))
    first, second, third = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.yml"
    first.write_text(json.dumps([{"targets": ["10.0.0.1:9931"]}]))
    second.write_text(json.dumps([{"targets": ["10.0.0.2:8080"]}]))
    third.write_text("- targets: ['10.0.0.3:9931']\n")
    try:
        assert await discovery.refresh_all()
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:9931", "10.0.0.2:8080", "10.0.0.3:9931"]

        first.write_text(json.dumps([{"targets": ["10.0.0.1:9931", "10.0.0.4"]}]))
        with structlog.testing.capture_logs() as logged:
            assert not await discovery.refresh_all()
        [refused] = [e for e in logged if e["event"] == "discovery_refused"]
        assert (refused["file"], refused["kept_targets"]) == (str(first), 1)
        assert refused["error"] == (
            f"invalid file_sd[0] file {str(first)!r} (1 problem):\n  - [0] target '10.0.0.4': url: 'http://10.0.0.4' gives "
            "no port: llama-server listens on 9931 from build 11521 and on 8080 before; give the port, e.g. "
            "'http://10.0.0.4:9931' (an explicit ':80' for a front end on port 80)")
        assert [s.name for s in discovery.servers()] == ["10.0.0.1:9931", "10.0.0.2:8080", "10.0.0.3:9931"]
        assert [(s.source, s.targets, s.ok) for s in discovery.status()] == [("file_sd[0]", 2, False), ("file_sd[1]", 1, True)]

        first.write_text(json.dumps([{"targets": ["10.0.0.1:9931", "10.0.0.4:80"]}]))  # an explicit :80 is taken
        assert await discovery.refresh_all()
        assert [s.url for s in discovery.servers()] == [
            "http://10.0.0.1:9931", "http://10.0.0.4:80", "http://10.0.0.2:8080", "http://10.0.0.3:9931"]
        assert all(s.ok for s in discovery.status())
    finally:
        await discovery.close()


def test_an_https_source_takes_a_host_alone_as_443() -> None:
    source = FileSDConfig(files=["unused"], scheme="https")
    servers = servers_from_groups([{"targets": ["llama.internal", "10.0.0.5:9931"]}], source, "here")
    assert [(s.name, s.url) for s in servers] == [("llama.internal", "https://llama.internal"), ("10.0.0.5:9931", "https://10.0.0.5:9931")]


async def test_http_sd_serves_targets_and_a_bad_answer_keeps_them() -> None:
    answers = [json.dumps([{"targets": ["10.0.1.1:8080"], "labels": {"pool": "sd"}}]).encode(), b"<html>oops</html>"]
    with FaultServer().play(Respond(lambda _: (200, {}, answers[0])), "/targets") as sd:
        discovery = Discovery()
        discovery.configure(Settings(http_sd_configs=[{"url": f"{sd.url}/targets?token=sekrit"}]))
        try:
            assert await discovery.refresh_all()
            assert [(s.name, s.url, s.labels) for s in discovery.servers()] == [
                ("10.0.1.1:8080", "http://10.0.1.1:8080", {"pool": "sd"})]
            answers.reverse()
            assert not await discovery.refresh_all()
            assert [s.name for s in discovery.servers()] == ["10.0.1.1:8080"]
            (status,) = discovery.status()
            assert (status.source, status.targets, status.ok) == ("http_sd[0]", 1, False)
        finally:
            await discovery.close()
        assert sd.count("/targets") == 2


async def test_http_sd_follows_no_redirect_and_no_proxy_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The probes' client policy: a redirect could send the next fetch (and its token) elsewhere, and a proxy set for
    # other programs is not one specwatch was told to use.
    monkeypatch.setenv("HTTP_PROXY", refused_url())
    monkeypatch.setenv("ALL_PROXY", refused_url())
    targets = json.dumps([{"targets": ["10.0.1.1:8080"]}]).encode()
    with FaultServer().play(Redirect("/elsewhere"), "/targets").play(Respond(lambda _: (200, {}, targets)), "/elsewhere") as sd:
        discovery = Discovery()
        discovery.configure(Settings(http_sd_configs=[{"url": f"{sd.url}/targets"}]))
        with structlog.testing.capture_logs() as logged:
            try:
                assert not await discovery.refresh_all()
            finally:
                await discovery.close()
        assert sd.count("/targets") == 1 and sd.count("/elsewhere") == 0
    assert [e["error"] for e in logged if e["event"] == "discovery_refused"] == [
        "invalid http_sd[0] (1 problem):\n  - HTTP 302"]


def test_http_sd_config_refuses_credentials_in_its_url(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("http_sd_configs:\n  - url: 'http://user:pass@sd.internal/targets'\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    assert caught.value.problems == ["http_sd_configs[0].url: credentials in the URL are not allowed"]
    assert "pass" not in str(caught.value)


async def test_sd_out_lists_servers_and_loaded_router_models_and_filters_by_verdict(make_watcher, tmp_path: Path) -> None:
    router = FakeRouter(models={"hot": FakeLlama.draft(), "cold": FakeLlama.plain()}, status={"hot": "loaded"})
    watcher = make_watcher({}, servers=[
        {"name": "plain", "url": "http://plain:8080", "labels": {"pool": "eval"}},
        {"name": "router", "url": "https://router:9443"},
        {"name": "proxied", "url": "http://gateway:80/llama"},  # behind a path prefix; never polled here
    ], canary_endpoints=["completion"])
    certs = make_certs(tmp_path, names=("router",))
    fleet = fake_fleet({"plain": FakeLlama.plain()})
    fleet.add("router", router, tls=server_tls(certs))
    watcher.fetcher.client = fleet.client(verify=ssl.create_default_context(cafile=str(certs.ca)))
    for name in ("plain", "router"):
        await watcher.poll(name)
    await watcher.canary("plain")
    await watcher.canary("router", "hot")
    states = watcher.fleet.snapshot()
    assert targets_out(states) == [
        {"targets": ["plain:8080"], "labels": {"server": "plain", "pool": "eval"}},
        {"targets": ["router:9443"], "labels": {
            "server": "router", "__scheme__": "https", "model": "hot", "__param_model": "hot", "__param_autoload": "false"}},
        {"targets": ["gateway:80"], "labels": {"server": "proxied", "__metrics_path__": "/llama/metrics"}},
    ]
    assert [g["labels"]["server"] for g in targets_out(states, "clean")] == ["plain"]
    await watcher.fetcher.client.aclose()
    assert [g["labels"]["model"] for g in targets_out(states, "fill_ins")] == ["hot"]
    assert targets_out(states, "unproven") == []


@pytest.fixture
def fleet():
    with FaultServer(FakeLlama.plain(tokens=None)) as a, FaultServer(FakeLlama.draft(tokens=None)) as b:
        yield {"a": a, "b": b}


@pytest.mark.real
def test_a_running_exporter_follows_its_target_files_and_serves_sd(tmp_path: Path, fleet) -> None:
    targets = tmp_path / "targets"
    targets.mkdir()
    config = tmp_path / "specwatch.yml"
    config.write_text(yaml.safe_dump({
        "file_sd_configs": [{"files": [str(targets / "*.json")], "refresh_interval": "1s"}],
        "poll_interval": "1s", "canary_interval": "2s", "canary_endpoints": ["completion"],
    }))
    address = lambda server: server.url.removeprefix("http://")  # noqa: E731
    (targets / "a.json").write_text(json.dumps([{"targets": [address(fleet["a"])], "labels": {"server": "a"}}]))
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        metrics = f"{exporter.url()}/metrics"
        wait_until("a clean", lambda: value(scrape(metrics), "specwatch_verdict", server="a", verdict="clean") == 1, timeout=20, alive=exporter.process)

        (targets / "b.json").write_text(json.dumps([{"targets": [address(fleet["b"])], "labels": {"server": "b"}}]))
        wait_until("b added and caught", lambda: value(scrape(metrics), "specwatch_verdict", server="b", verdict="fill_ins") == 1, timeout=20, alive=exporter.process)
        samples = scrape(metrics)
        assert value(samples, "specwatch_configured_servers") == 2
        assert value(samples, "specwatch_discovery_targets", source="file_sd[0]") == 2

        (targets / "b.json").write_text("[{not json")
        wait_until("the broken file refused", lambda: value(scrape(metrics), "specwatch_discovery_refresh_successful", source="file_sd[0]") == 0, timeout=20, alive=exporter.process)
        # The log line may reach the test's reader a moment after the metric a scrape shows (cold run 5, at load 11).
        refused = wait_until("the refusal logged", lambda: [e for e in exporter.events() if e.get("event") == "discovery_refused"],
                             timeout=10, alive=exporter.process)
        assert "b.json" in refused[-1]["file"] and "not valid JSON or YAML" in refused[-1]["error"]
        assert value(scrape(metrics), "specwatch_verdict", server="b", verdict="fill_ins") == 1  # still watched

        sd = httpx.get(f"{exporter.url()}/sd", timeout=10).json()
        assert sorted(g["labels"]["server"] for g in sd) == ["a", "b"]
        clean = httpx.get(f"{exporter.url()}/sd?verdict=clean", timeout=10).json()
        assert [g["labels"]["server"] for g in clean] == ["a"] and clean[0]["targets"] == [address(fleet["a"])]
        wrong = httpx.get(f"{exporter.url()}/sd?verdict=great", timeout=10)
        assert wrong.status_code == 400 and "clean, fill_ins, unproven, unchecked" in wrong.text

        (targets / "b.json").unlink()
        wait_until("b removed", lambda: value(scrape(metrics), "specwatch_configured_servers") == 1, timeout=20, alive=exporter.process)
        assert value(scrape(metrics), "specwatch_verdict", server="b", verdict="fill_ins") is None

        # A reload keeps what discovery found.
        exporter.signal(signal.SIGHUP)
        wait_until("the reload", lambda: any(e.get("event") == "reloaded" for e in exporter.events()), timeout=10, alive=exporter.process)
        assert value(scrape(metrics), "specwatch_verdict", server="a", verdict="clean") == 1


@pytest.mark.real
def test_check_config_reads_the_discovery_sources_once(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps([{"targets": ["10.0.0.9:8080", "10.0.0.10:8080"]}]))
    config = tmp_path / "specwatch.yml"
    config.write_text(yaml.safe_dump({"file_sd_configs": [{"files": [str(tmp_path / "*.json")]}]}))
    with ExporterProcess("--config", str(config), "--check-config") as checked:
        assert checked.process.wait(30) == 0
    out = "".join(checked.stdout)
    assert "config OK: 2 server(s) to watch" in out and "file_sd[0]: 2 target(s), read" in out
    assert "10.0.0.9:8080: http://10.0.0.9:8080 (no api key)" in out
