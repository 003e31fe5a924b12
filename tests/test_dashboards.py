"""The Grafana dashboards: committed JSON equals the generator's output, variables, uids, and PromQL that parses."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.chain import DASHBOARDS, dashboard_queries, dashboards, panels, substitute

EXPECTED = {"specwatch-fleet.json": "specwatch-fleet", "specwatch-server.json": "specwatch-server"}
DOCS = Path(__file__).resolve().parents[1] / "docs" / "operating.md"
# The Grafana release that has each thing the dashboards use, from Grafana's changelog: table cell options came in 9.4.0
# (the cellOptions refactor, grafana#59363); the others are older, and where their exact release is not pinned down
# the newest it can be is given. The minimum docs/operating.md states is the newest of them.
GRAFANA_SINCE = {
    "schemaVersion 36": (9, 0),
    "panel row": (5, 0), "panel stat": (7, 0), "panel table": (7, 0), "panel timeseries": (8, 0),
    "panel state-timeline": (8, 0),
    "field custom.cellOptions": (9, 4), "field mappings": (8, 0), "field unit": (7, 0),
    "field custom.fillOpacity": (8, 0), "field custom.lineWidth": (8, 0), "field custom.showPoints": (8, 0),
    "transformation merge": (8, 0), "transformation organize": (7, 0),
    "legend __auto": (9, 0),
}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.real
def test_committed_json_is_what_the_code_generates() -> None:
    result = generate("--check")
    assert result.returncode == 0, result.stderr


@pytest.mark.real
def test_the_check_notices_a_hand_edit(tmp_path) -> None:
    for name in EXPECTED:
        shutil.copy(DASHBOARDS / name, tmp_path / name)
    edited = tmp_path / "specwatch-server.json"
    edited.write_text(edited.read_text().replace("specwatch / server", "specwatch / a server", 1))
    result = generate("--check", "--out", str(tmp_path))
    assert result.returncode == 1
    assert "specwatch-server.json" in result.stderr and "specwatch-fleet.json" not in result.stderr


def test_dashboards_have_stable_uids_and_titles() -> None:
    boards = dashboards()
    assert {name: board["uid"] for name, board in boards.items()} == EXPECTED
    assert len({board["title"] for board in boards.values()}) == len(boards)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_variables_are_datasource_job_and_server(name: str) -> None:
    variables = {v["name"]: v for v in dashboards()[name]["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "server", "model", "llama_job"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for key in ("job", "server", "model"):
        assert variables[key]["type"] == "query" and variables[key]["datasource"] == DATASOURCE
    assert variables["server"]["multi"] is (name == "specwatch-fleet.json")
    # "All" models is ".*", which also matches the servers watched without a model (their model label is empty).
    assert variables["model"]["includeAll"] and variables["model"]["allValue"] == ".*"
    assert variables["llama_job"]["type"] == "custom" and variables["llama_job"]["query"] == "llama-server"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_panel_queries_the_chosen_datasource_job_and_server(name: str) -> None:
    board = dashboards()[name]
    ids = [panel["id"] for panel in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            assert "$job" in target["expr"] or "$llama_job" in target["expr"], (
                f"{panel['title']}: {target['expr']} ignores the job variable")
    per_server = [t["expr"] for p in panels(board) for t in p.get("targets", []) if "$server" in t["expr"]]
    assert len(per_server) >= 10


def test_the_fleet_view_answers_which_servers_since_when_and_how_bad() -> None:
    titles = {panel["title"]: panel for panel in panels(dashboards()["specwatch-fleet.json"])}
    assert titles["Servers serving fill-ins"]["type"] == "stat"
    assert titles["Serving fill-ins, since when"]["type"] == "state-timeline"
    assert "specwatch_server_info" in str(titles["Servers"]["targets"])
    for needed in ("Placeholder ratio per endpoint", "Mean logprob per endpoint", "Canary success per endpoint",
                   "Canary latency per endpoint", "Speculation, /slots vs /props"):
        assert needed in titles


def grafana_features(board: dict) -> set[str]:
    found = {f"schemaVersion {board['schemaVersion']}"}
    for panel in panels(board):
        found.add(f"panel {panel['type']}")
        config = panel.get("fieldConfig") or {}
        found.update(f"field custom.{key}" for key in config.get("defaults", {}).get("custom", {}))
        found.update(f"field {prop['id']}" for override in config.get("overrides", []) for prop in override["properties"])
        found.update(f"transformation {step['id']}" for step in panel.get("transformations", []))
        found.update("legend __auto" for target in panel.get("targets", []) if target.get("legendFormat") == "__auto")
    return found


def test_the_docs_name_the_oldest_grafana_that_has_everything_the_dashboards_use() -> None:
    used = set().union(*(grafana_features(board) for board in dashboards().values()))
    unknown = used - set(GRAFANA_SINCE)
    assert not unknown, f"add these to GRAFANA_SINCE with the Grafana release that brought them: {sorted(unknown)}"
    major, minor = max(GRAFANA_SINCE[feature] for feature in used)
    assert re.search(rf"need Grafana {major}\.{minor} or later", DOCS.read_text()), "docs/operating.md states another minimum"


def test_the_grafana_check_sees_a_newer_feature() -> None:
    board = {"schemaVersion": 39, "panels": [{"type": "xychart", "targets": [], "fieldConfig": {"defaults": {}, "overrides": [
        {"matcher": {"id": "byName", "options": "x"}, "properties": [{"id": "custom.cellOptions", "value": {}}]}]}}]}
    assert grafana_features(board) - set(GRAFANA_SINCE) == {"schemaVersion 39", "panel xychart"}


@pytest.mark.real
def test_every_query_is_valid_promql(tmp_path) -> None:
    """promtool parses each query as a recording rule, so a typo fails here without a running Prometheus."""
    queries = dashboard_queries()
    assert len(queries) > 30
    rules = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query_{i}:check", "expr": substitute(q.expr)} for i, q in enumerate(queries)
    ]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.real
def test_a_broken_query_would_be_caught(tmp_path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "x:y:z", "expr": substitute('sum by (server (specwatch_up{job=~"$job"})')}]}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
