"""What canaries cost a steady llama-server, and how soon a restart or reload with speculation is caught, at the defaults.

Starts real llama-servers (the generated cycle model, `--metrics` on each) and the real `specwatch run` with a
config that names the servers and nothing else, so every interval, timeout, token count and endpoint is the
default. Then, at the same time:

- steady cost: every steady server's own `llamacpp:tokens_predicted_total` and `llamacpp:prompt_tokens_total`,
  sampled every half second once its first full round is over. Each rise of the counter is one canary. Tokens per
  server-hour = the tokens of the canaries after the first in the window, divided by the time from the first to
  the last, times 3600 (whole canary periods, so a window of a few minutes extrapolates without a phase error).
  Nothing else sends these servers a generating request: the benchmark only reads their /metrics.
- detection latency: from the moment a changed server answers /health (for a router model: the moment /models
  lists it loaded again) to the first scrape of specwatch in which specwatch_verdict{verdict="fill_ins"} is 1.
  Each repetition waits a random part of a poll interval first, so the change falls anywhere in the poll cycle,
  and ends by changing back to a plain server and waiting for "clean" (the "cleared" row).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specwatch.demo.llamaserver import LlamaServer, free_port
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.settings.schema import Settings
from tests.support.metrics import Samples, find, parse
from tests.support.router import PREDICTED, PROMPT, Router, answers, counters
from tests.support.waiting import wait_until

SPECULATION: dict[str, list[str]] = {
    "draft-simple": ["-md", "{model}", "--spec-type", "draft-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
}
STEADY: dict[str, list[str]] = {
    "steady-plain": [],
    "steady-plain-no-slots": ["--no-slots"],
    "steady-draft-simple": SPECULATION["draft-simple"],
    "steady-ngram-mod": SPECULATION["ngram-mod"],
}
VERDICTS = ("clean", "fill_ins", "unproven", "unchecked")


def _args(template: list[str], model: Path) -> list[str]:
    return [a.replace("{model}", str(model)) for a in template]


class Scraper(threading.Thread):
    """Scrapes specwatch's /metrics every `every` seconds; waiters see each scrape with the time it was answered."""

    def __init__(self, url: str, every: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.url, self.every = url, every
        self.latest: tuple[float, Samples] = (0.0, {})
        self.changed = threading.Condition()
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stopping.is_set():
                try:
                    samples = parse(client.get(self.url).text)
                except httpx.HTTPError:
                    samples = {}
                with self.changed:
                    self.latest = (time.monotonic(), samples)
                    self.changed.notify_all()
                self.stopping.wait(self.every)

    def wait(self, condition: Callable[[Samples], bool], *, after: float, timeout: float) -> float | None:
        """The time of the first scrape answered after `after` that meets `condition`; None on timeout."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                at, samples = self.latest
                if at > after and samples and condition(samples):
                    return at
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.changed.wait(min(remaining, 1.0))


def verdict(samples: Samples, server: str) -> str | None:
    on = [v for v in VERDICTS if find(samples, "specwatch_verdict", server=server, verdict=v) == 1]
    return on[0] if len(on) == 1 else None


@dataclass
class Steady:
    name: str
    server: LlamaServer
    rises: list[tuple[float, float, float]] = field(default_factory=list)
    """(monotonic time, predicted tokens, prompt tokens) of each rise of the counters after the first full round."""

    def per_hour(self) -> tuple[float, float, int, float] | None:
        """(generated, prompt) tokens per hour over whole canary periods, canaries counted, seconds covered."""
        if len(self.rises) < 3:
            return None
        span = self.rises[-1][0] - self.rises[0][0]
        predicted = sum(r[1] for r in self.rises[1:])
        prompt = sum(r[2] for r in self.rises[1:])
        return predicted * 3600 / span, prompt * 3600 / span, len(self.rises) - 1, span


def watch_steady(steady: list[Steady], scraper: Scraper, periods: int, stop: threading.Event) -> None:
    """Record each steady server's counter rises after its first full round, until each has `periods` whole canary
    periods (periods + 1 canaries)."""
    for item in steady:
        if scraper.wait(lambda s, n=item.name: verdict(s, n) not in (None, "unchecked"), after=0.0, timeout=120) is None:
            raise TimeoutError(f"no verdict on the steady server {item.name}")
    last = {item.name: counters(item.server.url) for item in steady}
    quiet_since = {item.name: time.monotonic() for item in steady}
    started: set[str] = set()
    while not stop.is_set():
        now = time.monotonic()
        for item in steady:
            found = counters(item.server.url)
            rise = (found[PREDICTED] - last[item.name][PREDICTED], found[PROMPT] - last[item.name][PROMPT])
            last[item.name] = found
            if rise[0] or rise[1]:
                # The first full round (and its second pass, if any) ends in a burst; the window opens at the first
                # canary after five quiet seconds.
                if item.name in started or now - quiet_since[item.name] >= 5:
                    started.add(item.name)
                    item.rises.append((now, *rise))
                quiet_since[item.name] = now
        if all(len(item.rises) > periods for item in steady):
            return
        stop.wait(0.5)


@dataclass
class Case:
    name: str
    change: Callable[[], float]
    """Make the change; the monotonic time the changed server (model) answers."""
    restore: Callable[[], float]
    server: str
    caught: list[float | None] = field(default_factory=list)
    cleared: list[float | None] = field(default_factory=list)


def run_case(case: Case, scraper: Scraper, repetitions: int, poll_interval: float, timeout: float,
             errors: list[str], stop: threading.Event) -> None:
    try:
        if scraper.wait(lambda s: verdict(s, case.server) == "clean", after=0.0, timeout=120) is None:
            raise TimeoutError(f"{case.name}: the plain server never came out clean")
        for _ in range(repetitions):
            if stop.wait(random.uniform(0, poll_interval)):  # anywhere in the poll cycle
                return
            answered = case.change()
            at = scraper.wait(lambda s: verdict(s, case.server) == "fill_ins", after=answered, timeout=timeout)
            case.caught.append(None if at is None else at - answered)
            if stop.wait(random.uniform(0, poll_interval)):
                return
            answered = case.restore()
            at = scraper.wait(lambda s: verdict(s, case.server) == "clean", after=answered, timeout=timeout)
            case.cleared.append(None if at is None else at - answered)
    except Exception as err:  # noqa: BLE001 - reported with the table; the other cases run on
        errors.append(f"{case.name}: {err.__class__.__name__}: {err}")


def restart_case(name: str, extra: list[str], model: Path, workdir: Path) -> tuple[Case, str, Callable[[], None]]:
    """A plain server watched as `name`, restarted on its own address with `extra` and back; the case, its URL, a stop."""
    holder = [LlamaServer(model, ["--metrics"], log_dir=workdir).start()]
    port = holder[0].port

    def restart(args: list[str]) -> float:
        holder[0].stop()
        holder[0] = LlamaServer(model, ["--metrics", *args], port=port, log_dir=workdir).start()
        return time.monotonic()  # start() returns at the first /health 200 (it asks every 50 ms)

    case = Case(f"plain restarted with {name.removeprefix('restart-')}", lambda: restart(_args(extra, model)),
                lambda: restart([]), server=name)
    return case, holder[0].url, lambda: holder[0].stop()


@contextlib.contextmanager
def specwatch(config: Path, workdir: Path) -> Iterator[str]:
    port = free_port()
    log = workdir / "specwatch.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                                      os.environ.get("PYTHONPATH")]))}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "specwatch", "run", "--config", str(config),
                                    "--listen", f"127.0.0.1:{port}", "--log-format", "json"],
                                   stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_until("specwatch ready", lambda: answers(f"http://127.0.0.1:{port}/-/ready"), timeout=30, interval=0.2)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        process.terminate()
        process.wait(10)


def spread(values: list[float | None]) -> str:
    """min, median and max of the values measured, and how many were missed."""
    found = [v for v in values if v is not None]
    missed = len(values) - len(found)
    if not found:
        return f"{'-':>7} {'-':>7} {'-':>7}  missed {missed}/{len(values)}"
    text = f"{min(found):>7.1f} {statistics.median(found):>7.1f} {max(found):>7.1f}"
    return text + (f"  missed {missed}/{len(values)}" if missed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.canary_economy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=5, help="changes per detection case (default 5)")
    parser.add_argument("--periods", type=int, default=3,
                        help="whole canary periods to count on each steady server after its first round (default 3)")
    parser.add_argument("--cases", default="draft-simple,ngram-mod,ngram-map-k,router",
                        help="detection cases (default: draft-simple,ngram-mod,ngram-map-k,router)")
    parser.add_argument("--json", type=Path, help="also write every measured value to this file (to pool several runs)")
    args = parser.parse_args(argv)
    defaults = Settings(servers=[{"name": "x", "url": "http://127.0.0.1:1"}])
    began, wall = datetime.datetime.now(datetime.UTC), time.monotonic()
    print(f"specwatch canary economy, {began:%Y-%m-%d %H:%M} UTC, {os.cpu_count()} CPUs")
    print(f"defaults: poll_interval {defaults.poll_interval:g}s, canary_interval {defaults.canary_interval:g}s, "
          f"canary_tokens {defaults.canary_tokens}, canary_tokens_speculating {defaults.canary_tokens_speculating}, "
          f"endpoints {','.join(e.value for e in defaults.canary_endpoints)}")
    cases_wanted = args.cases.split(",")
    with tempfile.TemporaryDirectory(prefix="specwatch-economy-") as tmp:
        workdir = Path(tmp)
        model = write_cycle_model(workdir / "cycle.gguf")
        stops: list[Callable[[], None]] = []
        try:
            steady = [Steady(name, LlamaServer(model, ["--metrics", *_args(extra, model)], log_dir=workdir).start())
                      for name, extra in STEADY.items()]
            stops += [item.server.stop for item in steady]
            cases: list[Case] = []
            servers = [(item.name, item.server.url) for item in steady]
            for name in cases_wanted:
                if name == "router":
                    router = Router(model, workdir).start()
                    stops.append(router.stop)
                    router.load()
                    cases.append(Case("router model reloaded with draft-simple",
                                      lambda r=router: r.reload_with(_args(SPECULATION["draft-simple"], model)),
                                      lambda r=router: r.reload_with([]), server="router"))
                    servers.append(("router", router.url))
                else:
                    case, case_url, stop_case = restart_case(f"restart-{name}", SPECULATION[name], model, workdir)
                    stops.append(stop_case)
                    cases.append(case)
                    servers.append((case.server, case_url))
            config = workdir / "specwatch.yml"
            config.write_text("servers:\n" + "".join(f"  - {{name: {n}, url: '{u}'}}\n" for n, u in servers))
            with specwatch(config, workdir) as url:
                scraper = Scraper(url)
                scraper.start()
                errors: list[str] = []
                stop = threading.Event()
                threads = [threading.Thread(target=run_case, args=(c, scraper, args.repetitions, defaults.poll_interval,
                                                                    120.0, errors, stop)) for c in cases]
                for thread in threads:
                    thread.start()
                try:
                    watch_steady(steady, scraper, args.periods, stop)
                    for thread in threads:
                        thread.join()
                finally:
                    stop.set()  # an interrupted run stops its cases after the step in hand
                    for thread in threads:
                        thread.join()
                    scraper.stopping.set()
                generated = {item.name: find(scraper.latest[1], "specwatch_canary_generated_tokens_total", server=item.name)
                             for item in steady}
        finally:
            for stop_one in stops:
                stop_one()
    print()
    print("Steady servers: canary tokens per server-hour, from each server's own /metrics")
    print(f"{'server':<26}{'generated/h':>12}{'prompt/h':>10}{'canaries':>10}{'over s':>8}  specwatch counted")
    for item in steady:
        found = item.per_hour()
        if found is None:
            print(f"{item.name:<26}  too few canaries to measure ({len(item.rises)})")
            continue
        per_hour, prompt, count, span = found
        print(f"{item.name:<26}{per_hour:>12.0f}{prompt:>10.0f}{count:>10}{span:>8.0f}  "
              f"{generated[item.name]:.0f} generated since start")
    print()
    print("Detection: seconds from the changed server answering /health (router: model listed loaded) to "
          "specwatch_verdict fill_ins")
    print(f"{'case':<42}{'min':>7} {'median':>7} {'max':>7}")
    for case in cases:
        print(f"{case.name:<42}{spread(case.caught)}")
        print(f"{'  back to plain, until clean':<42}{spread(case.cleared)}")
    for error in errors:
        print(f"error: {error}")
    print()
    print(f"{args.repetitions} repetitions per case; took {time.monotonic() - wall:.0f}s")
    if args.json:
        args.json.write_text(json.dumps({
            "steady": {item.name: dict(zip(("generated_per_hour", "prompt_per_hour", "canaries", "seconds"),
                                           item.per_hour() or (), strict=False)) for item in steady},
            "cases": {case.name: {"caught": case.caught, "cleared": case.cleared} for case in cases},
            "errors": errors,
        }, indent=2), encoding="utf-8")
    return 1 if errors or any(v is None for c in cases for v in c.caught) else 0


if __name__ == "__main__":
    sys.exit(main())
