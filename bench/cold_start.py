"""How long the README's test command takes on a machine that has never run it, step by step.

Clones this repository's HEAD (what is committed, nothing else) into a new directory, makes a fresh virtual environment
there, points every cache the command fills at empty directories (XDG_CACHE_HOME: pip's, ccache's, specwatch's
llama.cpp builds, eval tools and Docker images; npm's), and runs the test command of .ci/run one `&&` step at a time,
with .ci/run's exports, as CI would. apt's packages are the machine's: `apt-get install` of packages already there
costs nothing, so the apt figure is a lower bound. Prints, for each step, its seconds and the machine's load average
meanwhile (other work inflates them) with the share of the CPUs left idle, and the split of the llama.cpp build from its
cache entry.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _command(ci: str) -> tuple[str, list[str]]:
    """.ci/run's exports, and its test command cut at each `&&`."""
    lines = ci.splitlines()
    exports = next(line for line in lines if line.startswith("export "))
    command = next(line for line in lines if line.startswith("apt-get update"))
    return exports, [step.strip() for step in command.split(" && ")]


def _cpu_ticks() -> tuple[int, int]:
    """The machine's idle (idle and iowait) and total CPU ticks so far, from /proc/stat's first line."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)


class LoadSampler:
    """/proc/loadavg's one-minute figure and the machine's CPU ticks every few seconds, in the background."""

    def __init__(self, every: float = 5.0) -> None:
        self.samples: list[tuple[float, float, tuple[int, int]]] = []
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            load = float(Path("/proc/loadavg").read_text().split()[0])
            self.samples.append((time.monotonic(), load, _cpu_ticks()))
            self._stop.wait(self._every)

    def between(self, start: float, end: float) -> str:
        # A step shorter than the sampling interval gets the sample taken last before it ended.
        before = [load for at, load, _ in self.samples if at <= end]
        values = [load for at, load, _ in self.samples if start <= at <= end] or before[-1:]
        return f"{sum(values) / len(values):.1f} (max {max(values):.1f})" if values else "-"

    def idle(self, start: float, end: float) -> str:
        """The share of the CPUs' time left idle between the samples nearest `start` and `end`."""
        inside = [ticks for at, _, ticks in self.samples if start <= at <= end]
        if len(inside) < 2:
            return "-"
        (idle0, total0), (idle1, total1) = inside[0], inside[-1]
        return f"{100 * (idle1 - idle0) / max(total1 - total0, 1):.0f}%"

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="an empty directory for the clone, the venv and the caches "
                                                  "(default: a new one under the system's temporary directory)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="specwatch-cold-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        parser.error(f"{work} is not empty: a cold start needs empty caches")
    clone, venv, cache = work / "clone", work / "venv", work / "cache"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", head.strip()], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv), CI="true",
               XDG_CACHE_HOME=str(cache), npm_config_cache=str(cache / "npm"))
    exports, steps = _command((clone / ".ci" / "run").read_text())
    log = work / "run.log"
    print(f"cold start of {head.strip()[:12]} in {work} (log: {log})", flush=True)
    with LoadSampler() as load, open(log, "w") as out:
        started = time.monotonic()
        for step in steps:
            begun = time.monotonic()
            out.write(f"$ {step}\n")
            out.flush()
            code = subprocess.run(["bash", "-c", f"{exports}; {step}"], cwd=clone, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False).returncode
            ended = time.monotonic()
            print(f"{ended - begun:8.1f} s  load {load.between(begun, ended):<16} idle {load.idle(begun, ended):>4}  "
                  f"{step[:80]}", flush=True)
            if step.startswith("python -m pytest"):
                # The tests' last quarter: CPUs left idle there are a tail of files that started late.
                print(f"          idle in its last quarter: {load.idle(ended - (ended - begun) / 4, ended)}", flush=True)
            if code != 0:
                print(f"exited {code}: see {log}", flush=True)
                return 1
        total = time.monotonic() - started
    print(f"{total:8.1f} s  total")
    for entry in sorted((cache / "specwatch").glob("llama-server-*/build.json")):
        built = json.loads(entry.read_text())
        seconds, targets = built["seconds"], " and ".join(built.get("targets", ["whole tree"]))
        print(f"          llama.cpp: wheel ({targets}) {seconds['wheel']} s, patched rebuild {seconds['patched']} s")
    summary = [line for line in log.read_text().splitlines() if " passed" in line or " failed" in line]
    print(f"          {summary[-1].strip('= ') if summary else 'no pytest summary'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
