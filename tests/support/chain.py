"""The alerting chain's files and services: rules, dashboards, PromQL names, Prometheus queries, a webhook sink."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.support import markdown
from tests.support.net import free_port
from tests.support.process import Process

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "alerts"
RULES = ALERTS / "specwatch.rules.yml"
DASHBOARDS = REPO / "dashboards"
RUNBOOKS = REPO / "docs" / "runbooks.md"
EXAMPLES = REPO / "examples"
RUNBOOK_BASE = "https://github.com/specwatch/specwatch/blob/main/docs/runbooks.md#"

# Grafana's built-in variables, replaced the way Grafana would for a 1s-scrape Prometheus; $job and $server
# become "match everything" so a query covers every server of the test.
GRAFANA_VARIABLES = {"job": ".*", "server": ".*", "model": ".*", "llama_job": "llama-server", "__rate_interval": "1m",
                     "__interval": "15s", "__range": "5m"}


def rule_groups(path: Path = RULES) -> list[dict]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]


def alert_rules(path: Path = RULES) -> list[dict]:
    return [rule for group in rule_groups(path) for rule in group["rules"] if "alert" in rule]


def recording_rules(path: Path = RULES) -> list[dict]:
    return [rule for group in rule_groups(path) for rule in group["rules"] if "record" in rule]


def rule_files() -> list[Path]:
    return sorted(p for p in ALERTS.glob("*.yml") if not p.name.endswith(".test.yml"))


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: dict) -> Iterator[dict]:
    for panel in board.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


@dataclass(frozen=True)
class DashboardQuery:
    dashboard: str
    where: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.where}: {self.expr}"


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*(?P<label>\w+)\s*\)\s*$")


def dashboard_queries(boards: dict[str, dict] | None = None) -> list[DashboardQuery]:
    """Every PromQL expression of every panel target and every query variable (label_values as its selector)."""
    found = []
    for name, board in (boards or dashboards()).items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                found.append(DashboardQuery(name, f"{panel['title']} ({target['refId']})", target["expr"]))
        for variable in board.get("templating", {}).get("list", []):
            if variable.get("type") != "query":
                continue
            text = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            match = _LABEL_VALUES.match(text)
            if match is None:
                raise AssertionError(f"{name}: variable {variable['name']} query {text!r} is not label_values(selector, label)")
            found.append(DashboardQuery(name, f"variable {variable['name']}",
                                        f"group by ({match['label']}) ({match['selector']})"))
    return found


def substitute(expr: str, values: dict[str, str] = GRAFANA_VARIABLES) -> str:
    def replace(match: re.Match) -> str:
        name = match["braced"] or match["plain"]
        if name not in values:
            raise KeyError(f"no test value for Grafana variable ${name} in {expr!r}")
        return values[name]

    return re.sub(r"\$\{(?P<braced>\w+)\}|\$(?P<plain>\w+)", replace, expr)


_PROMQL_KEYWORDS = frozenset({
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "inf", "nan",
})


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: what is left once strings, matchers, ranges, grouping
    clauses, function names, keywords and numbers are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


def runbook_anchors(path: Path = RUNBOOKS) -> set[str]:
    return markdown.anchors(path.read_text(encoding="utf-8"))


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def prometheus_api(base_url: str, path: str) -> dict:
    """The `data` of a Prometheus API answer (/api/v1/alerts, /api/v1/rules, ...)."""
    with urllib.request.urlopen(f"{base_url}{path}", timeout=10) as response:
        body = json.loads(response.read())
    assert body["status"] == "success", body
    return body["data"]


def active_alerts(base_url: str, alertname: str | None = None) -> list[dict]:
    """Prometheus' pending and firing alerts (/api/v1/alerts), of one rule when named."""
    return [a for a in prometheus_api(base_url, "/api/v1/alerts")["alerts"]
            if alertname is None or a["labels"]["alertname"] == alertname]


def alerts_evaluated_at(base_url: str, group: str = "specwatch.alerts") -> float:
    """Unix time of the last evaluation of a rule group (by default the alerts')."""
    (found,) = [g for g in prometheus_api(base_url, "/api/v1/rules")["groups"] if g["name"] == group]
    return datetime.fromisoformat(found["lastEvaluation"]).timestamp()


def evaluated_since(base_url: str, since: float, times: int, interval: float) -> Callable[[], bool]:
    """True once the alerting group has run `times` evaluation intervals after `since` (Unix time)."""
    return lambda: alerts_evaluated_at(base_url) >= since + times * interval


def alert_samples_since(base_url: str, selector: str, since: float) -> list[dict]:
    """The ALERTS series matching `selector` with any sample (pending or firing) after `since` (Unix time)."""
    window = max(1, int((time.time() - since) * 1000))
    return prometheus_query(base_url, f"count_over_time(ALERTS{{{selector}}}[{window}ms])")


def prometheus_query(base_url: str, expr: str) -> list[dict]:
    """The instant query's result vector; raises on a PromQL error so a broken panel fails loudly."""
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise AssertionError(f"Prometheus rejected {expr!r}: {err.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    result = body["data"]["result"]
    return result if isinstance(result, list) else [result]


# ---- webhook receiver ------------------------------------------------------------------------------------------


@dataclass
class Delivery:
    path: str
    body: dict
    at: float


@dataclass
class WebhookReceiver:
    """Alertmanager's webhook target: records every POST with the path it came to and when."""

    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> WebhookReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with receiver._lock:
                    receiver.deliveries.append(Delivery(self.path, body, time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def alerts(self) -> list[tuple[Delivery, dict]]:
        with self._lock:
            return [(d, alert) for d in self.deliveries for alert in d.body.get("alerts", [])]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def sequence(self, since: float = 0.0) -> list[tuple[float, str, str, list[tuple[str, str, str]]]]:
        """Each delivery as (seconds after `since`, path, status, [(alertname, server, status) of its alerts])."""
        with self._lock:
            return [(round(d.at - since, 1), d.path, d.body.get("status", ""),
                     [(a["labels"].get("alertname", ""), a["labels"].get("server", ""), a["status"])
                      for a in d.body.get("alerts", [])]) for d in self.deliveries]


def stay_quiet(receiver: WebhookReceiver, seconds: float, deliveries: int) -> None:
    """Watch the receiver for `seconds`; fail at once if a delivery beyond the first `deliveries` arrives."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if len(receiver.deliveries) != deliveries:
            break
        time.sleep(0.2)
    extra = [(d.path, d.body.get("status"), [a["labels"] for a in d.body.get("alerts", [])])
             for d in receiver.deliveries[deliveries:]]
    assert extra == [], f"notifications beyond the first {deliveries}: {extra}"


def alertmanager(work: Path, config: Path, address: str) -> Process:
    """Debian's Alertmanager on `address`, alone (no cluster), its data under `work`."""
    return Process("alertmanager", [
        shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager", f"--config.file={config}",
        f"--storage.path={work / 'alertmanager'}", f"--web.listen-address={address}", "--cluster.listen-address=",
    ], work)


def prometheus(work: Path, config: Path, address: str) -> Process:
    """Debian's Prometheus on `address`, its TSDB under `work`."""
    return Process("prometheus", [
        shutil.which("prometheus") or "/usr/bin/prometheus", f"--config.file={config}",
        f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address={address}",
    ], work)


# The page route's grouping in examples/alertmanager.yml, and the alternative it offers as a comment.
PAGE_GROUP_BY = "      group_by: [alertname, job, server]\n"
ALTERNATIVE_PAGE_GROUP_BY = "      # group_by: [alertname, job]\n"


def example_alertmanager(*, alternative: bool = False) -> str:
    """examples/alertmanager.yml as a user gets it, or with the page route's commented alternative chosen as it says."""
    text = (EXAMPLES / "alertmanager.yml").read_text()
    if not alternative:
        return text
    assert text.count(PAGE_GROUP_BY) == 1 and text.count(ALTERNATIVE_PAGE_GROUP_BY) == 1, \
        "the example's page route no longer offers the alternative grouping the tests choose"
    return text.replace(PAGE_GROUP_BY, "").replace(ALTERNATIVE_PAGE_GROUP_BY, ALTERNATIVE_PAGE_GROUP_BY.replace("# ", "", 1))


def alertmanager_config(webhook: str, *, alternative: bool = False, **timing: str) -> dict:
    """examples/alertmanager.yml (or its alternative page grouping) with its placeholder webhooks pointed at `webhook`,
    one path per receiver, and `timing` (group_wait, group_interval, ...) set on every route."""
    config = yaml.safe_load(example_alertmanager(alternative=alternative))
    replaced = 0
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            assert ".example.invalid" in hook["url"], "the example's webhook URLs are placeholders"
            hook["url"] = f"{webhook}/{receiver['name']}"
            replaced += 1
    assert replaced == 2

    def retime(route: dict) -> None:
        route.update(timing)
        for child in route.get("routes", []):
            retime(child)

    retime(config["route"])
    return config


def prometheus_config(alertmanager: str, *, interval: str) -> tuple[dict, dict[str, dict]]:
    """examples/prometheus.yml with the repository's rule file, `alertmanager` as its Alertmanager and `interval` for
    scraping (every job) and evaluation; everything else as a user gets it. Returns the config and its jobs by name."""
    config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    config["global"].update(scrape_interval=interval, evaluation_interval=interval)
    rule_files = [(EXAMPLES / path).resolve() for path in config["rule_files"]]
    assert rule_files == [RULES], "the example must load the repository's rule file"
    config["rule_files"] = [str(path) for path in rule_files]
    (manager,) = config["alerting"]["alertmanagers"]
    manager["static_configs"] = [{"targets": [alertmanager]}]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for job in jobs.values():
        job["scrape_interval"] = interval
    return config, jobs


def addresses(count: int, *taken: int) -> list[str]:
    """`count` distinct loopback addresses on ports free now and not in `taken` (ports of servers made but not started
    yet: free_port() may hand out one of those again)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port not in taken:
            ports.append(port)
    return [f"127.0.0.1:{port}" for port in ports]


def write_yaml(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
