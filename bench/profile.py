"""Where a process spends its CPU, by component: a py-spy sample split by the module each stack frame comes from."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PY_SPY = "py-spy"
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_LIBRARIES = ("uvloop", "aiohttp", "multidict", "yarl", "propcache", "aiohappyeyeballs", "httpx", "httpcore", "h11", "anyio",
              "apscheduler", "structlog", "pydantic", "prometheus_client", "tzlocal")
"""Named on their own: the HTTP client and what it is built on (aiohttp, its headers, URLs and connection racing; httpx
for bench/request_cpu.py's arm), and the design card's other libraries."""
_STDLIB = {"asyncio": "asyncio/socket", "selectors.py": "asyncio/socket", "socket.py": "asyncio/socket",
           "ssl.py": "asyncio/socket", "json": "json", "gzip.py": "gzip", "logging": "logging", "threading.py": "threads",
           "dataclasses.py": "dataclasses", "copy.py": "dataclasses", "datetime.py": "datetime", "re": "re"}


def available() -> str | None:
    """The py-spy command, or None when it is not installed (`pip install py-spy`)."""
    return shutil.which(PY_SPY)


def record(pid: int, seconds: float, output: Path, *, rate: int = 100) -> subprocess.Popen[bytes]:
    """Start sampling `pid` for `seconds` into `output` (collapsed stacks), without pausing it: idle threads left out."""
    command = [PY_SPY, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(rate),
               "--nonblocking", "--full-filenames", "--format", "raw", "--output", str(output)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def component(path: str) -> str:
    """The component a frame's file belongs to: specwatch's module, a library, or a part of the standard library."""
    parts = Path(path).parts
    if "specwatch" in parts or "exporter" in parts:
        at = parts.index("specwatch") if "specwatch" in parts else parts.index("exporter")
        inner = [p.removesuffix(".py") for p in parts[at + 1 :]]
        if inner and inner[0] == "daemon" and len(inner) > 1 and inner[1] == "exposition":
            return "specwatch.daemon.exposition"
        return ".".join(["specwatch", *inner])
    if "site-packages" in parts:
        package = parts[parts.index("site-packages") + 1]
        return package if package in _LIBRARIES else "other libraries"
    for part in reversed(parts):
        if part in _STDLIB:
            return _STDLIB[part]
    return "python, other"


@dataclass
class Split:
    """Samples by component: `own` counts a sample once, for the component of its innermost frame; `inclusive` counts
    it for every component with a frame on its stack."""

    samples: int
    own: Counter[str]
    inclusive: Counter[str]


def split(lines: Iterable[str]) -> Split:
    """The split of py-spy's raw output ("frame;frame;... count" per line, outermost first)."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        found = [component(m.group("file")) for frame in stack.split(";") if (m := _FRAME.match(frame))]
        if not found:
            continue
        n = int(count)
        total += n
        own[found[-1]] += n
        for name in set(found):
            inclusive[name] += n
    return Split(total, own, inclusive)


def table(result: Split, *, top: int = 16) -> list[str]:
    if not result.samples:
        return ["no samples"]
    lines = [f"{'component':<34} {'own %':>6} {'inclusive %':>11}"]
    for name, count in result.own.most_common(top):
        lines.append(f"{name:<34} {100 * count / result.samples:>6.1f} {100 * result.inclusive[name] / result.samples:>11.1f}")
    for name in ("httpx", "httpcore", "apscheduler", "specwatch.core.state", "specwatch.daemon.exposition"):
        if name not in dict(result.own.most_common(top)) and result.inclusive[name]:
            lines.append(f"{name:<34} {100 * result.own[name] / result.samples:>6.1f} "
                         f"{100 * result.inclusive[name] / result.samples:>11.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("raw", type=Path, help="py-spy's collapsed stacks (py-spy record --format raw, or the "
                                               "benchmark's --profile-raw FILE)")
    parser.add_argument("--top", type=int, default=16, help="components shown (default 16)")
    args = parser.parse_args(argv)
    with args.raw.open(encoding="utf-8") as raw:
        print("\n".join(table(split(raw), top=args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
