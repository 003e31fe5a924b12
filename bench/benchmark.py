"""Benchmark: specwatch and prometheus-blackbox-exporter on one simulated fleet: CPU per request, /metrics, memory."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import profile as bench_profile
from tests.support.loopback import STATS_PATH
from tests.support.net import free_port
from tests.support.simfleet import FleetOptions, SimFleetProcess, SimServer, build_config, raise_fd_limit, write_config

REPO = Path(__file__).resolve().parents[1]
BLACKBOX_PACKAGE = "prometheus-blackbox-exporter"
BLACKBOX_MODULE = "llama_props"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
POLL_PATHS = ("/health", "/props", "/slots", "/models", "/v1/models")
CANARY_TOKENS = 48
"""The issue's realistic canary: 48 tokens with logprobs, as bodies and as streams."""


def proc_cpu_seconds(pid: int, tid: int | None = None) -> float:
    """utime + stime of every thread of `pid` (or of its thread `tid`), from /proc/PID/stat."""
    text = Path(f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat").read_text()
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


PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
"""What Prometheus 2 sends (OpenMetrics first): the exporter chooses the format, as it does for a real scrape."""


def scrape(url: str, accept: str | None = PROMETHEUS_ACCEPT) -> tuple[float, int, int]:
    """(wall seconds, bytes on the wire, bytes uncompressed) of one /metrics scrape that accepts gzip: with Prometheus'
    Accept header, or with none (`accept=None`, a generic client such as curl --compressed)."""
    headers = {"Accept-Encoding": "gzip", **({"Accept": accept} if accept else {})}
    request = urllib.request.Request(url, headers=headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        body = answer.read()
        wall = time.perf_counter() - started
        plain = gzip.decompress(body) if answer.headers.get("Content-Encoding") == "gzip" else body
    return wall, len(body), len(plain)


def _requests(after: dict[str, Any], before: dict[str, Any]) -> tuple[int, int, int]:
    """(all requests, poll requests, new connections) the fleet saw between two readings of its stats."""
    total = after["requests"] - before["requests"]
    polls = sum(after["by_path"].get(p, 0) - before["by_path"].get(p, 0) for p in POLL_PATHS)
    return total, polls, after["connections"] - before["connections"]


@dataclass
class Row:
    """CPU for a number of requests the fleet served."""

    tool: str
    what: str
    servers: int
    wall: float
    cpu: float
    requests: int
    connections: int
    ok: str = ""
    every: float | None = None
    """Seconds after which this CPU recurs for every server (a poll cycle: poll_interval; the daemon: its window), so
    that it becomes a standing cost per watched server; None where it does not recur as measured (a canary cycle)."""

    @property
    def per_request_ms(self) -> float:
        return 1000 * self.cpu / self.requests if self.requests else float("nan")

    @property
    def per_server_minute_ms(self) -> float | None:
        """Milliseconds of CPU per watched server per minute: what a poll of fewer requests changes."""
        if self.every is None or not self.servers or self.every <= 0:
            return None
        return 1000 * self.cpu / self.servers * 60 / self.every


def core_per_thousand(ms_per_server_minute: float) -> float:
    """Share of one core (as a percentage) that 1,000 servers cost at this many ms of CPU per server-minute."""
    return 100 * ms_per_server_minute * 1000 / 60_000


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    sizes: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Per fleet size: the specwatch workers' raw figures and blackbox_exporter's footprint."""


# ---------------------------------------------------------------------------------------------
# specwatch, measured in worker processes of their own, so that process CPU counts specwatch alone


def _series_per_server(text: str, servers: int) -> float:
    per_server = sum(1 for line in text.splitlines() if line.startswith("specwatch_") and 'server="' in line)
    return per_server / servers if servers else 0.0


async def _worker_cycles(config: Path, fleet_url: str, keepalive: float) -> dict[str, Any]:
    """Poll and canary cycles over the whole fleet, driven through the daemon's own Watcher."""
    from specwatch.daemon.cadence import Round
    from specwatch.daemon.run import Daemon
    from specwatch.endpoints import Endpoint
    from specwatch.probe.canary import TABLE
    from specwatch.settings.loading import load_settings

    settings = load_settings(config)
    daemon = Daemon(config, settings)
    names = [s.config.name for s in daemon.fleet.snapshot()]
    out: dict[str, Any] = {"servers": len(names), "poll_interval": settings.poll_interval}
    with contextlib.suppress(ImportError):  # what Daemon.run() does once started, where the daemon does it
        from specwatch.daemon import memory

        memory.tune()

    async def cycle(run: Callable[[str], Any]) -> dict[str, Any]:
        before = fleet_stats(fleet_url)
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(run(name) for name in names))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        requests, _, connections = _requests(fleet_stats(fleet_url), before)
        return {"wall": wall, "cpu": cpu, "requests": requests, "connections": connections}

    def canaries(*endpoints: Endpoint) -> Callable[[str], Any]:
        plan = Round(endpoints, full=False, rotation=True)
        return lambda name: daemon.watcher.canary(name, "", plan)

    out["poll_first"] = await cycle(daemon.watcher.poll)
    # llama-server drops idle connections after its keep-alive timeout, shorter than any poll interval:
    # a production poll cycle always starts on new connections.
    await asyncio.sleep(keepalive + 0.5)
    out["poll_new"] = await cycle(daemon.watcher.poll)
    await asyncio.sleep(keepalive + 0.5)
    bodies = canaries(*(e for e in Endpoint if not TABLE[e].streaming))
    streams = canaries(*(e for e in Endpoint if TABLE[e].streaming))
    await cycle(bodies)  # connections opened and answers cached by the fleet: the cycles below are alike
    out["canary_bodies"] = await cycle(bodies)
    out["canary_streams"] = await cycle(streams)
    snapshot = daemon.fleet.snapshot()
    kinds = {s.config.name: s.config.labels.get("kind") == "speculating" for s in snapshot}
    out["verdicts_right"] = sum(1 for s in snapshot if s.model().serving_fill_ins == kinds[s.config.name])
    out["polled_ok"] = sum(1 for s in snapshot if s.poll_success)
    out["rss_mb"], out["peak_rss_mb"] = proc_memory_mb()
    await daemon.client.aclose()
    return out


def _record_scrapes(into: list[dict[str, float]]) -> None:
    """Times every /metrics answer in the HTTP thread that serves it: render, gzip and write, in thread CPU and wall."""
    from specwatch.daemon import web

    serve = web._Handler.do_GET

    def timed(handler: Any) -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        serve(handler)
        if handler.path.startswith("/metrics"):
            into.append({"at": time.monotonic(), "wall": time.perf_counter() - wall, "cpu": time.thread_time() - cpu})

    web._Handler.do_GET = timed  # type: ignore[method-assign]


def _thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread called `name` so far (0 if there is none)."""
    import threading

    for thread in threading.enumerate():
        if thread.name == name and thread.native_id is not None:
            return proc_cpu_seconds(os.getpid(), thread.native_id)
    return 0.0


FIRST_WINDOW = 80.0
"""Seconds after the start-up burst measured apart: the first peer-probe rounds fall in them."""


async def _settled(daemon: Any, limit: float) -> float:
    """Seconds until every server was polled and its first canary rounds ended (the start-up burst), at most `limit`."""
    started = time.monotonic()
    while time.monotonic() - started < limit:
        snapshot = daemon.fleet.snapshot()
        polled = all(s.poll_success is not None for s in snapshot)
        rounds_due = any(m.full_round_due for s in snapshot for m in s.models.values())
        if polled and not rounds_due and not daemon.watcher._rounds:
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def _worker_steady(config: Path, fleet_url: str, port: int, window: float, marks: Path) -> dict[str, Any]:
    """The real daemon on its real schedule: its CPU per request the fleet served over a window, and its /metrics."""
    from specwatch.daemon.run import Daemon
    from specwatch.settings.loading import load_settings

    served: list[dict[str, float]] = []
    _record_scrapes(served)
    settings = load_settings(config)
    daemon = Daemon(config, settings)
    runner = asyncio.create_task(daemon.run("127.0.0.1", port))
    out: dict[str, Any] = {"settle_s": await _settled(daemon, 180.0), "poll_interval": settings.poll_interval}
    # The first FIRST_WINDOW seconds after the start-up burst (every server's first poll and full canary round, the
    # fill-in verdict's own cost, as in every release): the peer probe's first rounds, spread over a canary_interval
    # after each member's full round, fall in them.
    first_cpu, first_stats, first_at = time.process_time(), fleet_stats(fleet_url), time.monotonic()

    async def first_window() -> None:
        await asyncio.sleep(max(0.0, first_at + FIRST_WINDOW - time.monotonic()))
        out["first_cpu"], out["first_wall"] = time.process_time() - first_cpu, time.monotonic() - first_at
        out["first_requests"] = _requests(fleet_stats(fleet_url), first_stats)[0]

    first = asyncio.create_task(first_window())
    (marks / "settled").write_text("start")
    # The first rotation canaries come a canary_interval after the start-up rounds, and every member's first peer round
    # within one after them: from then on the mix is steady.
    await asyncio.sleep(max(0.0, first_at + settings.canary_interval - time.monotonic()))
    (marks / "window").write_text("start")
    preparing = _thread_cpu("specwatch-metrics")  # /metrics rendered in the background, where the daemon does that
    before, started, cpu = fleet_stats(fleet_url), time.monotonic(), time.process_time()
    await asyncio.sleep(window)
    cpu, wall = time.process_time() - cpu, time.monotonic() - started
    out["window_preparing_cpu"] = _thread_cpu("specwatch-metrics") - preparing
    requests, polls, connections = _requests(fleet_stats(fleet_url), before)
    out.update(window_cpu=cpu, window_wall=wall, window_requests=requests, window_polls=polls, window_connections=connections,
               window_scrapes=[s for s in served if started <= s["at"] <= started + wall])
    out["rss_mb"], out["peak_rss_mb"] = proc_memory_mb()
    await first
    (marks / "over").write_text("over")
    while not (marks / "stop").exists():
        await asyncio.sleep(0.2)
    # After the memory readings: the decoded body and its lines are the benchmark's, not the daemon's.
    text = daemon.exposition.renderer.text().decode()
    snapshot = daemon.fleet.snapshot()
    out.update(servers=len(snapshot), polled_ok=sum(1 for s in snapshot if s.poll_success),
               series_per_server=_series_per_server(text, len(snapshot)), metrics_bytes=len(text.encode()),
               metrics_gzip_bytes=len(gzip.compress(text.encode(), compresslevel=1)))
    daemon.stop()
    await runner
    return out


def worker_main(args: argparse.Namespace) -> int:
    from specwatch.daemon import logs

    try:
        from specwatch import loop  # the daemon's loop, as `specwatch run` makes it
        run = loop.run
    except ImportError:  # a checkout from before exporter/loop.py (--specwatch)
        run = asyncio.run

    raise_fd_limit()
    logs.configure("info", json=True)  # the daemon's default level, so log cost is what production pays
    if args.switch_interval is not None:  # the daemon sets it in Daemon.run(): measured against another value
        import specwatch.daemon.run

        specwatch.daemon.run.SWITCH_SECONDS = args.switch_interval
    if args.worker == "cycles":
        result = run(_worker_cycles(args.config, args.fleet_url, args.keepalive))
    else:
        result = run(_worker_steady(args.config, args.fleet_url, args.port, args.window, args.marks))
    args.result.write_text(json.dumps(result), encoding="utf-8")
    return 0


def run_worker(mode: str, config: Path, workdir: Path, extra: Sequence[str], *, timeout: float,
               during: Callable[[subprocess.Popen[bytes]], None] | None = None, specwatch: Path | None = None) -> dict[str, Any]:
    """A worker process; `specwatch` names another checkout whose exporter package it measures (a before/after run)."""
    result = workdir / f"result-{mode}.json"
    result.unlink(missing_ok=True)
    log_path = workdir / f"specwatch-{mode}.log"
    # Not `-m`: that would put the working directory first on the path. The worker's code is this checkout's, so a
    # before/after run measures the same cycles; only the exporter package (imported by the worker functions, never
    # at import time) comes from `specwatch`.
    start = (f"import sys; sys.path[:0] = [{str(REPO)!r}]; from bench.benchmark import main; "
             f"assert 'specwatch' not in sys.modules; sys.path[:0] = {[str(specwatch)] if specwatch else []!r}; "
             "sys.exit(main(sys.argv[1:]))")
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", start, "--worker", mode, "--config", str(config), "--result", str(result), *extra],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=workdir, start_new_session=True,
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


def blackbox_cycle(blackbox: Blackbox, servers: Sequence[SimServer], concurrency: int, fleet_url: str) -> tuple[Row, int, int]:
    """One probe of every server: (CPU figures, successful probes, bytes of probe answers)."""
    before = fleet_stats(fleet_url)
    cpu = proc_cpu_seconds(blackbox.pid)
    wall = time.perf_counter()
    ok, size = asyncio.run(_probe_all(blackbox.url, servers, concurrency))
    wall = time.perf_counter() - wall
    cpu = proc_cpu_seconds(blackbox.pid) - cpu
    requests, _, connections = _requests(fleet_stats(fleet_url), before)
    return Row("blackbox", "probe /props", len(servers), wall, cpu, requests, connections), ok, size


# ---------------------------------------------------------------------------------------------
# the run




# ---------------------------------------------------------------------------------------------
# the run


def _config(path: Path, servers: Sequence[SimServer], args: argparse.Namespace, **extra: Any) -> Path:
    write_config(path, build_config(
        [s.as_dict() for s in servers], poll_interval=args.poll_interval, canary_interval=args.canary_interval,
        max_concurrency=args.max_concurrency, extra=extra,
    ))
    return path


def _row(what: str, size: int, figures: dict[str, Any], ok: str = "", every: float | None = None) -> Row:
    return Row("specwatch", what, size, figures["wall"], figures["cpu"], figures["requests"], figures["connections"], ok,
               every)


def _steady(config: Path, workdir: Path, fleet_url: str, args: argparse.Namespace, profile: Path | None = None) -> dict[str, Any]:
    """The daemon on its schedule, scraped by two scrapers from the end of its start-up rounds: Prometheus (its Accept
    header) and a generic client (no Accept), each every `--scrape-every` s, half an interval apart, as an HA pair of
    scrapers would; those in the window are kept. py-spy samples the window into `profile` when given."""
    port = free_port()
    marks = workdir / "marks"
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir()
    client: list[tuple[float, int, int]] = []
    generic: list[tuple[float, int, int]] = []
    spying: list[subprocess.Popen[bytes]] = []

    def drive(process: subprocess.Popen[bytes]) -> None:
        while not (marks / "settled").exists():
            if process.poll() is not None:
                return
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}/metrics"
        first = time.monotonic()
        scrapers: list[tuple[float, str | None, list[tuple[float, int, int]]]] = [
            (first, PROMETHEUS_ACCEPT, client), (first + args.scrape_every / 2, None, generic)]
        while not (marks / "over").exists() and process.poll() is None:
            if profile is not None and not spying and (marks / "window").exists():
                spying.append(bench_profile.record(process.pid, args.window, profile))
            scrapers.sort(key=lambda scraper: scraper[0])
            at, accept, kept = scrapers[0]
            if time.monotonic() < at:
                time.sleep(min(0.05, at - time.monotonic()))
                continue
            counted = (marks / "window").exists()
            with contextlib.suppress(OSError):
                answer = scrape(url, accept)
                if counted and not (marks / "over").exists():
                    kept.append(answer)
            scrapers[0] = (at + args.scrape_every, accept, kept)
        (marks / "stop").write_text("stop")

    extra = ["--fleet-url", fleet_url, "--port", str(port), "--window", str(args.window), "--marks", str(marks)]
    if args.switch_interval is not None:
        extra += ["--switch-interval", str(args.switch_interval)]
    result = run_worker("steady", config, workdir, extra, timeout=args.window + 400, during=drive, specwatch=args.specwatch)
    for spy in spying:
        _, errors = spy.communicate(timeout=60)
        if spy.returncode:
            print(f"py-spy failed ({spy.returncode}): {errors.decode(errors='replace')[-500:]}", file=sys.stderr)
    result["client_scrapes"], result["generic_scrapes"] = client, generic
    return result


def _steady_rows(size: int, steady: dict[str, Any], args: argparse.Namespace) -> list[Row]:
    """The daemon mix rows of one window: without the CPU of /metrics, and with it."""
    scraped = sum(s["cpu"] for s in steady["window_scrapes"]) + steady.get("window_preparing_cpu", 0.0)
    requests = steady["window_requests"]
    note = f"{steady['window_polls']} poll + {requests - steady['window_polls']} canary requests"
    return [
        Row("specwatch", "daemon mix, probes only", size, steady["window_wall"], steady["window_cpu"] - scraped, requests,
            steady["window_connections"], note, steady["window_wall"]),
        Row("specwatch", f"daemon mix + scrapes every {args.scrape_every:g}s", size, steady["window_wall"],
            steady["window_cpu"], requests, steady["window_connections"],
            f"{len(steady['window_scrapes'])} scrapes (two scrapers) and their rendering, {1000 * scraped:.0f} ms CPU",
            steady["window_wall"]),
    ]


def _blackbox_row(size: int, runs: Sequence[tuple[Row, int, int]], poll_interval: float) -> Row:
    """blackbox_exporter's probe cycles of one run, the median cycle's figures."""
    cycles = [r[0] for r in runs]
    per_probe = [c.per_request_ms for c in cycles]
    return Row(
        "blackbox", f"probe /props (median of {len(cycles)})", size,
        statistics.median(c.wall for c in cycles), statistics.median(c.cpu for c in cycles),
        round(statistics.median(c.requests for c in cycles)), round(statistics.median(c.connections for c in cycles)),
        f"{min(r[1] for r in runs)}/{size} ok; ms/probe {min(per_probe):.2f}-{max(per_probe):.2f}",
        poll_interval,  # as if Prometheus probed each server every poll_interval
    )


def _run_figures(run: dict[str, Any], size: int, poll_interval: float) -> dict[str, float]:
    """One run's CPU per watched server per poll interval (canaries included), and blackbox_exporter's per probe."""
    probe = _blackbox_row(size, run["blackbox"], poll_interval)
    out = {"blackbox_ms_per_probe": probe.per_request_ms, "load_start": run["load"][0], "load_end": run["load"][1]}
    steady = run.get("steady")
    if steady:
        scraped = sum(s["cpu"] for s in steady["window_scrapes"]) + steady.get("window_preparing_cpu", 0.0)
        polls = steady["servers"] * steady["window_wall"] / poll_interval  # server-polls in the window
        out.update(
            watch_ms=1000 * (steady["window_cpu"] - scraped) / polls,
            watch_and_scrapes_ms=1000 * steady["window_cpu"] / polls,
            metrics_ms=_median([1000 * wall for wall, _, _ in steady["client_scrapes"]]),
            metrics_generic_ms=_median([1000 * wall for wall, _, _ in steady.get("generic_scrapes", [])]),
        )
        out["ratio"] = out["watch_ms"] / out["blackbox_ms_per_probe"] if out["blackbox_ms_per_probe"] else float("nan")
        if "first_cpu" in steady:  # scrapes included: they are not told apart in the first window
            first_polls = steady["servers"] * steady["first_wall"] / poll_interval
            out["first_ms"] = 1000 * steady["first_cpu"] / first_polls
            out["first_ratio"] = out["first_ms"] / out["blackbox_ms_per_probe"] if out["blackbox_ms_per_probe"] else float("nan")
    return out


def _middle(runs: Sequence[dict[str, float]]) -> int:
    """The run whose ratio (or blackbox_exporter's CPU per probe, without a window) is the median: the one shown."""
    key = "ratio" if all("ratio" in r for r in runs) else "blackbox_ms_per_probe"
    order = sorted(range(len(runs)), key=lambda i: runs[i][key])
    return order[(len(order) - 1) // 2]


def measure(args: argparse.Namespace) -> Results:
    results = Results()
    blackbox_binary = find_or_install_blackbox()
    largest = max(args.sizes)
    workdir = Path(tempfile.mkdtemp(prefix="specwatch-bench-"))
    options = FleetOptions(servers=largest, base_port=args.base_port, spec_share=args.spec_share, latency_ms=args.latency_ms,
                           token_ms=args.token_ms, keepalive_timeout=args.keepalive_timeout, pool_size=args.pool_size)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    profiling = args.profile and args.window > 0 and bench_profile.available() is not None
    if args.profile and not profiling:
        say("py-spy is missing (pip install py-spy): no split by component, the figures are measured all the same")
    say(f"starting a simulated fleet of {largest} servers (latency {args.latency_ms:g} ms) ...")
    try:
        with SimFleetProcess(options) as fleet:
            fleet_url = fleet.servers[0].url
            blackbox = Blackbox(blackbox_binary, workdir).start()
            try:
                for size in args.sizes:
                    servers = fleet.servers[:size]
                    figures: dict[str, Any] = results.sizes.setdefault(size, {})
                    poll_interval = None
                    if not args.quick:
                        say(f"N={size}: specwatch poll and canary cycles ...")
                        config = _config(workdir / f"cycles-{size}.yaml", servers, args,
                                         canary_tokens=CANARY_TOKENS, canary_tokens_speculating=CANARY_TOKENS)
                        extra = ["--fleet-url", fleet_url, "--keepalive", str(args.keepalive_timeout)]
                        sw = figures["cycles"] = run_worker("cycles", config, workdir, extra, timeout=900,
                                                            specwatch=args.specwatch)
                        poll_interval = sw["poll_interval"]
                        ok = f"{sw['polled_ok']}/{size} up, {sw['verdicts_right']}/{size} verdicts right"
                        results.rows += [
                            _row("poll, new connections", size, sw["poll_new"],
                                 f"{sw['poll_new']['requests'] / size:.2f} requests per server", every=poll_interval),
                            _row(f"canary {CANARY_TOKENS} tokens, bodies", size, sw["canary_bodies"]),
                            _row(f"canary {CANARY_TOKENS} tokens, streams", size, sw["canary_streams"], ok),
                        ]
                    runs = []
                    for index in range(args.runs):
                        load = os.getloadavg()[0]
                        run: dict[str, Any] = {}
                        if args.window > 0:
                            say(f"N={size}, run {index + 1}/{args.runs}: specwatch daemon on its schedule, "
                                f"a {args.window:g} s window ...")
                            steady = run["steady"] = _steady(_config(workdir / f"steady-{size}.yaml", servers, args),
                                                             workdir, fleet_url, args)
                            poll_interval = steady["poll_interval"]
                        say(f"N={size}, run {index + 1}/{args.runs}: blackbox_exporter cycles ...")
                        blackbox_cycle(blackbox, servers, args.blackbox_concurrency, fleet_url)  # warm-up, not counted
                        run["blackbox"] = [blackbox_cycle(blackbox, servers, args.blackbox_concurrency, fleet_url)
                                           for _ in range(args.repeat)]
                        run["load"] = (load, os.getloadavg()[0])
                        runs.append(run)
                    if profiling:
                        # A window of its own: the sampling costs the sampled process CPU (about a quarter more at
                        # 100 Hz), which must not reach the figures above.
                        say(f"N={size}: a window sampled by py-spy, not counted in the figures ...")
                        sampled = workdir / f"profile-{size}.txt"
                        _steady(_config(workdir / f"steady-{size}.yaml", servers, args), workdir, fleet_url, args, sampled)
                        if sampled.exists():
                            if args.profile_raw:
                                shutil.copyfile(sampled, args.profile_raw)
                            with sampled.open(encoding="utf-8") as raw:
                                split = bench_profile.split(raw)
                            figures["profile"] = {"samples": split.samples, "own": dict(split.own),
                                                  "inclusive": dict(split.inclusive)}
                    figures["runs"] = [_run_figures(run, size, poll_interval or 15.0) for run in runs]
                    middle = runs[_middle(figures["runs"])]
                    if "steady" in middle:
                        figures["steady"] = middle["steady"]
                        results.rows += _steady_rows(size, middle["steady"], args)
                    results.rows.append(_blackbox_row(size, middle["blackbox"], poll_interval or 15.0))
                    figures["blackbox_rss_mb"], figures["blackbox_peak_rss_mb"] = proc_memory_mb(blackbox.pid)
                    figures["blackbox_probe_bytes"] = middle["blackbox"][-1][2]
            finally:
                blackbox.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return results


# ---------------------------------------------------------------------------------------------
# the tables


def _blackbox(results: Results, size: int) -> Row | None:
    return next((r for r in results.rows if r.servers == size and r.tool == "blackbox"), None)


def cpu_table(results: Results) -> list[str]:
    head = (f"{'N':>5}  {'tool':<9}  {'what':<32} {'wall s':>7} {'CPU s':>7} {'requests':>8} {'new conns':>9} "
            f"{'CPU ms/req':>10} {'vs blackbox':>11} {'ms/server/min':>13} {'%core/1k':>8}  note")
    lines = ["CPU per request the fleet served (specwatch: process CPU of its worker; blackbox_exporter: per /props probe),",
             "and per watched server: ms of CPU per server per minute and % of a core per 1,000 servers (a poll cycle",
             "recurs every poll_interval, the daemon's window is real time, blackbox_exporter as if probing every",
             "poll_interval)", head, "-" * (len(head) + 40)]
    for r in results.rows:
        probe = _blackbox(results, r.servers)
        ratio = f"{r.per_request_ms / probe.per_request_ms:>11.2f}" if probe and probe.requests and probe.cpu else f"{'':>11}"
        per_server = r.per_server_minute_ms
        standing = (f"{per_server:>13.2f} {core_per_thousand(per_server):>8.1f}" if per_server is not None
                    else f"{'':>13} {'':>8}")
        lines.append(f"{r.servers:>5}  {r.tool:<9}  {r.what:<32} {r.wall:>7.2f} {r.cpu:>7.3f} {r.requests:>8} "
                     f"{r.connections:>9} {r.per_request_ms:>10.3f} {ratio} {standing}  {r.ok}")
    return lines


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def metrics_table(results: Results) -> list[str]:
    head = (f"{'N':>5}  {'scrape median ms':>16} {'min-max':>11} {'handler CPU ms':>14} {'series/server':>13} "
            f"{'bytes/server':>12} {'gzip B/server':>13} {'body MB':>8}  {'RSS MB':>7} {'peak MB':>7}  {'blackbox RSS':>12}")
    lines = ["/metrics over HTTP with gzip, the scrapes in the window (Prometheus' Accept and a generic client's, each every",
             "--scrape-every s): wall time the client saw, CPU of the thread that served it; memory of the daemon",
             head, "-" * len(head)]
    for size, figures in results.sizes.items():
        steady = figures.get("steady")
        if not steady:
            continue
        walls = [1000 * wall for wall, _, _ in steady["client_scrapes"]]
        handler = [1000 * s["cpu"] for s in steady["window_scrapes"]]
        servers = steady["servers"] or 1
        lines.append(
            f"{size:>5}  {_median(walls):>16.1f} {min(walls, default=0):>5.0f}-{max(walls, default=0):<5.0f} "
            f"{_median(handler):>14.1f} {steady['series_per_server']:>13.1f} {steady['metrics_bytes'] / servers:>12.0f} "
            f"{steady['metrics_gzip_bytes'] / servers:>13.0f} {steady['metrics_bytes'] / 1e6:>8.2f}  "
            f"{steady['rss_mb']:>7.1f} {steady['peak_rss_mb']:>7.1f}  {figures.get('blackbox_rss_mb', 0):>10.1f} MB"
        )
    return lines


def readme_table(results: Results) -> list[str]:
    """The "Fleet scale" table of docs/operating.md: the medians over the runs."""
    lines = ["| servers | CPU per watched server per poll interval, canaries included | blackbox_exporter per probe | "
             "ratio | with its `/metrics` | first 80 s after the start-up burst: per poll interval, ratio | "
             "`/metrics` median: Prometheus / generic client | series per server | bytes per server | RSS |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for size, figures in results.sizes.items():
        runs, steady = figures.get("runs", []), figures.get("steady")

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return _median([r[key] for r in runs if key in r])

        tail = "- | - | - |"
        if steady:
            servers = steady["servers"] or 1
            tail = (f"{steady['series_per_server']:.0f} | {steady['metrics_bytes'] / servers:,.0f} "
                    f"({steady['metrics_gzip_bytes'] / servers:,.0f} gzipped) | {steady['rss_mb']:.0f} MB |")
        lines.append(f"| {size:,} | {med('watch_ms'):.2f} ms | {med('blackbox_ms_per_probe'):.2f} ms | {med('ratio'):.2f} | "
                     f"{med('watch_and_scrapes_ms'):.2f} ms | {med('first_ms'):.2f} ms, {med('first_ratio'):.2f} | "
                     f"{med('metrics_ms'):.0f} / {med('metrics_generic_ms'):.0f} ms | {tail}")
    return lines


def watched_table(results: Results) -> list[str]:
    """CPU per watched server per poll interval, canaries included, beside blackbox_exporter's per probe: every run."""
    head = (f"{'N':>5}  {'run':>6}  {'load avg':>9}  {'watch ms':>8} {'+ scrapes':>9} {'blackbox ms':>11} {'ratio':>6}  "
            f"{'first 80 s':>10} {'ratio':>6}  {'/metrics ms: Prometheus':>23} {'generic':>7}")
    lines = ["CPU per watched server per poll interval (daemon mix, canaries included; without and with its /metrics),",
             "beside blackbox_exporter's CPU per probe in the same run; ratio = watch / blackbox; /metrics: median wall",
             "time of a gzip scrape", head, "-" * len(head)]
    for size, figures in results.sizes.items():
        runs = figures.get("runs", [])
        for index, run in enumerate(runs, 1):
            lines.append(
                f"{size:>5}  {index:>6}  {run['load_start']:>4.1f}-{run['load_end']:<4.1f}  "
                f"{run.get('watch_ms', float('nan')):>8.3f} {run.get('watch_and_scrapes_ms', float('nan')):>9.3f} "
                f"{run['blackbox_ms_per_probe']:>11.3f} {run.get('ratio', float('nan')):>6.2f}  "
                f"{run.get('first_ms', float('nan')):>10.3f} {run.get('first_ratio', float('nan')):>6.2f}  "
                f"{run.get('metrics_ms', float('nan')):>23.1f} {run.get('metrics_generic_ms', float('nan')):>7.1f}")
        if len(runs) > 1:
            def med(key: str, runs: list[dict[str, float]] = runs) -> float:
                return _median([r[key] for r in runs if key in r])

            lines.append(
                f"{size:>5}  {'median':>6}  {'':>9}  {med('watch_ms'):>8.3f} {med('watch_and_scrapes_ms'):>9.3f} "
                f"{med('blackbox_ms_per_probe'):>11.3f} {med('ratio'):>6.2f}  {med('first_ms'):>10.3f} "
                f"{med('first_ratio'):>6.2f}  {med('metrics_ms'):>23.1f} {med('metrics_generic_ms'):>7.1f}")
    return lines


def profile_tables(results: Results) -> list[str]:
    lines: list[str] = []
    for size, figures in results.sizes.items():
        found = figures.get("profile")
        if found:
            split = bench_profile.Split(found["samples"], Counter(found["own"]), Counter(found["inclusive"]))
            lines += ["", f"N={size}: the daemon's CPU by component over a window of its own (py-spy, {split.samples} "
                          "samples at 100 Hz, idle threads left out)", *bench_profile.table(split)]
    return lines


def render_tables(results: Results) -> str:
    return "\n".join([*cpu_table(results), "", *metrics_table(results), "", *watched_table(results),
                      *profile_tables(results), "", "README:", *readme_table(results)])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.benchmark", description=__doc__)
    add = parser.add_argument
    add("--sizes", type=lambda t: [int(x) for x in t.split(",")], default=[1000],
        help="fleet sizes, comma-separated (default 1000)")
    add("--latency-ms", type=float, default=20.0, help="simulated server latency (default 20)")
    add("--token-ms", type=float, default=0.0, help="delay between a stream's events on the fleet (default 0)")
    add("--spec-share", type=float, default=0.2, help="share of speculating servers (default 0.2)")
    add("--pool-size", type=int, default=250,
        help="servers per pool reporting one model, each asked the peer probe and compared with its pool (default 250: "
             "a fleet of 1,000 is four models of 250 replicas each; 1: every server its own model, nothing compared)")
    add("--base-port", type=int, default=0, help="first fleet port; 0 picks free ports (default)")
    add("--keepalive-timeout", type=float, default=5.0, help="the fleet's idle keep-alive timeout (default 5, as llama-server)")
    add("--max-concurrency", type=int, default=None, help="specwatch max_concurrency (default: specwatch's own)")
    add("--blackbox-concurrency", type=int, default=64, help="/probe requests in flight (default 64)")
    add("--repeat", type=int, default=5, help="blackbox cycles, the median is shown (default 5; its CPU clock ticks at 10 ms)")
    add("--poll-interval", default="15s")
    add("--canary-interval", default="60s")
    add("--window", type=float, default=75.0,
        help="seconds the daemon is measured on its schedule, from a canary interval after its start; 0 skips "
             "(default 75: a canary interval and a poll interval, the period of one server's rotation canaries)")
    add("--scrape-every", type=float, default=15.0, help="seconds between /metrics scrapes during the window (default 15)")
    add("--runs", type=int, default=3,
        help="daemon windows, each followed by blackbox_exporter's cycles; the median run is shown (default 3)")
    add("--quick", action="store_true",
        help="only the daemon's windows and blackbox_exporter (no poll and canary cycles); one run unless --runs says")
    add("--no-profile", dest="profile", action="store_false",
        help="do not sample the daemon with py-spy (it samples the first run's window when py-spy is installed)")
    add("--profile-raw", type=Path, help="also keep py-spy's collapsed stacks in this file")
    add("--specwatch", type=Path, help="measure the exporter package of this directory instead (a before/after run)")
    add("--json", type=Path, help="also write the raw figures to this file")
    add("--switch-interval", type=float, default=None,
        help="the interpreter's switch interval the daemon runs with, to weigh its own (0.001) against Python's (0.005)")
    # The workers: the specwatch side, in processes of their own so their CPU clock counts only specwatch.
    for name, kind in (("--worker", str), ("--config", Path), ("--result", Path), ("--fleet-url", str), ("--marks", Path)):
        parser.add_argument(name, type=kind, help=argparse.SUPPRESS)
    parser.add_argument("--keepalive", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.quick and "--runs" not in (argv if argv is not None else sys.argv[1:]):
        args.runs = 1
    raise_fd_limit()
    started = time.monotonic()
    results = measure(args)
    pools = f"pools of {args.pool_size} replicas (peer probes on), " if args.pool_size > 1 else ""
    print(f"specwatch benchmark: simulated fleet latency {args.latency_ms:g} ms, {args.spec_share:.0%} speculating, {pools}"
          f"keep-alive timeout {args.keepalive_timeout:g} s; poll {args.poll_interval}, canary {args.canary_interval}; "
          f"{os.cpu_count()} CPUs; took {time.monotonic() - started:.0f} s")
    print(render_tables(results))
    if args.json:
        args.json.write_text(json.dumps({"rows": [r.__dict__ for r in results.rows], "sizes": results.sizes}, indent=2),
                             encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
