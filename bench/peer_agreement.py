"""Replicas compared: how soon one that serves another file is reported, and false disagreements of a busy pool.

Two parts, each on its own with --only (the CPU of comparing is bench.peer_cpu's):

- latency: three real llama-servers under one alias (the generated cycle model, Q8_0) and the real `specwatch run`
  at the default intervals, tolerance and confirmations. One replica is restarted on its own address with another
  file: the same weights requantized to Q4_0 (its fingerprint differs), or a file of the very same name, shape and
  vocabulary whose cycle runs the other way (its fingerprint is the same; only its answers differ). Measured: from
  the moment the changed replica answers /health to the first scrape (every 0.2 s) in which
  specwatch_peer_agreement is 0 for it; then it is restarted on the pool's file and the time until it agrees again.
- busy: three replicas with 4 slots each, every one kept busy by --load concurrent requests all the time, watched at
  short intervals for --minutes; every scrape's specwatch_peer_agreement and largest difference are read. Target: no
  disagreement at all, and the largest difference measured against the default tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from bench.canary_economy import Scraper, specwatch, spread
from specwatch.core.peers import DEFAULT_CONFIRMATIONS, DEFAULT_TOLERANCE
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.settings.schema import DEFAULT_CANARY_INTERVAL, DEFAULT_POLL_INTERVAL
from tests.support.metrics import Samples, find, parse
from tests.support.replicas import ALIAS, requantize

POOL = ("eval-a", "eval-b", "eval-c")
CHANGED = "eval-c"


def agreement(samples: Samples, server: str) -> float | None:
    return find(samples, "specwatch_peer_agreement", server=server)


def _config(path: Path, servers: dict[str, str], extra: str = "") -> Path:
    lines = ["servers:", *(f"  - {{name: {name}, url: '{url}'}}" for name, url in servers.items())]
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path


def latency(work: Path, repetitions: int, timeout: float) -> tuple[dict[str, list[float | None]], list[str]]:
    plain = write_cycle_model(work / "cycle-q8_0.gguf", tensor_type="Q8_0")
    requantized = requantize(plain, work / "cycle-q4_0.gguf")
    # Same name, shape and words as the pool's file: only the order of the cycle differs, so only answers tell.
    (work / "other").mkdir(exist_ok=True)
    reversed_cycle = write_cycle_model(work / "other" / plain.name, tensor_type="Q8_0",
                                       cycle_words=("the", "mat", "a", "on", "sat", "cat"))
    servers = {name: LlamaServer(plain, ["-a", ALIAS], log_dir=work).start() for name in POOL}
    port = servers[CHANGED].port
    results: dict[str, list[float | None]] = {"requantized (fingerprint)": [], "same name, other weights (answers)": [],
                                              "back on the pool's file": []}
    errors: list[str] = []

    def restart(model: Path) -> float:
        servers[CHANGED].stop()
        servers[CHANGED] = LlamaServer(model, ["-a", ALIAS], port=port, log_dir=work).start()
        return time.monotonic()

    try:
        config = _config(work / "specwatch.yml", {name: s.url for name, s in servers.items()})
        with specwatch(config, work) as metrics:
            scraper = Scraper(metrics)
            scraper.start()
            agreed = scraper.wait(lambda s: all(agreement(s, n) == 1 for n in POOL), after=0.0, timeout=timeout)
            if agreed is None:
                return results, ["the pool never agreed"]
            for _ in range(repetitions):
                for case, model in (("requantized (fingerprint)", requantized),
                                    ("same name, other weights (answers)", reversed_cycle)):
                    time.sleep(random.uniform(0, DEFAULT_POLL_INTERVAL))  # anywhere in the poll cycle
                    answered = restart(model)
                    at = scraper.wait(lambda s: agreement(s, CHANGED) == 0, after=answered, timeout=timeout)
                    results[case].append(None if at is None else at - answered)
                    answered = restart(plain)
                    at = scraper.wait(lambda s: agreement(s, CHANGED) == 1, after=answered, timeout=timeout)
                    results["back on the pool's file"].append(None if at is None else at - answered)
            scraper.stopping.set()
    except Exception as err:  # noqa: BLE001 - reported with the table
        errors.append(f"{err.__class__.__name__}: {err}")
    finally:
        for server in servers.values():
            server.stop()
    return results, errors


def _load(url: str, stop: threading.Event, counted: list[int]) -> None:
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            try:
                client.post(f"{url}/completion", json={"prompt": "hello world " * 20, "n_predict": 64,
                                                       "temperature": 0.8, "cache_prompt": False})
                counted[0] += 1
            except httpx.HTTPError:
                continue


def busy(work: Path, minutes: float, load: int, interval: str) -> dict[str, object]:
    plain = write_cycle_model(work / "cycle-q8_0.gguf", tensor_type="Q8_0")
    servers = {name: LlamaServer(plain, ["-a", ALIAS], parallel=4, ctx_size=8192, log_dir=work).start() for name in POOL}
    stop = threading.Event()
    counted = [0]
    threads = [threading.Thread(target=_load, args=(s.url, stop, counted), daemon=True)
               for s in servers.values() for _ in range(load)]
    scrapes = disagreeing = 0
    largest = 0.0
    compared = False
    try:
        for thread in threads:
            thread.start()
        extra = f"poll_interval: {interval}\ncanary_interval: {interval}\n"
        with specwatch(_config(work / "specwatch.yml", {n: s.url for n, s in servers.items()}, extra), work) as metrics:
            deadline = time.monotonic() + minutes * 60
            with httpx.Client(timeout=10) as client:
                while time.monotonic() < deadline:
                    samples = parse(client.get(metrics).text)
                    scrapes += 1
                    for name in POOL:
                        value = agreement(samples, name)
                        compared |= value is not None
                        disagreeing += value == 0
                        difference = find(samples, "specwatch_peer_largest_difference", server=name)
                        largest = max(largest, difference or 0.0)
                    time.sleep(1.0)
    finally:
        stop.set()
        for server in servers.values():
            server.stop()
    return {"scrapes": scrapes, "disagreeing_samples": disagreeing, "compared": compared,
            "largest_difference": round(largest, 6), "load_requests": counted[0], "minutes": minutes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("latency", "busy"), action="append", help="run only these parts")
    parser.add_argument("--repetitions", type=int, default=3, help="changes per case (latency; default 3)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a change may take to show (default 600)")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the busy pool runs (default 10)")
    parser.add_argument("--load", type=int, default=3, help="concurrent requests per busy replica (default 3)")
    parser.add_argument("--interval", default="5s", help="poll and canary interval of the busy run (default 5s)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    parts = args.only or ["latency", "busy"]
    print(f"{os.cpu_count()} CPUs; defaults: poll {DEFAULT_POLL_INTERVAL:g}s, canary {DEFAULT_CANARY_INTERVAL:g}s, "
          f"tolerance {DEFAULT_TOLERANCE:g}, confirmations {DEFAULT_CONFIRMATIONS}")
    results: dict[str, object] = {}
    failed = False
    with tempfile.TemporaryDirectory(prefix="specwatch-peers-") as tmp:
        work = Path(tmp)
        if "latency" in parts:
            (work / "latency").mkdir()
            found, errors = latency(work / "latency", args.repetitions, args.timeout)
            results["latency"] = {"seconds": found, "errors": errors}
            print(f"{'seconds from /health to the change reported':<44} {'min':>7} {'median':>7} {'max':>7}")
            for case, values in found.items():
                print(f"{case:<44} {spread(values)}")
            failed |= bool(errors) or any(v is None for values in found.values() for v in values)
            for error in errors:
                print(f"error: {error}", file=sys.stderr)
        if "busy" in parts:
            (work / "busy").mkdir()
            results["busy"] = busy(work / "busy", args.minutes, args.load, args.interval)
            print(f"busy: {json.dumps(results['busy'])}")
            failed |= results["busy"]["disagreeing_samples"] != 0 or not results["busy"]["compared"]
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
