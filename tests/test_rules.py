"""The alert and recording rules: their generator, promtool's checks and unit tests, annotations, runbooks, metric names."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alerts.generate import DEPLOYMENT, FIELD, FINGERPRINT, ConfigError, Recorded, RulesConfig
from specwatch.daemon.discovery import SourceStatus
from specwatch.daemon.exposition.registry import SpecwatchCollector
from specwatch.daemon.exposition.samples import ExporterStatus
from tests.support import markdown
from tests.support.chain import (
    ALERTS,
    EXAMPLES,
    RULES,
    RUNBOOK_BASE,
    RUNBOOKS,
    alert_rules,
    dashboard_queries,
    metric_names,
    recording_rules,
    rule_files,
    rule_groups,
    runbook_anchors,
)
from tests.support.fakes import peer_round
from tests.support.process import HANG
from tests.support.wire import FakeLlama, FakeRouter

# Series Prometheus makes itself, not the exporter: the scrape health and the alert state.
PROMETHEUS_SERIES = frozenset({"up", "ALERTS"})
ANNOTATIONS = ("summary", "description", "runbook_url")
# Series about an exporter rather than a watched server: their alerts name the exporter, not a server.
EXPORTER_LEVEL = frozenset({"up", "specwatch_config_last_reload_successful", "specwatch_build_info", "specwatch_servers",
                            "specwatch_configured_servers", "specwatch_discovery_refresh_successful"})
# Alerts about the whole fleet of a job, or a peer group in it: they aggregate servers away and name the job.
FLEET_LEVEL = frozenset({"SpecwatchFleetUnwatched", "SpecwatchNoServers", "SpecwatchReplicasDisagree"})


# A team's own config: another scrape job, replicas told apart by a `replica` label, runbooks on its own wiki.
TEAM_URL = "https://runbooks.example.org/specwatch.html"
TEAM = ("--job-selector", 'job="llm-watch"', "--aggregate-away", "instance,replica", "--runbook-base-url", TEAM_URL)
WITHOUT = re.compile(r"without \(([^)]*)\)")


def promtool(*args: str, cwd: Path = ALERTS) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=HANG, cwd=cwd)


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ALERTS / "generate.py"), *args], capture_output=True, text=True, timeout=HANG)


# --- the generator ---------------------------------------------------------------------------------------------------


@pytest.mark.real
def test_the_committed_rules_are_what_the_generator_writes(tmp_path: Path) -> None:
    out = tmp_path / "specwatch.rules.yml"
    result = generate("--out", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == RULES.read_bytes(), "alerts/specwatch.rules.yml is not the generator's: run python alerts/generate.py"
    assert generate("--check").returncode == 0


@pytest.mark.real
def test_the_check_notices_a_hand_edit(tmp_path: Path) -> None:
    edited = tmp_path / "specwatch.rules.yml"
    edited.write_text(RULES.read_text().replace("for: 15m", "for: 20m", 1))
    result = generate("--check", "--out", str(edited))
    assert result.returncode == 1
    assert "out of date" in result.stderr and "python alerts/generate.py" in result.stderr


def test_every_per_server_rule_drops_the_replica_labels_and_only_those() -> None:
    clauses = [set(map(str.strip, labels.split(","))) for rule in alert_rules() + recording_rules()
               for labels in WITHOUT.findall(rule["expr"])]
    assert len(clauses) >= 14
    # Besides the replicas' labels, a rule may drop what it folds: the verdict state, the endpoint, a counter's outcome,
    # or the fingerprint (its content fields one by one, and how the file was deployed).
    folded = {"verdict", "endpoint", "outcome", FIELD, *FINGERPRINT, *DEPLOYMENT}
    assert all(clause - folded == {"instance", "pod"} for clause in clauses), clauses


def test_the_recording_rules_the_dashboards_read_are_the_ones_defined() -> None:
    names = {value for key, value in vars(Recorded).items() if not key.startswith("_")}
    assert names == {rule["record"] for rule in recording_rules()}


@pytest.fixture(scope="module")
def team_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("team") / "specwatch.rules.yml"
    result = generate(*TEAM, "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out


def test_a_teams_config_changes_the_job_labels_and_runbooks_and_nothing_else(team_rules: Path) -> None:
    text = team_rules.read_text()
    for default in ('job="specwatch"', RUNBOOK_BASE.rstrip("#")):
        assert default not in text, f"the default {default} leaked into a team's rules"
    assert not re.search(r"\bpod\b", text), "the default label pod leaked into a team's rules"
    for alert in alert_rules(team_rules):
        assert alert["annotations"]["runbook_url"] == f"{TEAM_URL}#{alert['alert'].lower()}"
    assert 'absent(up{job="llm-watch"} == 1)' in text and 'up{job="llm-watch"} == 0' in text
    # Put the defaults back where the config went: what is left is the committed rules, value for value.
    back = text.replace('job="llm-watch"', 'job="specwatch"').replace(TEAM_URL, RUNBOOK_BASE.rstrip("#"))
    back = WITHOUT.sub(lambda match: match.group().replace("replica", "pod"), back)
    assert yaml.safe_load(back)["groups"] == rule_groups()


def relabelled_unit_tests() -> str:
    """The promtool unit tests with the team's job name, replica label and runbooks, as its own series would carry them."""
    text = (ALERTS / "specwatch.rules.test.yml").read_text()
    for old, new in (('job="specwatch"', 'job="llm-watch"'), ("job: specwatch", "job: llm-watch"),
                     ("job specwatch", "job llm-watch"), ("server of specwatch or", "server of llm-watch or"),
                     ("specwatch (specwatch)", "specwatch (llm-watch)"), ('pod="', 'replica="'),
                     (RUNBOOK_BASE.rstrip("#"), TEAM_URL)):
        assert old in text, f"the unit tests no longer hold {old!r}: update relabelled_unit_tests"
        text = text.replace(old, new)
    return text


@pytest.mark.real
def test_a_teams_rules_pass_promtool_and_the_unit_tests_relabelled(team_rules: Path, tmp_path: Path) -> None:
    (tmp_path / "specwatch.rules.yml").write_text(team_rules.read_text())
    (tmp_path / "specwatch.rules.test.yml").write_text(relabelled_unit_tests())
    checked = promtool("check", "rules", "specwatch.rules.yml", cwd=tmp_path)
    assert checked.returncode == 0 and "WARNING" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "specwatch.rules.test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # The default rules fail those tests: the two replicas page twice, and the team's exporters are never seen down.
    (tmp_path / "specwatch.rules.yml").write_text(RULES.read_text())
    failed = promtool("test", "rules", "specwatch.rules.test.yml", cwd=tmp_path)
    assert failed.returncode != 0
    assert "SpecwatchExporterDown" in failed.stdout + failed.stderr and "replica=" in failed.stdout + failed.stderr


@pytest.mark.real
def test_a_bad_config_is_refused_with_every_problem_and_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "rules.yml"
    result = generate("--job-selector", '{job="x"}', "--aggregate-away", "instance,server", "--runbook-base-url",
                      "https://wiki.example/r#top", "--out", str(out))
    assert result.returncode == 2 and not out.exists()
    for problem in ("without the braces", "'server': the rules group and match by it", "leave out the #fragment"):
        assert problem in result.stderr, result.stderr


@pytest.mark.parametrize(("config", "problem"), [
    ({"job_selector": 'job="specwatch", namespace=~"mon.*"'}, None),
    ({"job_selector": 'job!~"a|b",'}, None),
    ({"job_selector": 'job="a\\"b"'}, None),
    ({"job_selector": ""}, "--job-selector '': give label matchers"),
    ({"job_selector": "job=specwatch"}, "each value in double quotes"),
    ({"job_selector": 'job="specwatch"\n'}, "give label matchers"),
    ({"job_selector": 'job="specwatch"} or vector(1'}, "give label matchers"),
    ({"aggregate_away": ("instance",)}, None),
    ({"aggregate_away": ()}, "name at least the label replicas differ in"),
    ({"aggregate_away": ("instance", "model")}, "'model': the rules group and match by it"),
    ({"aggregate_away": ("instance", "pod-name")}, "'pod-name': not a label name"),
    ({"aggregate_away": ("instance", "__address__")}, "'__address__': not a label name"),
    ({"aggregate_away": ("pod", "pod")}, "a label is named twice"),
    ({"runbook_base_url": "http://wiki.internal:8080/specwatch/runbooks"}, None),
    ({"runbook_base_url": "wiki.internal/runbooks"}, "give the http(s) address"),
    ({"runbook_base_url": "ftp://wiki.internal/runbooks"}, "give the http(s) address"),
    ({"runbook_base_url": "https://wiki.internal/run books"}, "give the http(s) address"),
    ({"runbook_base_url": "https://wiki.internal/runbooks#"}, "leave out the #fragment"),
])
def test_the_config_is_checked(config: dict, problem: str | None) -> None:
    if problem is None:
        assert RulesConfig(**config)
        return
    with pytest.raises(ConfigError) as raised:
        RulesConfig(**config)
    assert problem in str(raised.value)


def test_every_problem_of_a_config_is_told_at_once() -> None:
    with pytest.raises(ConfigError) as raised:
        RulesConfig("job", ("server",), "docs/runbooks.md")
    assert len(str(raised.value).splitlines()) == 3


# --- the rules -------------------------------------------------------------------------------------------------------


def test_there_are_rule_files_each_with_a_test_file() -> None:
    files = rule_files()
    assert files, "no rule files under alerts/"
    for path in files:
        test_file = path.with_name(path.name.removesuffix(".yml") + ".test.yml")
        assert test_file.is_file(), f"{path.name} has no promtool test file {test_file.name}"
        assert path.name in yaml.safe_load(test_file.read_text())["rule_files"]


@pytest.mark.real
def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", *(p.name for p in rule_files()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "WARNING" not in result.stdout + result.stderr


@pytest.mark.real
def test_promtool_unit_tests_pass() -> None:
    tests = [p.name for p in ALERTS.glob("*.test.yml")]
    result = promtool("test", "rules", *tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(tests)


@pytest.mark.real
def test_promtool_unit_tests_can_fail(tmp_path) -> None:
    """A rule file whose page is one word off must fail the same unit tests."""
    for path in ALERTS.glob("*.yml"):
        (tmp_path / path.name).write_text(path.read_text())
    rules = tmp_path / "specwatch.rules.yml"
    rules.write_text(rules.read_text().replace("serves fill-in logprobs", "serves fill-in logprob", 1))
    result = subprocess.run(["promtool", "test", "rules", "specwatch.rules.test.yml"], capture_output=True, text=True,
                            timeout=HANG, cwd=tmp_path)
    assert result.returncode != 0
    assert "SpecwatchServingFillInLogprobs" in result.stdout + result.stderr


def test_every_alert_has_a_name_severity_and_templated_annotations() -> None:
    alerts = alert_rules()
    assert {a["alert"] for a in alerts} >= {
        "SpecwatchServingFillInLogprobs", "SpecwatchSpeculationContradiction", "SpecwatchCanaryStale",
        "SpecwatchCanaryFailing", "SpecwatchServerDown", "SpecwatchConfigReloadFailed", "SpecwatchExporterDown",
    }
    for alert in alerts:
        name = alert["alert"]
        assert re.fullmatch(r"Specwatch(?:[A-Z][a-z0-9]*)+", name), f"{name} is not CamelCase with the Specwatch prefix"
        assert alert.get("labels", {}).get("severity") in {"critical", "warning"}, name
        annotations = alert.get("annotations", {})
        for key in ANNOTATIONS:
            assert annotations.get(key, "").strip(), f"{name} has no {key}"
        for key in ("summary", "description"):
            assert "{{ $labels." in annotations[key] or "{{ or $labels." in annotations[key], f"{name} {key} is not templated"
        if name in FLEET_LEVEL:
            assert "$labels.job" in annotations["description"], f"{name} description does not name the job"
        elif metric_names(alert["expr"]) - EXPORTER_LEVEL:
            assert "$labels.server" in annotations["description"], f"{name} description does not name the server"


def test_only_fill_ins_a_fleet_flip_and_an_unwatched_fleet_page() -> None:
    critical = [a["alert"] for a in alert_rules() if a["labels"]["severity"] == "critical"]
    assert critical == ["SpecwatchServingFillInLogprobs", "SpecwatchFleetUnwatched", "SpecwatchFleetServingFillInLogprobs"]


def test_the_fleet_page_inhibits_only_the_pages_of_its_own_servers() -> None:
    example = yaml.safe_load((EXAMPLES / "alertmanager.yml").read_text())
    rules = [r for r in example["inhibit_rules"] if r["source_matchers"] == ['alertname = "SpecwatchFleetServingFillInLogprobs"']]
    assert rules == [{"source_matchers": ['alertname = "SpecwatchFleetServingFillInLogprobs"'],
                      "target_matchers": ['alertname = "SpecwatchServingFillInLogprobs"'],
                      "equal": ["job", "pool", "server", "model"]}]
    (route,) = [r for r in example["route"]["routes"] if r["matchers"] == ['alertname = "SpecwatchFleetServingFillInLogprobs"']]
    assert route["receiver"] == "specwatch-page" and route["group_by"] == ["alertname", "job", "pool", "build"]


def test_the_pages_runbook_reads_both_endpoint_lists_and_clears_none_the_page_leaves_out() -> None:
    (page,) = [a for a in alert_rules() if a["alert"] == "SpecwatchServingFillInLogprobs"]
    text = " ".join(markdown.section(RUNBOOKS, "SpecwatchServingFillInLogprobs").split())
    # Each list the description can hold is named in the runbook by the words on-call reads on the page.
    lists = re.findall(r"\| query \}\} ([^{:,]+)", page["annotations"]["description"])
    assert lists == ["Endpoints serving them", "Not yet canaried since the server started or changed"]
    for heading in lists:
        assert f"*{heading}*" in text
    assert "specwatch_canary_checked == 0" in text
    assert "Treat them exactly like the first list" in text
    # An endpoint is cleared by a canary that drafted with real logprobs, never by being absent from the page.
    assert "Never let evals go on against an endpoint because the page does not name it" in text
    assert "Only `specwatch check URL --endpoint ENDPOINT` exiting 0 clears one" in text
    assert not re.search(r"not named may go on|endpoints not named[^.]*go on", text)


def test_every_runbook_url_points_at_an_existing_section() -> None:
    anchors = runbook_anchors()
    for alert in alert_rules():
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOK_BASE), url
        fragment = urlsplit(url).fragment
        assert fragment in anchors, f"{alert['alert']}: no heading in docs/runbooks.md has the anchor #{fragment}"
        assert fragment == alert["alert"].lower(), f"{alert['alert']} should link to its own section"


def test_every_alert_is_unit_tested_firing_with_exact_words_and_staying_quiet() -> None:
    firing: dict[str, set[str]] = {}
    quiet: set[str] = set()
    for path in ALERTS.glob("*.test.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                expected = check.get("exp_alerts") or []
                if not expected:
                    quiet.add(check["alertname"])
                for alert in expected:
                    assert "severity" in alert["exp_labels"], f"{check['alertname']}: exp_labels lack severity"
                    firing.setdefault(check["alertname"], set()).update(alert.get("exp_annotations", {}))
    for alert in alert_rules():
        name = alert["alert"]
        assert firing.get(name, set()) >= set(ANNOTATIONS), f"{name}: no firing case with every annotation"
        assert name in quiet, f"{name}: no case where it stays quiet"


async def _full_exposition(make_watcher) -> str:
    """The real collector over a fleet that gives every metric family samples: clean, speculating, dead; and a peer group
    (plain, draft and rotated serve one model) whose rotated member refuses the peer probe."""
    router = FakeRouter(models={"hot": FakeLlama.draft(), "cold": FakeLlama.plain()}, status={"hot": "loaded"})
    names = ("plain", "draft", "dead", "router", "rotated")
    fakes = {"plain": FakeLlama.plain(), "draft": FakeLlama.draft(), "router": router, "rotated": FakeLlama.plain()}
    watcher = make_watcher(fakes, servers=[{"name": n, "url": f"http://{n}:8080", "labels": {"pool": "eval"}} for n in names])
    for name in names:
        await asyncio.gather(watcher.poll(name), watcher.canary(name))
        await watcher.ask_meta(name)
    await watcher.canary("router", "hot")
    fakes["rotated"].api_key = "rotated since its poll"
    await peer_round(watcher, ("plain", "draft", "rotated"))
    registry = CollectorRegistry(auto_describe=False)
    sources = (SourceStatus("file_sd[0]", 3, True, 1_699_999_000.0),)
    registry.register(SpecwatchCollector(watcher.fleet, lambda: ExporterStatus(15.0, 60.0, True, 1_699_999_000.0,
                                                                               discovery=sources)))
    return generate_latest(registry).decode()


@pytest.fixture
def exposed_names(make_watcher) -> set[str]:
    families = list(text_string_to_metric_families(asyncio.run(_full_exposition(make_watcher))))
    empty = [f.name for f in families if not f.samples]
    assert not empty, f"the fake fleet left these families without samples: {empty}"
    return {sample.name for family in families for sample in family.samples}


def test_every_metric_in_rules_and_dashboards_is_exposed(exposed_names: set[str]) -> None:
    recorded = {rule["record"] for rule in recording_rules()}
    allowed = exposed_names | recorded | PROMETHEUS_SERIES
    used = {f"rule {r.get('alert') or r['record']}": metric_names(r["expr"]) for r in alert_rules() + recording_rules()}
    used.update({str(q): metric_names(q.expr) for q in dashboard_queries()})
    assert len(used) > 20
    unknown = {where: sorted(names - allowed) for where, names in used.items() if names - allowed}
    assert not unknown, f"names the exporter does not expose: {unknown}"
    # Rules and dashboards together show every serving verdict the exporter computes.
    everything = set().union(*used.values())
    assert {"specwatch_serving_placeholders", "specwatch_canary_placeholder_ratio", "specwatch_canary_mean_logprob",
            "specwatch_speculation_enabled", "specwatch_server_info", "specwatch_canary_success"} <= everything


def test_the_name_check_catches_a_misspelt_metric(exposed_names: set[str]) -> None:
    assert metric_names('sum by (server) (specwatch_serving_placeholder{job=~"$job"})') - exposed_names == {
        "specwatch_serving_placeholder"
    }


@pytest.mark.parametrize(("expr", "names"), [
    ('time() - max without (endpoint) (specwatch_canary_last_success_timestamp_seconds) > 150',
     {"specwatch_canary_last_success_timestamp_seconds"}),
    ('up{job="specwatch"} == 0 or absent(up{job="specwatch"})', {"up"}),
    ('sum by (server, reason) (rate(specwatch_poll_failures_total{server=~"a|b"}[$__rate_interval]))',
     {"specwatch_poll_failures_total"}),
    ("count(specwatch_up == 0) or vector(0)", {"specwatch_up"}),
    ("job:a:sum / on (job) group_left b_total offset 5m", {"job:a:sum", "b_total"}),
])
def test_metric_names_are_read_from_promql(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@pytest.mark.real
def test_example_prometheus_config_is_valid_and_loads_the_rules() -> None:
    result = subprocess.run(["promtool", "check", "config", str(EXAMPLES / "prometheus.yml")], capture_output=True,
                            text=True, timeout=HANG)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = len(alert_rules()) + len(recording_rules())
    assert "specwatch.rules.yml" in result.stdout and f"SUCCESS: {rules} rules found" in result.stdout


@pytest.mark.real
def test_example_alertmanager_config_is_valid() -> None:
    result = subprocess.run(["amtool", "check-config", str(EXAMPLES / "alertmanager.yml")], capture_output=True,
                            text=True, timeout=HANG)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.real
@pytest.mark.parametrize("alert", [pytest.param(a, id=a["alert"]) for a in alert_rules()])
def test_example_alertmanager_routes_critical_to_the_pager_and_warnings_to_tickets(alert: dict) -> None:
    severity = alert["labels"]["severity"]
    expected = {"critical": "specwatch-page", "warning": "specwatch-ticket"}[severity]
    result = subprocess.run(
        ["amtool", "config", "routes", "test", "--config.file", str(EXAMPLES / "alertmanager.yml"),
         f"--verify.receivers={expected}", f"alertname={alert['alert']}", f"severity={severity}", "server=eval-a"],
        capture_output=True, text=True, timeout=HANG,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.real
def test_example_alertmanager_leaves_other_alerts_alone() -> None:
    result = subprocess.run(
        ["amtool", "config", "routes", "test", "--config.file", str(EXAMPLES / "alertmanager.yml"),
         "alertname=NodeDown", "severity=critical"], capture_output=True, text=True, timeout=HANG)
    assert result.stdout.strip() == "default"


@pytest.mark.real
def test_example_specwatch_config_passes_check_config(monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_API_KEY", "example-key")
    result = subprocess.run([sys.executable, "-m", "specwatch", "run", "--check-config", "--config",
                             str(EXAMPLES / "specwatch.yml")], capture_output=True, text=True, timeout=HANG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "config OK: 2 server(s)" in result.stdout
