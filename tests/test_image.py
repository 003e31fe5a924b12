"""The container image: built by docs/operating.md's recipe on a Debian base, run hardened against real llama-servers."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from specwatch.daemon.healthcheck import TIMEOUT
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from tests.support.docker import Container, Docker, base_image, build, build_offline, daemon, recipe
from tests.support.dockerfile import last, user
from tests.support.metrics import find, scrape
from tests.support.net import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.real, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
CONFIG = "/etc/specwatch/specwatch.yml"
STATEFULSET = REPO / "deploy" / "kubernetes" / "base" / "statefulset" / "statefulset.yaml"


def as_the_pods_run() -> tuple[str, ...]:
    """`docker run` flags for the security context deploy/kubernetes gives the container, so that running the image
    here proves the manifests work: a read-only root, the capabilities dropped, no privilege escalation, and a tmpfs
    only where the pod mounts an emptyDir."""
    pod = yaml.safe_load(STATEFULSET.read_text())["spec"]["template"]["spec"]
    [container] = pod["containers"]
    security = container["securityContext"]
    flags = ["--read-only"] if security["readOnlyRootFilesystem"] else []
    flags += [f"--cap-drop={capability}" for capability in security["capabilities"]["drop"]]
    flags += ["--security-opt=no-new-privileges"] if security["allowPrivilegeEscalation"] is False else []
    scratch = {volume["name"] for volume in pod["volumes"] if "emptyDir" in volume}
    flags += [f"--tmpfs={mount['mountPath']}" for mount in container["volumeMounts"] if mount["name"] in scratch]
    return tuple(flags)


# --network host: the llama-servers are on the host's loopback.
HARDENED = ("--network", "host", *as_the_pods_run())
HEALTH_INTERVAL = "1s"  # the image's 30s would make every health transition take minutes
HEALTH_RETRIES = 3  # Docker's default, which the image keeps


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    with daemon() as running:
        yield running


@pytest.fixture(scope="module")
def image(docker: Docker) -> str:
    return build(docker, REPO, base_image(docker))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("image")


@pytest.fixture(scope="module")
def servers(workdir: Path) -> Iterator[dict[str, LlamaServer]]:
    model = write_cycle_model(workdir / "cycle.gguf")
    started: dict[str, LlamaServer] = {}
    try:
        for kind in ("plain", "draft"):
            started[kind] = LlamaServer.of_kind(kind, model, log_dir=workdir).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def readable(path: Path, text: str) -> Path:
    """A file the image's user may read through a read-only bind mount (pytest's directories are private to root)."""
    path.write_text(text)
    path.chmod(0o644)
    return path


def run_once(docker: Docker, image: str, *args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`docker run --rm` of the image, hardened as the exporter runs; `args` follow the image name."""
    return docker("run", "--rm", *HARDENED, *options, image, *args, timeout=180, check=False)


@pytest.fixture(scope="module")
def exporter(docker: Docker, image: str, servers: dict[str, LlamaServer], workdir: Path) -> Iterator[tuple[Container, str]]:
    """`specwatch run` in the image, its arguments after the image name; (the container, its /metrics URL)."""
    lines = ["servers:", *(f"  - {{name: {name}, url: '{server.url}'}}" for name, server in servers.items()),
             "poll_interval: 1s", "canary_interval: 3s"]
    config = readable(workdir / "specwatch.yml", "\n".join(lines) + "\n")
    port = free_port()
    options = (*HARDENED, "--health-interval", HEALTH_INTERVAL, "--volume", f"{config}:{CONFIG}:ro")
    with Container(docker, image, "--config", CONFIG, "--listen", f"127.0.0.1:{port}", options=options) as container:
        yield container, f"http://127.0.0.1:{port}/metrics"


def health(container: Container) -> dict:
    return container.inspect()["State"]["Health"]


def wait_health(container: Container, status: str, timeout: float) -> dict:
    def reached() -> dict | None:
        state = container.inspect()["State"]
        assert state["Running"], f"the container stopped ({state}):\n{container.logs()}"
        return state["Health"] if state["Health"]["Status"] == status else None

    try:
        return wait_until(f"the container to turn {status}", reached, timeout=timeout, interval=0.2)
    except AssertionError as err:
        raise AssertionError(f"{err}; health: {health(container)}\n{container.logs()}") from None


def verdicts(url: str) -> dict[str, str]:
    try:
        samples = scrape(url)
    except httpx.HTTPError:
        return {}
    return {server: verdict for server in ("plain", "draft")
            for verdict in ("clean", "fill_ins", "unproven", "unchecked")
            if find(samples, "specwatch_verdict", server=server, verdict=verdict) == 1}


def known(url: str) -> dict[str, str] | None:
    """The verdicts, once canaries have given both servers one."""
    found = verdicts(url)
    return found if len(found) == 2 and "unchecked" not in found.values() else None


# --- the running exporter -------------------------------------------------------------------------------------------


def test_the_exporter_runs_as_the_images_user_on_a_read_only_root(docker: Docker, image: str, exporter) -> None:
    container, _ = exporter
    assert docker.inspect(image)["Config"]["User"] == last("USER")
    state = wait_until("the container to run", lambda: (found := container.inspect())["State"]["Running"] and found, timeout=30)
    assert state["HostConfig"]["ReadonlyRootfs"] is True and not state["HostConfig"].get("Tmpfs")
    assert [(m["Destination"], m["RW"]) for m in state["Mounts"]] == [(CONFIG, False)]
    uid, gid = user()
    assert (uid, gid) == (10001, 10001)  # as docs/operating.md and deploy/kubernetes say
    # The exporter itself, PID 1 of the container, seen from the host: real, effective, saved and file system ids.
    status = Path(f"/proc/{state['State']['Pid']}/status").read_text()
    assert re.search(rf"^Uid:\t{uid}\t{uid}\t{uid}\t{uid}$", status, flags=re.M), status
    assert re.search(rf"^Gid:\t{gid}\t{gid}\t{gid}\t{gid}$", status, flags=re.M), status
    assert re.search(r"^CapEff:\t0+$", status, flags=re.M) and re.search(r"^NoNewPrivs:\t1$", status, flags=re.M), status
    assert docker("exec", container.name, "id", "-u").stdout.strip() == str(uid)
    refused = docker("exec", container.name, "sh", "-c", "touch /opt/specwatch/x || touch /tmp/x", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr


def test_the_healthcheck_turns_healthy(exporter) -> None:
    container, _ = exporter
    state = wait_health(container, "healthy", 60)
    assert state["Log"][-1]["ExitCode"] == 0


def test_metrics_show_each_servers_verdict(exporter) -> None:
    _, url = exporter
    found = wait_until("a verdict on both servers", lambda: known(url), timeout=90)
    assert found == {"plain": "clean", "draft": "fill_ins"}


def test_a_hung_exporter_turns_unhealthy_and_healthy_again_when_it_runs(docker: Docker, exporter) -> None:
    """SIGSTOP freezes the exporter alone (docker pause would freeze the health check too): the kernel still
    accepts the check's connections, nothing answers them, and only the check's timeout can tell."""
    container, url = exporter
    wait_health(container, "healthy", 60)
    before = container.inspect()["State"]
    docker("kill", "--signal", "SIGSTOP", container.name)
    try:
        status = Path(f"/proc/{before['Pid']}/status")
        wait_until("the exporter to stop", lambda: re.search(r"^State:\tT \(stopped\)", status.read_text(), flags=re.M), timeout=10)
        with pytest.raises(httpx.TimeoutException):
            httpx.get(url, timeout=1)
        hung = wait_health(container, "unhealthy", 60)
    finally:
        docker("kill", "--signal", "SIGCONT", container.name)
    failures = hung["Log"][-HEALTH_RETRIES:]
    assert hung["FailingStreak"] >= HEALTH_RETRIES
    ours = [entry["ExitCode"] == 1 and f"no answer within {TIMEOUT:g}s" in entry["Output"] for entry in failures]
    # On a starved machine (load 17 in CI) the check's own process can outlast Docker's timeout for the whole check:
    # Docker then ends it (-1). That is a failed check too, but at least one failure must be the check's own words.
    dockers = [entry["ExitCode"] == -1 and "exceeded timeout" in entry["Output"] for entry in failures]
    assert all(a or b for a, b in zip(ours, dockers, strict=True)) and any(ours), failures
    wait_health(container, "healthy", 60)
    after = container.inspect()["State"]
    assert (after["Pid"], after["StartedAt"], after["Running"]) == (before["Pid"], before["StartedAt"], True)
    # Probes in flight at SIGSTOP time out once it resumes, and a scrape may serve a body prepared before the next
    # poll and canary: the verdicts come back, not at the instant the health check does.
    wait_until("the verdicts after the exporter resumed", lambda: verdicts(url) == {"plain": "clean", "draft": "fill_ins"},
               timeout=30)


# --- one-shot commands ----------------------------------------------------------------------------------------------


def test_check_in_the_image_gates_on_the_verdict(docker: Docker, image: str, servers: dict[str, LlamaServer]) -> None:
    for kind, code, verdict in (("draft", 1, "fill_ins"), ("plain", 0, "clean")):
        result = run_once(docker, image, "check", servers[kind].url, "--json", options=("--entrypoint", "specwatch"))
        assert result.returncode == code, result.stdout + result.stderr
        assert json.loads(result.stdout)["verdict"] == verdict


def test_check_config_refuses_a_broken_config_and_accepts_a_good_one(docker: Docker, image: str, workdir: Path) -> None:
    broken = readable(workdir / "broken.yml", "servers:\n  - {name: a, url: 'ftp://x'}\npoll_interval: soon\n")
    good = readable(workdir / "good.yml", "servers:\n  - {name: a, url: 'http://10.0.0.5:8080'}\n")
    results = {config: run_once(docker, image, "--config", CONFIG, "--check-config", options=("--volume", f"{config}:{CONFIG}:ro"))
               for config in (broken, good)}
    refused, accepted = results[broken], results[good]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "servers[0] (a).url: 'ftp://x' is not an http:// or https:// URL" in refused.stderr
    assert "poll_interval: 'soon' is not a duration" in refused.stderr and "Traceback" not in refused.stderr
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    assert "config OK: 1 server(s) to watch" in accepted.stdout


# --- what the image holds -------------------------------------------------------------------------------------------


def image_files(docker: Docker, image: str) -> list[str]:
    """Every path in the image's file system, from `docker export` of a container never started."""
    name = docker("create", image, "true").stdout.strip()  # a command for an imported base, which has none
    try:
        export = subprocess.Popen(["docker", "export", name], stdout=subprocess.PIPE, env=docker.env)
        assert export.stdout is not None
        with tarfile.open(fileobj=export.stdout, mode="r|") as archive:
            names = [member.name.removeprefix("./") for member in archive]
        assert export.wait(60) == 0
        return names
    finally:
        docker("rm", name)


def test_the_image_holds_no_demo_compiler_tests_or_caches(docker: Docker, image: str) -> None:
    files = image_files(docker, image)
    added = set(files) - set(image_files(docker, base_image(docker)))  # what the Dockerfile put on its base
    assert any(f.endswith("site-packages/specwatch/daemon/healthcheck.py") for f in added), "the package is installed"
    assert not [f for f in files if "specwatch/demo" in f or "site-packages/exporter" in f]
    # A C compiler's drivers on the PATH, or its back end (cc1) where gcc keeps it.
    compilers = re.compile(r"^(usr/)?(local/)?s?bin/((\w+-)*(cc|c\+\+|gcc|g\+\+|clang)(-\d+)?|tcc)$|^usr/(lib|libexec)/gcc/.*/cc1$")
    assert not [f for f in files if compilers.search(f)]
    ours = [str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert not [f for f in files if any(f.endswith(test) for test in ours)]
    # Nothing left of the build: its sources, wheels, pip's cache, anything in /tmp or a home directory.
    leftovers = [f for f in added if f.startswith(("src/", "tmp/", "root/", "home/")) or f.endswith(".whl") or "/.cache/" in f]
    assert not leftovers


def test_the_images_own_layers_stay_small(docker: Docker, image: str) -> None:
    """The base is whatever BASE_IMAGE is; what the Dockerfile adds on top of it is specwatch and its dependencies."""
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    base = int(docker("image", "inspect", "--format", "{{.Size}}", base_image(docker)).stdout)
    assert size - base < 80e6, f"the image adds {(size - base) / 1e6:.1f} MB to its base"


def test_a_build_that_reaches_no_package_index_fails_with_the_error_the_docs_explain(docker: Docker, image: str) -> None:
    """docs/operating.md says what pip's error means; the same build with no network gives that error."""
    result = build_offline(docker, REPO, base_image(docker))
    said = result.stdout + result.stderr
    assert result.returncode != 0, said
    assert recipe().pip_error in said and "(from versions: none)" in said, said[-3000:]


# --- stopping: last, it ends the exporter's container ---------------------------------------------------------------


def test_docker_stop_ends_the_exporter_cleanly_within_the_grace_period(docker: Docker, exporter) -> None:
    container, url = exporter
    wait_until("canaries under way", lambda: known(url), timeout=90)
    started = time.monotonic()
    docker("stop", "--time", "10", container.name, timeout=30)
    took = time.monotonic() - started
    state = container.inspect()["State"]
    assert state["ExitCode"] == 0 and not state["OOMKilled"], state
    assert took < 10, f"docker stop took {took:.1f}s: SIGTERM was not enough, docker had to SIGKILL"
    logs = container.logs()
    assert "Traceback" not in logs
    events = [json.loads(line) for line in logs.splitlines() if line.strip()]  # every line is a JSON event
    errors = [e for e in events if e.get("level") in ("error", "critical")]
    assert not errors, json.dumps(errors, indent=1)
    assert events[0]["event"] == "started" and events[-1]["event"] in ("stopping", "stopped"), events[-3:]
