"""The Grafana dashboards: committed JSON equals the generator's output, variables, uids, and PromQL that parses."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import yaml

from tests.support.chain import DASHBOARDS, dashboard_queries, dashboards, panels, substitute

EXPECTED = {"specwatch-fleet.json": "specwatch-fleet", "specwatch-server.json": "specwatch-server"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DASHBOARDS / "generate.py"), *args], capture_output=True, text=True,
                          timeout=120)


def test_committed_json_is_what_the_code_generates() -> None:
    result = generate("--check")
    assert result.returncode == 0, result.stderr


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


def test_a_broken_query_would_be_caught(tmp_path) -> None:
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "x:y:z", "expr": substitute('sum by (server (specwatch_up{job=~"$job"})')}]}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
