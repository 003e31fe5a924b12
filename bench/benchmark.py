"""Benchmark: specwatch and prometheus-blackbox-exporter on the same simulated fleet, CPU and wall time per cycle."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.net import free_port
from tests.support.simfleet import (
    STATS_PATH,
    FleetOptions,
    SimFleetProcess,
    SimServer,
    build_config,
    raise_fd_limit,
    write_config,
)

REPO = Path(__file__).resolve().parents[1]
BLACKBOX_PACKAGE = "prometheus-blackbox-exporter"
BLACKBOX_MODULE = "llama_props"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid`, from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_memory_mb(pid: int | str = "self") -> tuple[float, float]:
    """(current RSS, peak RSS) in MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def fleet_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}{STATS_PATH}", timeout=30) as answer:
        return json.loads(answer.read())


def http_get_timed(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        size = len(answer.read())
    return time.perf_counter() - started, size


@dataclass
class Cycle:
    """One measured cycle of one tool."""

    tool: str
    what: str
    servers: int
    wall: float
    cpu: float
    requests: int
    connections: int | None
    ok: int
    note: str = ""

    @property
    def cpu_per_request_ms(self) -> float:
        return 1000 * self.cpu / self.requests if self.requests else float("nan")


@dataclass
class Footprint:
    tool: str
    servers: int
    rss_mb: float
    peak_rss_mb: float
    metrics_bytes: int
    served_ms: float
    """Median wall time of the /metrics body as the daemon's handler renders it today."""
    fast: dict[str, float] = field(default_factory=dict)
    """SpecwatchCollector.exposition(): wall ms of the first, a typical and an unchanged-fleet render."""
    note: str = ""


@dataclass
class Results:
    cycles: list[Cycle] = field(default_factory=list)
    footprints: list[Footprint] = field(default_factory=list)
    steady: list[dict[str, Any]] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# specwatch, measured in a worker process of its own


def _delta(after: dict[str, Any], before: dict[str, Any]) -> tuple[int, int]:
    return after["requests"] - before["requests"], after["connections"] - before["connections"]


async def _worker_cycles(config: Path, fleet_url: str, keepalive: float, renders: int) -> dict[str, Any]:
    from exporter.daemon.run import Daemon
    from exporter.settings import load_settings

    settings = load_settings(config)
    daemon = Daemon(config, settings)
    names = [s.config.name for s in daemon.fleet.snapshot()]
    speculating = {s.config.name for s in daemon.fleet.snapshot() if s.config.labels.get("kind") == "speculating"}
    out: dict[str, Any] = {"servers": len(names)}

    async def cycle(kind: str) -> dict[str, Any]:
        before = fleet_stats(fleet_url)
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(getattr(daemon.watcher, kind)(name) for name in names))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        requests, connections = _delta(fleet_stats(fleet_url), before)
        snapshot = daemon.fleet.snapshot()
        if kind == "poll":
            ok = sum(1 for s in snapshot if s.poll_success)
        else:
            ok = sum(1 for s in snapshot if (m := s.model()).canaries and all(c.success for c in m.canaries.values()))
        return {"wall": wall, "cpu": cpu, "requests": requests, "connections": connections, "ok": ok}

    out["poll_first"] = await cycle("poll")
    # llama-server drops idle connections after its keep-alive timeout, shorter than any poll interval:
    # a production poll cycle always starts on new connections.
    await asyncio.sleep(keepalive + 0.5)
    out["poll_new_connections"] = await cycle("poll")
    out["poll_kept_alive"] = await cycle("poll")
    await asyncio.sleep(keepalive + 0.5)
    out["canary"] = await cycle("canary")
    snapshot = daemon.fleet.snapshot()
    out["verdicts_right"] = sum(1 for s in snapshot if s.model().serving_fill_ins == (s.config.name in speculating))
    out.update(await _renders(daemon, names, renders))
    out["rss_mb"], out["peak_rss_mb"] = proc_memory_mb()
    await daemon.client.aclose()
    return out


def _timed(render: Callable[[], bytes]) -> tuple[float, float, int]:
    """(wall ms, CPU ms, size) of one render; the body is dropped at once so it does not swell the RSS figures."""
    wall, cpu = time.perf_counter(), time.process_time()
    size = len(render())
    return 1000 * (time.perf_counter() - wall), 1000 * (time.process_time() - cpu), size


async def _renders(daemon: Any, names: list[str], renders: int) -> dict[str, Any]:
    """/metrics as served today (generate_latest over the registry) and through the collector's exposition()."""
    from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest

    from exporter.daemon.collector import SpecwatchCollector

    served = [_timed(lambda: generate_latest(daemon.registry)) for _ in range(renders)]
    collector = SpecwatchCollector(daemon.fleet, lambda: daemon.status)
    runtime = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=runtime)
    PlatformCollector(registry=runtime)

    def fast() -> bytes:
        return collector.exposition() + generate_latest(runtime)

    first = _timed(fast)
    unchanged = [_timed(fast) for _ in range(renders)]
    # What a scrape 15 s after the last one finds: every server polled again, a quarter of them canaried
    # (canaries run every 60 s, spread over the interval).
    await asyncio.gather(*(daemon.watcher.poll(n) for n in names), *(daemon.watcher.canary(n) for n in names[::4]))
    typical = _timed(fast)
    alone = CollectorRegistry(auto_describe=False)
    alone.register(collector)
    same = collector.exposition() == generate_latest(alone)
    lines = generate_latest(daemon.registry).count(b"\n")
    return {
        "served_ms": statistics.median(t[0] for t in served), "served_cpu_ms": statistics.median(t[1] for t in served),
        "fast_first_ms": first[0], "fast_typical_ms": typical[0], "fast_typical_cpu_ms": typical[1],
        "fast_unchanged_ms": statistics.median(t[0] for t in unchanged), "fast_equals_served": same,
        "metrics_bytes": served[-1][2], "metrics_lines": lines,
    }


async def _worker_steady(config: Path, seconds: float, port: int) -> dict[str, Any]:
    from exporter.daemon.run import Daemon
    from exporter.settings import load_settings

    settings = load_settings(config)
    daemon = Daemon(config, settings)
    runner = asyncio.create_task(daemon.run("127.0.0.1", port))
    await asyncio.sleep(1.0)  # startup (imports done, jobs scheduled) is not steady state
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.sleep(seconds)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rss, peak = proc_memory_mb()
    snapshot = daemon.fleet.snapshot()
    polled = sum(1 for s in snapshot if s.poll_success)
    daemon.stop()
    await runner
    return {"wall": wall, "cpu": cpu, "rss_mb": rss, "peak_rss_mb": peak, "polled_ok": polled, "servers": len(snapshot)}


def worker_main(args: argparse.Namespace) -> int:
    from exporter.daemon import logs

    raise_fd_limit()
    logs.configure("info", json=True)  # the daemon's default level, so log cost is what production pays
    if args.worker == "cycles":
        result = asyncio.run(_worker_cycles(args.config, args.fleet_url, args.keepalive, args.renders))
    else:
        result = asyncio.run(_worker_steady(args.config, args.steady_seconds, args.port))
    args.result.write_text(json.dumps(result), encoding="utf-8")
    return 0


def run_worker(mode: str, config: Path, workdir: Path, extra: Sequence[str], *, timeout: float,
               during: Any = None) -> dict[str, Any]:
    result = workdir / f"result-{mode}.json"
    result.unlink(missing_ok=True)
    log_path = workdir / f"specwatch-{mode}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.benchmark", "--worker", mode, "--config", str(config), "--result", str(result), *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True,
        )
        try:
            if during is not None:
                during(process)
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    if process.returncode != 0 or not result.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"specwatch worker ({mode}) failed with {process.returncode}:\n{tail}")
    return json.loads(result.read_text())


# ---------------------------------------------------------------------------------------------
# prometheus-blackbox-exporter


def find_or_install_blackbox() -> str:
    found = shutil.which(BLACKBOX_PACKAGE)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {BLACKBOX_PACKAGE} with apt-get ...", file=sys.stderr, flush=True)
        subprocess.run(["apt-get", "install", "-y", BLACKBOX_PACKAGE], check=False, stdout=subprocess.DEVNULL,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        found = shutil.which(BLACKBOX_PACKAGE)
    if not found:
        raise SystemExit(f"{BLACKBOX_PACKAGE} is missing: apt-get install -y {BLACKBOX_PACKAGE}")
    return found


BLACKBOX_CONFIG = f"""\
modules:
  {BLACKBOX_MODULE}:
    prober: http
    timeout: 5s
    http:
      method: GET
      valid_status_codes: [200]
      preferred_ip_protocol: ip4
      ip_protocol_fallback: false
"""


class Blackbox:
    """A blackbox_exporter process whose http module probes a llama-server's /props."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Blackbox:
        config = self.workdir / "blackbox.yml"
        config.write_text(BLACKBOX_CONFIG, encoding="utf-8")
        log = (self.workdir / "blackbox.log").open("wb")
        self.process = subprocess.Popen(
            [self.binary, f"--config.file={config}", f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"blackbox_exporter exited: {(self.workdir / 'blackbox.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.url}/-/healthy", timeout=2).close()
                return self
            time.sleep(0.1)
        raise RuntimeError("blackbox_exporter did not become healthy within 30 s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


async def _probe_all(blackbox_url: str, servers: Sequence[SimServer], concurrency: int) -> tuple[int, int]:
    """Drive /probe for every server like Prometheus would; returns (successes, bytes of probe answers)."""
    import httpx

    limit = asyncio.Semaphore(concurrency)
    ok = size = 0
    async with httpx.AsyncClient(
        base_url=blackbox_url, timeout=30, limits=httpx.Limits(max_connections=concurrency), trust_env=False
    ) as client:

        async def one(server: SimServer) -> None:
            nonlocal ok, size
            async with limit:
                answer = await client.get(
                    "/probe", params={"target": f"{server.url}/props", "module": BLACKBOX_MODULE},
                    headers={"X-Prometheus-Scrape-Timeout-Seconds": "10"},
                )
            size += len(answer.content)
            if answer.status_code == 200 and "\nprobe_success 1\n" in answer.text:
                ok += 1

        await asyncio.gather(*(one(s) for s in servers))
    return ok, size


def blackbox_cycle(blackbox: Blackbox, servers: Sequence[SimServer], concurrency: int, fleet_url: str) -> tuple[Cycle, int]:
    before = fleet_stats(fleet_url)
    cpu = proc_cpu_seconds(blackbox.pid)
    wall = time.perf_counter()
    ok, size = asyncio.run(_probe_all(blackbox.url, servers, concurrency))
    wall = time.perf_counter() - wall
    cpu = proc_cpu_seconds(blackbox.pid) - cpu
    requests, connections = _delta(fleet_stats(fleet_url), before)
    return Cycle("blackbox", "probe /props", len(servers), wall, cpu, requests, connections, ok), size


# ---------------------------------------------------------------------------------------------
# the run


def measure(args: argparse.Namespace) -> Results:
    results = Results()
    blackbox_binary = find_or_install_blackbox()
    largest = max(args.sizes)
    workdir = Path(tempfile.mkdtemp(prefix="specwatch-bench-"))
    options = FleetOptions(servers=largest, base_port=args.base_port, spec_share=args.spec_share, latency_ms=args.latency_ms,
                           keepalive_timeout=args.keepalive_timeout)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    say(f"starting a simulated fleet of {largest} servers (latency {args.latency_ms:g} ms) ...")
    try:
        with SimFleetProcess(options) as fleet:
            fleet_url = fleet.servers[0].url
            blackbox = Blackbox(blackbox_binary, workdir).start()
            try:
                for size in args.sizes:
                    servers = fleet.servers[:size]
                    config = workdir / f"specwatch-{size}.yaml"
                    write_config(config, build_config(
                        [s.as_dict() for s in servers], poll_interval=args.poll_interval, canary_interval=args.canary_interval,
                        max_concurrency=args.max_concurrency,
                    ))
                    say(f"N={size}: specwatch cycles ...")
                    fleet_cpu = fleet_stats(fleet_url)["cpu_seconds"]
                    extra = ["--fleet-url", fleet_url, "--keepalive", str(args.keepalive_timeout), "--renders", str(args.renders)]
                    sw = run_worker("cycles", config, workdir, extra, timeout=600)
                    fleet_cpu = fleet_stats(fleet_url)["cpu_seconds"] - fleet_cpu
                    for key, what in (("poll_first", "poll, first run"), ("poll_new_connections", "poll, new connections"),
                                      ("poll_kept_alive", "poll, kept-alive"), ("canary", "canary (5 endpoints)")):
                        c = sw[key]
                        results.cycles.append(
                            Cycle("specwatch", what, size, c["wall"], c["cpu"], c["requests"], c["connections"], c["ok"])
                        )
                    results.footprints.append(Footprint(
                        "specwatch", size, sw["rss_mb"], sw["peak_rss_mb"], sw["metrics_bytes"], sw["served_ms"],
                        {"first": sw["fast_first_ms"], "typical": sw["fast_typical_ms"], "unchanged": sw["fast_unchanged_ms"]},
                        f"{sw['metrics_lines']} lines; fast typical CPU {sw['fast_typical_cpu_ms']:.1f} ms; "
                        f"fast == served: {sw['fast_equals_served']}; verdicts right "
                        f"{sw['verdicts_right']}/{size}; fleet CPU {fleet_cpu:.1f}s",
                    ))
                    say(f"N={size}: blackbox_exporter cycles ...")
                    blackbox_cycle(blackbox, servers, args.blackbox_concurrency, fleet_url)  # warm-up, not counted
                    runs = [blackbox_cycle(blackbox, servers, args.blackbox_concurrency, fleet_url) for _ in range(args.repeat)]
                    cycles = [r[0] for r in runs]
                    results.cycles.append(Cycle(
                        "blackbox", f"probe /props (mean of {len(cycles)})", size,
                        statistics.mean(c.wall for c in cycles), statistics.mean(c.cpu for c in cycles),
                        round(statistics.mean(c.requests for c in cycles)),
                        round(statistics.mean(c.connections or 0 for c in cycles)),
                        min(c.ok for c in cycles),
                    ))
                    renders = [http_get_timed(f"{blackbox.url}/metrics") for _ in range(args.renders)]
                    rss, peak = proc_memory_mb(blackbox.pid)
                    results.footprints.append(Footprint(
                        "blackbox", size, rss, peak, renders[-1][1], 1000 * statistics.median(t for t, _ in renders),
                        note=f"its own /metrics over HTTP; per-server series come from /probe, {runs[-1][1]} bytes per cycle",
                    ))
                    if args.steady_seconds > 0:
                        say(f"N={size}: specwatch daemon, steady state for {args.steady_seconds:g}s ...")
                        results.steady.append(steady(config, workdir, size, args))
            finally:
                blackbox.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def steady(config: Path, workdir: Path, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The real daemon with its schedule; /metrics is scraped over HTTP as Prometheus would."""
    port = free_port()
    scrapes: list[tuple[float, int]] = []

    def scrape(process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + args.steady_seconds + 1.0
        time.sleep(3.0)
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(OSError):
                scrapes.append(http_get_timed(f"http://127.0.0.1:{port}/metrics"))
            time.sleep(args.scrape_every)

    def start_scraping(process: subprocess.Popen[bytes]) -> None:
        threading.Thread(target=scrape, args=(process,), daemon=True).start()

    result = run_worker("steady", config, workdir, ["--steady-seconds", str(args.steady_seconds), "--port", str(port)],
                        timeout=args.steady_seconds + 120, during=start_scraping)
    result["size"] = size
    result["scrape_ms"] = [round(1000 * t, 1) for t, _ in scrapes]
    result["scrape_bytes"] = scrapes[-1][1] if scrapes else 0
    return result


def _cycle_table(results: Results) -> list[str]:
    head = (f"{'N':>5}  {'tool':<9}  {'cycle':<28} {'wall s':>7} {'CPU s':>7} {'CPU/wall':>8} {'requests':>8} "
            f"{'CPU ms/req':>10} {'new conns':>9} {'ok':>5}")
    lines = [head, "-" * len(head)]
    for c in results.cycles:
        conns = "" if c.connections is None else str(c.connections)
        busy = c.cpu / c.wall if c.wall else 0.0
        lines.append(f"{c.servers:>5}  {c.tool:<9}  {c.what:<28} {c.wall:>7.2f} {c.cpu:>7.3f} {busy:>8.2f} "
                     f"{c.requests:>8} {c.cpu_per_request_ms:>10.3f} {conns:>9} {c.ok:>5}")
    return lines


def _footprint_table(results: Results) -> list[str]:
    head = (f"{'N':>5}  {'tool':<9}  {'RSS MB':>7} {'peak MB':>7} {'/metrics B':>10} {'served ms':>9} "
            f"{'fast: first':>11} {'typical':>7} {'unchanged':>9}  note")
    lines = [head, "-" * (len(head) + 60)]
    for f in results.footprints:
        fast = (f"{f.fast['first']:>11.1f} {f.fast['typical']:>7.1f} {f.fast['unchanged']:>9.1f}" if f.fast
                else f"{'':>11} {'':>7} {'':>9}")
        lines.append(f"{f.servers:>5}  {f.tool:<9}  {f.rss_mb:>7.1f} {f.peak_rss_mb:>7.1f} {f.metrics_bytes:>10} "
                     f"{f.served_ms:>9.1f} {fast}  {f.note}")
    return lines


def _ratio_lines(results: Results, sizes: Sequence[int]) -> list[str]:
    lines = ["CPU per request, specwatch poll vs blackbox_exporter probe (below 1: specwatch is cheaper):"]
    for size in sizes:
        new = next(c for c in results.cycles if c.servers == size and c.what == "poll, new connections")
        kept = next(c for c in results.cycles if c.servers == size and c.what == "poll, kept-alive")
        probe = next(c for c in results.cycles if c.servers == size and c.tool == "blackbox")
        per_probe = probe.cpu_per_request_ms
        lines.append(f"  N={size:>5}: specwatch {new.cpu_per_request_ms:.3f} ms/request with new connections "
                     f"(ratio {new.cpu_per_request_ms / per_probe:.2f}), {kept.cpu_per_request_ms:.3f} kept-alive "
                     f"(ratio {kept.cpu_per_request_ms / per_probe:.2f}); blackbox {per_probe:.3f} ms/probe")
    return lines


def _steady_lines(results: Results, args: argparse.Namespace) -> list[str]:
    lines = [f"specwatch daemon on its real schedule (poll {args.poll_interval}, canary {args.canary_interval}), "
             "/metrics scraped over HTTP meanwhile:"]
    for s in results.steady:
        scrape = s["scrape_ms"]
        scraped = f"scrape median {statistics.median(scrape):.0f} ms, max {max(scrape):.0f} ms" if scrape else "no scrape"
        lines.append(f"  N={s['size']:>5}: {s['cpu']:.2f} CPU s in {s['wall']:.1f} s = {100 * s['cpu'] / s['wall']:.1f}% "
                     f"of one core; RSS {s['rss_mb']:.1f} MB (peak {s['peak_rss_mb']:.1f}); {scraped}; "
                     f"polled ok {s['polled_ok']}/{s['servers']}")
    return lines


def render_tables(results: Results, args: argparse.Namespace) -> str:
    lines = [*_cycle_table(results), "", *_footprint_table(results), "", *_ratio_lines(results, args.sizes)]
    if results.steady:
        lines += ["", *_steady_lines(results, args)]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.benchmark", description=__doc__)
    add = parser.add_argument
    add("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[100, 1000],
        help="fleet sizes, comma-separated (default 100,1000)")
    add("--latency-ms", type=float, default=5.0, help="simulated server latency (default 5)")
    add("--spec-share", type=float, default=0.2, help="share of speculating servers (default 0.2)")
    add("--base-port", type=int, default=0, help="first fleet port; 0 picks free ports (default)")
    add("--keepalive-timeout", type=float, default=5.0, help="the fleet's idle keep-alive timeout (default 5, as llama-server)")
    add("--max-concurrency", type=int, default=None, help="specwatch max_concurrency (default: specwatch's own)")
    add("--blackbox-concurrency", type=int, default=64, help="/probe requests in flight (default 64)")
    add("--repeat", type=int, default=3, help="blackbox cycles averaged (default 3; its CPU clock ticks at 10 ms)")
    add("--renders", type=int, default=7, help="/metrics renders, the median is shown (default 7)")
    add("--poll-interval", default="15s")
    add("--canary-interval", default="60s")
    add("--steady-seconds", type=float, default=30.0, help="run the real daemon this long per size; 0 skips (default 30)")
    add("--scrape-every", type=float, default=5.0, help="seconds between /metrics scrapes in the steady run (default 5)")
    add("--json", type=Path, help="also write the raw figures to this file")
    # The worker: the specwatch side, in a process of its own so its CPU clock counts only specwatch.
    parser.add_argument("--worker", choices=("cycles", "steady"), help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--fleet-url", help=argparse.SUPPRESS)
    parser.add_argument("--keepalive", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return worker_main(args)
    raise_fd_limit()
    started = time.monotonic()
    results = measure(args)
    print(f"specwatch benchmark: simulated fleet latency {args.latency_ms:g} ms, {args.spec_share:.0%} speculating, "
          f"keep-alive timeout {args.keepalive_timeout:g} s; {os.cpu_count()} CPUs; took {time.monotonic() - started:.0f} s")
    print(render_tables(results, args))
    if args.json:
        args.json.write_text(json.dumps({"cycles": [c.__dict__ for c in results.cycles],
                                         "footprints": [f.__dict__ for f in results.footprints],
                                         "steady": results.steady}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
