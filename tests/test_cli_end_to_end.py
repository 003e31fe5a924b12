"""End to end on real llama-servers: `specwatch run` and `specwatch check` give the right verdict per kind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.endpoints import Endpoint
from tests.support import builds
from tests.support.builds import SOURCE
from tests.support.favour import favoured
from tests.support.metrics import find, scrape
from tests.support.net import free_port
from tests.support.process import ExporterProcess, check_json
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real

API_KEY = "sk-e2e-test-key-4711"
ENDPOINTS = tuple(e.value for e in Endpoint)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="module")
def model(workdir: Path) -> Path:
    return write_cycle_model(workdir / "cycle.gguf")


SERVERS = {  # name: (kind, more flags)
    "plain": ("plain", []),
    "draft": ("draft", []),
    "ngram": ("ngram", []),
    "locked": ("plain", ["--api-key", API_KEY]),
    "noslots": ("draft", ["--no-slots"]),
    # Speculates per /slots, but a 64-token lookup never matches the canary's text: it never drafts, so its
    # logprobs are not proven real. (With its defaults ngram-simple drafts on the chat canaries: fill-ins.)
    "quiet": ("plain", ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "64"]),
    "ngramsimple": ("plain", ["--spec-type", "ngram-simple"]),
    # /slots off: speculation cannot be seen, so only canaries long enough on both kinds of endpoint prove it off.
    "noslotsplain": ("plain", ["--no-slots"]),
    "noslotssimple": ("plain", ["--spec-type", "ngram-simple", "--no-slots"]),
}


@contextlib.contextmanager
def _started(build: str, model: Path, workdir: Path) -> Iterator[dict[str, LlamaServer]]:
    """Every server of SERVERS on `build`."""
    started: dict[str, LlamaServer] = {}
    # Ahead of the machine's other work for a CPU, as the exporter watching them: their polls time out at 900 ms.
    with favoured():
        try:
            for name, (kind, extra) in SERVERS.items():
                started[name] = LlamaServer.of_kind(kind, model, extra, build=builds.get(build), log_dir=workdir).start()
            yield started
        finally:
            for server in started.values():
                server.stop()


@pytest.fixture(scope="module")
def servers(model: Path, workdir: Path) -> Iterator[dict[str, LlamaServer]]:
    with _started(SOURCE, model, workdir) as started:
        yield started


@pytest.fixture(scope="module")
def key_file(workdir: Path) -> Path:
    path = workdir / "key"
    path.write_text(API_KEY + "\n")
    return path


@contextlib.contextmanager
def _exporter(servers: dict[str, LlamaServer], key_file: Path, config: Path) -> Iterator[tuple[str, Path]]:
    """`specwatch run` watching `servers`: its /metrics URL and its log."""
    lines = ["servers:"]
    for name, server in servers.items():
        lines.append(f"  - {{name: {name}, url: '{server.url}', labels: {{kind: {name}}}"
                     + (f", api_key_file: '{key_file}'" if name == "locked" else "") + "}")
    # The locked server once more, without its key: specwatch cannot check it.
    lines.append(f"  - {{name: unkeyed, url: '{servers['locked'].url}', labels: {{kind: unkeyed}}}}")
    lines.append("poll_interval: 1s\npoll_timeout: 900ms\ncanary_interval: 3s\ncanary_timeout: 3s\n")
    config.write_text("\n".join(lines))
    port = free_port()
    log = config.with_suffix(".log")
    with log.open("w") as out, favoured():
        process = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "run", "--config", str(config), "--listen", f"127.0.0.1:{port}",
             "--log-level", "debug"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}/metrics", log
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def exporter_metrics(servers: dict[str, LlamaServer], key_file: Path, workdir: Path) -> Iterator[tuple[str, Path]]:
    with _exporter(servers, key_file, workdir / "specwatch.yml") as exporter:
        yield exporter


def _wait(url: str, ready, timeout: float = 60.0) -> dict:
    """The first scrape of `url` that `ready` accepts (a scrape that fails counts as not ready yet)."""

    def scraped() -> dict | None:
        try:
            samples = scrape(url)
        except httpx.HTTPError:
            return None
        return samples if samples and ready(samples) else None

    return wait_until(f"the exporter at {url} to be ready", scraped, timeout=timeout, interval=0.5)


def test_exporter_tells_each_kind_of_server_apart(exporter_metrics: tuple[str, Path]) -> None:
    url, log = exporter_metrics
    names = ("plain", "draft", "ngram", "locked", "noslots")
    # n-gram speculation learns from earlier requests; give it a few canary rounds to start drafting.
    # A scrape with every server up: on a busy machine one poll may time out now and then, which is no kind of server.
    samples = _wait(url, lambda s: all(find(s, "specwatch_canary_success", server=n, endpoint=e) is not None
                                       for n in names for e in ENDPOINTS)
                    and all(find(s, "specwatch_up", server=n) == 1 for n in names)
                    and find(s, "specwatch_serving_placeholders", server="ngram") == 1)

    for name in names:
        assert find(samples, "specwatch_up", server=name) == 1, (name, log.read_text()[-2000:])
        for endpoint in ENDPOINTS:
            assert find(samples, "specwatch_canary_success", server=name, endpoint=endpoint) == 1, (name, endpoint)

    # /props says "none" for every server; /slots tells the truth.
    for name in names:
        assert find(samples, "specwatch_speculation_enabled", server=name, source="props") == 0
    assert find(samples, "specwatch_speculation_enabled", server="plain", source="slots") == 0
    assert find(samples, "specwatch_speculation_enabled", server="draft", source="slots") == 1
    assert find(samples, "specwatch_speculation_enabled", server="ngram", source="slots") == 1
    assert find(samples, "specwatch_speculation_contradiction", server="draft") == 1
    assert find(samples, "specwatch_speculation_contradiction", server="plain") == 0
    # --no-slots: speculation unknown, not off; the canary still catches the fill-ins.
    assert find(samples, "specwatch_speculation_enabled", server="noslots", source="slots") is None
    assert find(samples, "specwatch_speculation_contradiction", server="noslots") is None

    for endpoint in ENDPOINTS:
        judged = find(samples, "specwatch_canary_tokens", server="draft", endpoint=endpoint)
        assert judged == 31  # after the first of canary_tokens_speculating (32): the default where /slots says it speculates
        assert find(samples, "specwatch_canary_placeholder_tokens", server="draft", endpoint=endpoint) == judged
        assert find(samples, "specwatch_canary_placeholder_ratio", server="draft", endpoint=endpoint) == 1.0
        assert find(samples, "specwatch_canary_placeholder_ratio", server="noslots", endpoint=endpoint) == 1.0
        for clean in ("plain", "locked"):
            assert find(samples, "specwatch_canary_placeholder_tokens", server=clean, endpoint=endpoint) == 0
    assert find(samples, "specwatch_serving_placeholders", server="draft") == 1
    assert find(samples, "specwatch_serving_placeholders", server="plain") == 0
    assert find(samples, "specwatch_serving_placeholders", server="locked") == 0
    # Real tokens score about -0.33 on this model; fill-ins drag a non-streaming mean toward zero.
    assert find(samples, "specwatch_canary_mean_logprob", server="plain", endpoint="chat") < -0.2
    assert find(samples, "specwatch_canary_mean_logprob", server="draft", endpoint="chat") > -0.05
    assert find(samples, "specwatch_server_info", server="plain", build="b0-unknown") == 1


def test_plain_server_never_shows_a_fill_in(exporter_metrics: tuple[str, Path]) -> None:
    url, _ = exporter_metrics
    seen = 0
    # Eight seconds (more than two canary rounds) and five scrapes with every endpoint canaried, however long those
    # take on a busy machine.
    started = time.monotonic()
    while time.monotonic() < started + 8 or seen < 5 * len(ENDPOINTS):
        assert time.monotonic() < started + 120, f"only {seen} canaried endpoints scraped"
        samples = scrape(url)
        for endpoint in ENDPOINTS:
            value = find(samples, "specwatch_canary_placeholder_tokens", server="plain", endpoint=endpoint)
            if value is not None:
                seen += 1
                assert value == 0
        time.sleep(1)


def test_check_verdicts(servers: dict[str, LlamaServer], key_file: Path) -> None:
    code, report = check_json(servers["plain"].url)
    assert (code, report["verdict"]) == (0, "clean")
    assert all(e["fill_ins"] == 0 and e["tokens"] == 48 for e in report["endpoints"])

    code, report = check_json(servers["draft"].url)
    assert (code, report["verdict"]) == (1, "fill_ins")
    assert all(e["fill_ins"] == 47 for e in report["endpoints"])

    code, report = check_json(servers["ngram"].url)
    assert code == 1 and report["verdict"] in ("fill_ins", "unproven")

    code, report = check_json(servers["locked"].url)
    assert (code, report["verdict"]) == (2, "unchecked") and "unauthorized" in report["summary"]
    code, report = check_json(servers["locked"].url, "--api-key-file", str(key_file))
    assert (code, report["verdict"]) == (0, "clean")

    code, report = check_json(servers["noslots"].url)
    assert (code, report["verdict"], report["speculation_slots"]) == (1, "fill_ins", None)


def test_check_where_slots_are_off_needs_both_kinds_of_endpoint(servers: dict[str, LlamaServer]) -> None:
    """ngram-simple never drafts on the raw prompt: a check of the completion endpoints alone, however long, used to
    call it clean. Without /slots, a raw-prompt canary of 8 tokens and a chat canary of 32 are both needed."""
    simple, plain = servers["noslotssimple"].url, servers["noslotsplain"].url
    raw_only = ("--endpoint", "completion", "--endpoint", "v1_completion")
    code, report = check_json(simple, *raw_only)
    assert (code, report["verdict"]) == (1, "unproven"), report["summary"]
    assert all(e["fill_ins"] == 0 for e in report["endpoints"])  # it really did not draft there
    assert "32 tokens or more on a chat endpoint (chat, chat_stream)" in report["summary"]
    code, report = check_json(simple, "--endpoint", "completion", "--endpoint", "chat", "--tokens", "32")
    assert (code, report["verdict"]) == (1, "fill_ins"), report["summary"]
    assert [e["endpoint"] for e in report["endpoints"] if e["fill_ins"]] == ["chat"]
    assert check_json(plain, *raw_only)[1]["verdict"] == "unproven"
    assert check_json(plain, "--endpoint", "chat", "--tokens", "48")[1]["verdict"] == "unproven"
    code, report = check_json(plain, "--endpoint", "completion", "--endpoint", "chat", "--tokens", "32")
    assert (code, report["verdict"]) == (0, "clean"), report["summary"]


VERDICTS = {"plain": "clean", "draft": "fill_ins", "ngram": "fill_ins", "ngramsimple": "fill_ins", "quiet": "unproven",
            "unkeyed": "unchecked", "noslots": "fill_ins", "noslotsplain": "clean", "noslotssimple": "fill_ins"}


def _daemon_verdict(samples: dict, server: str) -> str | None:
    on = [v for v in ("clean", "fill_ins", "unproven", "unchecked") if find(samples, "specwatch_verdict", server=server, verdict=v) == 1]
    assert len(on) <= 1, (server, on)
    return on[0] if on else None


@contextlib.contextmanager
def _watched(request: pytest.FixtureRequest, build: str) -> Iterator[tuple[dict[str, LlamaServer], str]]:
    """SERVERS on `build` and the daemon watching them: the module's own on b11434, for this test alone on another."""
    if build == SOURCE:
        yield request.getfixturevalue("servers"), request.getfixturevalue("exporter_metrics")[0]
        return
    workdir, key_file = request.getfixturevalue("workdir"), request.getfixturevalue("key_file")
    with _started(build, request.getfixturevalue("model"), workdir) as servers, \
            _exporter(servers, key_file, workdir / f"specwatch-{build}.yml") as (url, _):
        yield servers, url


@builds.each
def test_check_and_the_daemon_agree_on_every_verdict(request: pytest.FixtureRequest, build: str) -> None:
    with _watched(request, build) as (servers, url):
        _agree(servers, url)


def _agree(servers: dict[str, LlamaServer], url: str) -> None:
    samples = _wait(url, lambda s: all(_daemon_verdict(s, name) == verdict for name, verdict in VERDICTS.items()),
                    timeout=90)
    for name, verdict in VERDICTS.items():
        assert _daemon_verdict(samples, name) == verdict
        code, report = check_json(servers["locked" if name == "unkeyed" else name].url)
        assert (report["verdict"], code) == (verdict, {"clean": 0, "fill_ins": 1, "unproven": 1, "unchecked": 2}[verdict])


def test_check_refuses_an_unreachable_server() -> None:
    code, report = check_json(f"http://127.0.0.1:{free_port()}")
    assert (code, report["verdict"]) == (2, "unchecked") and "connection_refused" in report["summary"]


def _demo(*options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specwatch", "demo", "--listen", f"127.0.0.1:{free_port()}", *options],
                          capture_output=True, text=True, timeout=300, env=env)


def _readme_demo_output() -> list[str]:
    """What the README says the demo prints, line by line."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    return readme.split("What the demo prints", 1)[1].split("```\n", 2)[1].splitlines()


def test_the_readme_demo_on_the_prebuilt_server_prints_what_the_readme_shows() -> None:
    """The README's demo command as a new user runs it: build 11549 prebuilt, no router (its wheel has none)."""
    result = _demo()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "llama-server b11549: prebuilt (xllamacpp==2026.10.11549)" in result.stdout
    assert "no router: llama-server b11549 prebuilt has router mode disabled" in result.stdout
    shown = _readme_demo_output()
    printed = result.stdout.splitlines()
    at = printed.index(shown[0])
    assert printed[at:at + len(shown)] == shown
    assert "see it yourself" not in result.stdout and "--keep-running" in printed[-1]


def test_the_demo_on_the_compiled_server_adds_a_router_and_reports_each_verdict() -> None:
    result = _demo("--llama-server", "compiled")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "llama-server b11434: compiled" in result.stdout
    names = ("plain ", "draft ", "ngram ", "router/plain ", "router/draft ", "router/cold ")
    verdicts = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith(names)}
    for clean in ("plain", "router/plain"):
        assert verdicts[clean].endswith("clean: logprobs are real") and " no " in verdicts[clean]
    for speculating in ("draft", "ngram", "router/draft"):
        assert "FILL_INS: serves fill-in logprobs" in verdicts[speculating] and " YES " in verdicts[speculating]
    assert verdicts["router/cold"].endswith("unchecked: not loaded, and specwatch never loads a model")
    assert "(the router's cold model is still unloaded: nothing specwatch did loaded it)" in result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()
            if line.startswith(("chat", "completion", "v1_completion"))}
    # Columns: plain, draft, ngram, router/plain, router/draft; each cell "fill-ins/tokens after the first, mean".
    assert sorted(rows) == sorted(e.value for e in Endpoint)
    assert all(cells[0] == "0/7" and cells[2] == "31/31" and cells[6] == "0/7" and cells[8] == "31/31" for cells in rows.values())


FAKE_WHEELS = {
    # A wheel whose shared object this system cannot load (another OS, an older C library).
    "cannot load": ("raise ImportError('libgomp.so.1: cannot open shared object file')\n",
                    "the xllamacpp wheel is not installed or cannot load here (libgomp.so.1: cannot open shared object "
                    "file)"),
    # A CPU without the instructions the wheel was built for: the process dies of SIGILL as the server starts.
    "old CPU": ("import os, signal\nclass CommonParams:\n    def __getattr__(self, name):\n        return self\n"
                "    def __setattr__(self, name, value):\n        pass\n"
                "class _Any:\n    def __getattr__(self, name):\n        return 0\n"
                "common_speculative_type = ggml_type = _Any()\n"
                "class Server:\n    def __init__(self, params):\n        os.kill(os.getpid(), signal.SIGILL)\n",
                "llama-server b11549 (prebuilt (xllamacpp==2026.10.11549)) was killed by SIGILL: this CPU lacks an "
                "instruction it was built for"),
}


@pytest.mark.parametrize("fault", FAKE_WHEELS)
def test_a_prebuilt_server_that_cannot_run_here_makes_the_demo_say_so_and_how_to_build_instead(fault: str,
                                                                                            tmp_path: Path) -> None:
    """Played by a stand-in wheel on PYTHONPATH: no real machine here lacks AVX2 or runs another OS."""
    (tmp_path / "xllamacpp").mkdir()
    (tmp_path / "xllamacpp" / "__init__.py").write_text(FAKE_WHEELS[fault][0])
    result = _demo("--llama-server", "prebuilt", env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert FAKE_WHEELS[fault][1] in result.stderr
    assert "build llama-server b11434 from source" in result.stderr and "pip install 'specwatch[demo-source]'" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_kept_running_demo_stopped_by_a_signal_stops_everything_it_started(stop: signal.Signals) -> None:
    """kill, a closed terminal or a service manager must not leave llama-servers and the exporter behind."""
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "specwatch", "demo", "--keep-running", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if "running until Ctrl-C" in line:
                break
        urls = [word for line in lines for word in line.split() if word.startswith("http://127.0.0.1:")]
        started = {url.rstrip("/") for url in urls if not url.endswith("/metrics")}
        assert len(started) == 4, "".join(lines)  # three llama-servers (prebuilt: no router) and the exporter

        def unhealthy() -> list[str]:
            down = []
            for url in sorted(started):
                try:
                    healthy = httpx.get(f"{url}/health" if url.rsplit(":", 1)[1] != str(port) else f"{url}/-/healthy",
                                        timeout=10).is_success
                except httpx.HTTPError:
                    healthy = False
                if not healthy:
                    down.append(url)
            return down

        # Every one answers, so each is a process that the signal must stop (a router may still be loading its models
        # when the demo says it runs: wait for it, on a busy machine longer).
        wait_until("every server the demo started to answer healthy", lambda: not unhealthy(), timeout=60, interval=0.5,
                   alive=demo)
        demo.send_signal(stop)
        assert demo.wait(30) == 0
        for url in started:
            with pytest.raises(httpx.ConnectError):
                httpx.get(url, timeout=2)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()


def test_a_config_with_only_the_two_intervals_works_on_real_servers(servers: dict[str, LlamaServer], tmp_path: Path) -> None:
    """Short intervals need no timeouts: the defaults are capped by the intervals, as Prometheus does it."""
    config = tmp_path / "short.yml"
    config.write_text(f"servers:\n  - {{name: plain, url: '{servers['plain'].url}'}}\n"
                      f"  - {{name: draft, url: '{servers['draft'].url}'}}\npoll_interval: 1s\ncanary_interval: 1s\n")
    with ExporterProcess("--config", str(config)) as exporter:
        exporter.wait_started()
        url = f"{exporter.url()}/metrics"
        _wait(url, lambda s: _daemon_verdict(s, "plain") == "clean" and _daemon_verdict(s, "draft") == "fill_ins", timeout=60)
        samples = scrape(url)
        assert find(samples, "specwatch_poll_interval_seconds") == 1 and find(samples, "specwatch_canary_interval_seconds") == 1
