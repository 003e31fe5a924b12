"""How long after `specwatch run` is killed (SIGKILL) and started again every verdict is known, at the default intervals.

Starts real llama-servers (the generated cycle model): plain, plain with `--no-slots`, draft-simple, ngram-mod, and a
router with one loaded model; optionally a simulated fleet large enough that the first polls are spread over the poll
interval (`--simulated N`, N above max_concurrency). Then the real `specwatch run` with a config that names the servers
and nothing else, so every interval, timeout, canary size and endpoint is the default. Once every verdict is settled,
each repetition waits a random part of a poll interval (so the kill falls anywhere in the poll and canary cycle, a
canary possibly in flight), kills the exporter with SIGKILL, and starts it again on the same address. Measured from the
moment the new process is started, by scraping its /metrics every 0.2 s:

- ready: its /-/ready answers 200 (Prometheus can scrape it again);
- known: no verdict is `unchecked` any more;
- as before: every verdict is the one it was before the kill.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.canary_economy import Scraper, spread, verdict
from specwatch.demo.llamaserver import LlamaRouter, LlamaServer, free_port, router_preset
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.settings.schema import Settings
from tests.support.metrics import Samples
from tests.support.router import answers
from tests.support.simfleet import FleetOptions, SimFleetProcess
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
REAL: dict[str, list[str]] = {
    "plain": [],
    "plain-no-slots": ["--no-slots"],
    "draft-simple": ["-md", "{model}", "--spec-type", "draft-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
}
ROUTER_MODEL = "small"


@dataclass
class Repetition:
    killed_at_phase: float
    """Seconds into the poll interval at which the kill came (from the exporter's start)."""
    ready: float | None = None
    known: float | None = None
    as_before: float | None = None
    last_known: str = ""
    """The server whose verdict was known last."""
    per_server: dict[str, float] = field(default_factory=dict)


class Exporter:
    """`specwatch run` on a fixed address, killed with SIGKILL and started again."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.config, self.workdir = config, workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        with (self.workdir / "specwatch.log").open("ab") as out:
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "specwatch", "run", "--config", str(self.config), "--listen",
                 f"127.0.0.1:{self.port}", "--log-format", "json"], stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
        return self.started_at

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def verdicts(samples: Samples, names: list[str]) -> dict[str, str | None]:
    return {name: verdict(samples, name) for name in names}


def _known(samples: Samples, names: list[str]) -> bool:
    return all(v not in (None, "unchecked") for v in verdicts(samples, names).values())


@contextlib.contextmanager
def servers(workdir: Path, simulated: int) -> Iterator[dict[str, str]]:
    """The real servers (and the simulated fleet), as {name: url}, stopped on exit."""
    model = write_cycle_model(workdir / "cycle.gguf")
    started: list[LlamaServer] = []
    fleet: SimFleetProcess | None = None
    try:
        found: dict[str, str] = {}
        for name, template in REAL.items():
            server = LlamaServer(model, [a.replace("{model}", str(model)) for a in template], log_dir=workdir).start()
            started.append(server)
            found[name] = server.url
        router = LlamaRouter(router_preset(workdir / "preset.ini", {ROUTER_MODEL: ["--model", str(model)]}),
                             log_dir=workdir).start()
        started.append(router)
        router.load(ROUTER_MODEL)
        found["router"] = router.url
        if simulated:
            fleet = SimFleetProcess(FleetOptions(servers=simulated, latency_ms=20)).start()
            found.update({f"sim-{s.index:04d}": s.url for s in fleet.servers})
        yield found
    finally:
        if fleet is not None:
            fleet.stop()
        for server in started:
            server.stop()


def watch_restart(scraper: Scraper, before: dict[str, str | None], started: float,
                  timeout: float) -> tuple[dict[str, float], float | None]:
    """Seconds from `started` to the first scrape in which each server's verdict is known, and to the first in which
    every verdict is the one of `before`; every scrape is looked at, in order."""
    known: dict[str, float] = {}
    as_before: float | None = None
    seen, deadline = started, time.monotonic() + timeout
    with scraper.changed:
        while len(known) < len(before) or as_before is None:
            at, samples = scraper.latest
            if at > seen and samples:
                seen = at
                now = verdicts(samples, list(before))
                known.update({name: at - started for name, found in now.items()
                              if name not in known and found not in (None, "unchecked")})
                if as_before is None and now == before:
                    as_before = at - started
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            scraper.changed.wait(min(remaining, 1.0))
    return known, as_before


def run(repetitions: int, simulated: int, down: float, timeout: float) -> tuple[list[Repetition], list[str]]:
    defaults = Settings(servers=[{"name": "x", "url": "http://127.0.0.1:1"}])
    errors: list[str] = []
    results: list[Repetition] = []
    with tempfile.TemporaryDirectory(prefix="specwatch-restart-") as tmp, servers(Path(tmp), simulated) as fleet:
        workdir = Path(tmp)
        config = workdir / "specwatch.yml"
        config.write_text("servers:\n" + "".join(f"  - {{name: {n}, url: '{u}'}}\n" for n, u in fleet.items()))
        names = list(fleet)
        exporter = Exporter(config, workdir)
        scraper = Scraper(f"{exporter.url}/metrics")
        scraper.start()
        try:
            exporter.start()
            if scraper.wait(lambda s: _known(s, names), after=0.0, timeout=timeout) is None:
                raise TimeoutError("the first exporter never knew every verdict")
            # The first round's second pass (speculating servers with nothing drafted yet) may still change a verdict.
            time.sleep(defaults.poll_interval)
            before = verdicts(scraper.latest[1], names)
            for _ in range(repetitions):
                phase = random.uniform(0, defaults.poll_interval)
                time.sleep(phase)
                repetition = Repetition(killed_at_phase=(time.monotonic() - exporter.started_at) % defaults.poll_interval)
                exporter.kill()
                time.sleep(down)
                started = exporter.start()
                try:
                    wait_until("specwatch ready", lambda: answers(f"{exporter.url}/-/ready"), timeout=timeout)
                    repetition.ready = time.monotonic() - started
                except TimeoutError as err:
                    errors.append(str(err))
                repetition.per_server, repetition.as_before = watch_restart(scraper, before, started, timeout)
                if len(repetition.per_server) == len(names):
                    repetition.last_known = max(repetition.per_server, key=repetition.per_server.__getitem__)
                    repetition.known = repetition.per_server[repetition.last_known]
                if repetition.as_before is None:
                    errors.append(f"verdicts after a restart: {verdicts(scraper.latest[1], names)}, before: {before}")
                results.append(repetition)
                print(f"  restart {len(results)}: killed {repetition.killed_at_phase:4.1f}s into a poll interval; ready "
                      f"{repetition.ready or float('nan'):.1f}s, every verdict known {repetition.known or float('nan'):.1f}s "
                      f"(last: {repetition.last_known}), as before {repetition.as_before or float('nan'):.1f}s", flush=True)
        finally:
            scraper.stopping.set()
            exporter.stop()
    print(f"verdicts before the kills: {', '.join(f'{n} {v}' for n, v in before.items() if not n.startswith('sim-'))}"
          + (f", {simulated} simulated servers" if simulated else ""))
    return results, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.exporter_restart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5, help="kills and restarts (default 5)")
    parser.add_argument("--simulated", type=int, default=0,
                        help="add this many simulated servers (above max_concurrency, 64, the first polls are spread)")
    parser.add_argument("--down", type=float, default=1.0, help="seconds between the kill and the restart (default 1)")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up on a restart after this long (default 120)")
    args = parser.parse_args(argv)
    defaults = Settings(servers=[{"name": "x", "url": "http://127.0.0.1:1"}])
    began, wall = datetime.datetime.now(datetime.UTC), time.monotonic()
    print(f"specwatch exporter restart, {began:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs")
    print(f"defaults: poll_interval {defaults.poll_interval:g}s, canary_interval {defaults.canary_interval:g}s, "
          f"poll_timeout {defaults.poll_timeout:g}s, canary_timeout {defaults.canary_timeout:g}s, max_concurrency "
          f"{defaults.max_concurrency}, endpoints {','.join(e.value for e in defaults.canary_endpoints)}")
    results, errors = run(args.repetitions, args.simulated, args.down, args.timeout)
    print()
    print(f"Seconds from the restarted process's start ({args.down:g}s after the SIGKILL)")
    print(f"{'':<34}{'min':>7} {'median':>7} {'max':>7}")
    print(f"{'/-/ready answers':<34}{spread([r.ready for r in results])}")
    print(f"{'every verdict known':<34}{spread([r.known for r in results])}")
    print(f"{'every verdict as before the kill':<34}{spread([r.as_before for r in results])}")
    for name in (*REAL, "router"):
        print(f"{'  ' + name + ' known':<34}{spread([r.per_server.get(name) for r in results])}")
    if args.simulated:
        sims = [max((v for n, v in r.per_server.items() if n.startswith("sim-")), default=None) for r in results]
        print(f"{f'  last of {args.simulated} simulated known':<34}{spread(sims)}")
    for error in errors:
        print(f"error: {error}")
    print()
    print(f"{args.repetitions} restarts; took {time.monotonic() - wall:.0f}s")
    return 1 if errors or any(r.known is None for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
