"""`specwatch demo`: real local llama-servers (plain, draft model, n-gram; a router where the build has one) watched by a
real exporter."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ..daemon.web import parse_listen
from ..endpoints import Endpoint
from .llamaserver import (
    INSTALL_HINT,
    Build,
    LlamaRouter,
    LlamaServer,
    LlamaServerNotFound,
    free_port,
    prebuilt_build,
    router_preset,
    source_build,
)

KINDS = (("plain", "no speculation"), ("draft", "draft model (-md, draft-simple)"), ("ngram", "n-gram lookup (ngram-mod)"))


def say(message: str) -> None:
    print(message, flush=True)


def demo_dependencies(llama_server: str | None = None) -> Build:
    """The llama-server to start, "prebuilt" (b11549, the demo extra) or "compiled" (b11434, the demo-source extra; None:
    prebuilt where installed), after checking that gguf (to write the model) is there too."""
    if importlib.util.find_spec("gguf") is None:
        raise LlamaServerNotFound(f"the gguf package is missing; {INSTALL_HINT}")
    if llama_server == "compiled":
        return source_build()
    if llama_server == "prebuilt":
        return prebuilt_build()
    try:
        return prebuilt_build()
    except LlamaServerNotFound as missing:
        try:
            return source_build()
        except LlamaServerNotFound:
            raise missing from None


def _metrics(url: str) -> dict[tuple[str, frozenset], float]:
    # The demo reads its own exporter's page once in a while, from synchronous code: the standard library does.
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode("utf-8")
    return {
        (s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples
    }


def _get(samples: dict, name: str, **labels: str) -> float | None:
    wanted = set(labels.items())
    for (sample, found), value in samples.items():
        if sample == name and wanted <= found:
            return value
    return None


# What the report shows, per watched model: (row name, server, model label or None, canaried).
UNITS = (
    ("plain", "plain", None, True), ("draft", "draft", None, True), ("ngram", "ngram", None, True),
    ("router/plain", "router", "plain", True), ("router/draft", "router", "draft", True),
    ("router/cold", "router", "cold", False),
)


def _labels(server: str, model: str | None, **more: str) -> dict[str, str]:
    return {"server": server, **({"model": model} if model else {}), **more}


def _wait_for_canaries(metrics_url: str, endpoints: int, timeout: float, units: tuple) -> dict:
    deadline = time.monotonic() + timeout
    samples: dict = {}
    while time.monotonic() < deadline:
        try:
            samples = _metrics(metrics_url)
        except OSError:  # urllib's URLError and HTTPError among them
            samples = {}
        # Every canaried model has a result on every endpoint and a verdict; the cold one is never canaried.
        ready = all(
            sum(1 for (m, labels) in samples if m == "specwatch_canary_success" and dict(labels).get("server") == server
                and dict(labels).get("model") == model) >= endpoints
            for _, server, model, canaried in units if canaried
        ) and all(_verdict(samples, server, model) != NO_VERDICT for _, server, model, _ in units)
        if ready:
            return samples
        time.sleep(0.5)
    raise TimeoutError(f"no canary results from the exporter at {metrics_url} within {timeout:.0f}s")


VERDICT_WORDS = {
    "clean": "clean: logprobs are real",
    "fill_ins": "FILL_INS: serves fill-in logprobs, do not score evals against it",
    "unproven": "UNPROVEN: speculates, no canary drafted yet, do not score",
    "unchecked": "unchecked: could not check",
}
NO_VERDICT = "no verdict exported"


def _verdict(samples: dict, server: str, model: str | None = None) -> str:
    """The exporter's own verdict (specwatch_verdict), in words: the demo decides nothing itself."""
    for verdict, words in VERDICT_WORDS.items():
        if _get(samples, "specwatch_verdict", **_labels(server, model, verdict=verdict)) == 1:
            if verdict == "unchecked" and _get(samples, "specwatch_model_loaded", **_labels(server, model)) == 0:
                return "unchecked: not loaded, and specwatch never loads a model"
            return words
    return NO_VERDICT


def _report(samples: dict, units: tuple) -> str:
    def flag(value: float | None) -> str:
        return "unknown" if value is None else ("on" if value else "off")

    lines = [f"{'server':<13} {'/props':<8} {'/slots':<8} {'contradiction':<14} verdict"]
    for row, server, model, _ in units:
        contradiction = _get(samples, "specwatch_speculation_contradiction", **_labels(server, model))
        lines.append(
            f"{row:<13} {flag(_get(samples, 'specwatch_speculation_enabled', **_labels(server, model, source='props'))):<8} "
            f"{flag(_get(samples, 'specwatch_speculation_enabled', **_labels(server, model, source='slots'))):<8} "
            f"{'unknown' if contradiction is None else 'YES' if contradiction else 'no':<14} {_verdict(samples, server, model)}"
        )
    endpoints = [e.value for e in Endpoint]
    canaried = [(row, server, model) for row, server, model, done in units if done]
    lines += ["", "fill-in tokens / tokens after the first, and the mean logprob an eval would compute:"]
    lines.append(f"{'endpoint':<25}" + "".join(f"{row:>15}" for row, _, _ in canaried))
    for endpoint in endpoints:
        cells = []
        for _, server, model in canaried:
            where = _labels(server, model, endpoint=endpoint)
            fills = _get(samples, "specwatch_canary_placeholder_tokens", **where)
            judged = _get(samples, "specwatch_canary_tokens", **where)  # the tokens after the first
            mean = _get(samples, "specwatch_canary_mean_logprob", **where)
            cell = "failed" if fills is None or judged is None else f"{fills:.0f}/{judged:.0f} {mean:+.3f}"
            cells.append(f"{cell:>15}")
        lines.append(f"{endpoint:<25}" + "".join(cells))
    return "\n".join(lines)


def demo_config(urls: dict[str, str]) -> str:
    """The exporter's config for the demo's servers: short intervals, so the first verdicts come within seconds."""
    return (
        "servers:\n" + "".join(f"  - {{name: {name}, url: '{url}'}}\n" for name, url in urls.items())
        + "poll_interval: 2s\npoll_timeout: 1500ms\ncanary_interval: 10s\ncanary_timeout: 10s\n"
    )


def closing_hint(metrics_url: str, *, keep_running: bool) -> str:
    """What the user can do next: curl the exporter only while it still runs."""
    if keep_running:
        return (f"see it yourself: curl -s {metrics_url} | grep -E 'specwatch_verdict|contradiction'\n"
                f"or browse {metrics_url.removesuffix('metrics')} ; running until Ctrl-C, which stops them all")
    return ("the demo has stopped its llama-servers and the exporter; run specwatch demo --keep-running to keep them "
            "up and curl or browse the exporter yourself")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def run_demo(*, listen: str, keep_running: bool, llama_server: str | None = None) -> int:
    host, port = parse_listen(listen)
    host = host if host != "0.0.0.0" else "127.0.0.1"
    say("specwatch demo: real llama-servers on 127.0.0.1, watched by a real exporter")
    try:
        build = demo_dependencies(llama_server)
    except LlamaServerNotFound as err:
        print(f"specwatch demo: {err}", file=sys.stderr)
        return 2
    say(f"llama-server {build.name}: {build.origin}")
    units = UNITS if build.router else tuple(unit for unit in UNITS if unit[1] != "router")
    from .tinymodel import write_cycle_model

    with tempfile.TemporaryDirectory(prefix="specwatch-demo-") as tmp:
        workdir = Path(tmp)
        model = write_cycle_model(workdir / "tiny-cycle.gguf")
        say(f"model: {model} ({model.stat().st_size // 1024} KiB, generated; its output repeats a fixed cycle)")
        servers: list[LlamaServer] = []
        exporter: subprocess.Popen | None = None
        # The servers run in sessions of their own (Ctrl-C reaches only the demo): kill, a closed terminal or a service
        # manager's SIGTERM must stop them through the same clean-up as Ctrl-C, or they outlive the demo.
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
        try:
            for kind, what in KINDS:
                server = LlamaServer.of_kind(kind, model, build=build, log_dir=workdir).start()
                servers.append(server)
                say(f"started {kind:<6} llama-server at {server.url}  ({what})")
            urls = {kind: s.url for (kind, _), s in zip(KINDS, servers, strict=False)}
            router = _router(build, model, workdir)
            if router is not None:
                servers.append(router)
                urls["router"] = router.url
            config = workdir / "specwatch.yml"
            config.write_text(demo_config(urls))
            port = port or free_port()
            log = (workdir / "specwatch.log").open("w")
            exporter = subprocess.Popen(
                [sys.executable, "-m", "specwatch", "run", "--config", str(config), "--listen", f"{host}:{port}",
                 "--log-format", "json"],
                stdout=log, stderr=subprocess.STDOUT,
            )
            metrics_url = f"http://{host}:{port}/metrics"
            say(f"started specwatch at http://{host}:{port}/ ; waiting for the first canaries ...")
            samples = _wait_for_canaries(metrics_url, endpoints=len(Endpoint), timeout=120, units=units)
            say("")
            say(_report(samples, units))
            if router is not None:
                say(f"(the router's cold model is still {router.status('cold')}: nothing specwatch did loaded it)")
            say("")
            say(closing_hint(metrics_url, keep_running=keep_running))
            if keep_running:
                while exporter.poll() is None:
                    time.sleep(1)
            return 0
        except KeyboardInterrupt:
            return 0
        except LlamaServerNotFound as err:  # installed, and cannot run on this machine
            print(f"specwatch demo: {err}", file=sys.stderr)
            return 2
        except (TimeoutError, OSError, RuntimeError) as err:
            print(f"specwatch demo: {err}", file=sys.stderr)
            return 1
        finally:
            for sig, handler in previous.items():  # a second signal during the clean-up does what it did before
                signal.signal(sig, handler)
            if exporter is not None and exporter.poll() is None:
                exporter.terminate()
                exporter.wait(10)
            for server in servers:
                server.stop()


def _router(build: Build, model: Path, workdir: Path) -> LlamaRouter | None:
    """A router with two of its three models loaded, on a build that has router mode; None (said why) on one without."""
    if not build.router:
        say(f"no router: llama-server {build.name} {build.origin.split(' ')[0]} has router mode disabled; "
            "specwatch demo --llama-server compiled shows one (the demo-source extra)")
        return None
    preset = router_preset(workdir / "preset.ini", {
        "plain": ["--model", str(model)],
        "draft": ["--model", str(model), "--model-draft", str(model), "--spec-type", "draft-simple"],
        "cold": ["--model", str(model)],
    })
    router = LlamaRouter(preset, models_max=2, build=build, log_dir=workdir).start()
    for name in ("plain", "draft"):
        router.load(name)  # what traffic would do; specwatch itself never loads a model
    say(f"started a router       at {router.url}  (models plain and draft loaded, cold never loaded)")
    return router
