"""Child processes for tests: `specwatch run` with its output kept, any command logging to a file, and waiting on them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.net import HOST
from tests.support.waiting import wait_until

HANG = 600.0
"""A subprocess timeout that catches a hang and nothing else: on a starved machine a command of seconds took minutes."""


def _stop_group(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM to the child's process group, SIGKILL if it lingers, then SIGKILL for anything the leader left behind."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class ExporterProcess:
    """`specwatch run` as a real process on a free loopback port, its stdout and stderr kept for inspection."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        command = [sys.executable, "-m", "specwatch", "run", "--listen", f"{HOST}:0", "--log-format", "json", *args]
        self.process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.port = 0
        self._readers = [threading.Thread(target=self._collect, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _collect(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def events(self) -> list[dict[str, Any]]:
        found = []
        for line in list(self.stdout):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict):
                    found.append(event)
        return found

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def wait_started(self, timeout: float = 20.0) -> ExporterProcess:
        def listening() -> str | None:
            return next((e["listen"] for e in self.events() if e.get("event") == "started"), None)

        try:
            listen = wait_until("specwatch to start", listening, timeout=timeout, alive=self.process)
        except AssertionError as err:
            raise AssertionError(f"{err}; its output:\n{self.output()}") from None
        self.port = int(listen.rsplit(":", 1)[1])
        return self

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{HOST}:{self.port}"

    def signal(self, number: int) -> None:
        self.process.send_signal(number)

    def stop(self) -> int:
        if self.process.poll() is None:
            _stop_group(self.process, 10)
        # A reader ends with its pipe; once it has, every line is in and the pipe can be closed.
        for reader, stream in zip(self._readers, (self.process.stdout, self.process.stderr), strict=True):
            reader.join(5)
            if stream is not None and not reader.is_alive():
                stream.close()
        return self.process.returncode

    def __enter__(self) -> ExporterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Process:
    """A child in its own process group, logging to a file; stop() ends the whole group."""

    def __init__(self, name: str, command: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.command = [str(c) for c in command]
        self.log_path = log_dir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        return self

    def exited(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            _stop_group(proc, timeout)

    def kill(self) -> None:
        """SIGKILL the whole group at once, as the OOM killer or a node loss would: no shutdown code runs."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass(frozen=True)
class Measured:
    """A Python module run to its end: exit status, output, wall time and its peak RSS."""

    returncode: int
    stdout: bytes
    seconds: float
    peak_rss: int
    """Bytes: VmHWM of the process as it exits. Not getrusage's ru_maxrss, which counts the parent's pages the child
    held between fork and exec (and so the test runner's size)."""


# Runs a module as `python -m` does and reports VmHWM, from /proc/self/status, as it exits.
_PEAK_WRAPPER = """\
import atexit, runpy, sys
def peak():
    with open('/proc/self/status') as status:
        kib = next(line for line in status if line.startswith('VmHWM:')).split()[1]
    sys.stderr.write(f'\\npeak-rss-kib {kib}\\n')
atexit.register(peak)
module = sys.argv.pop(1)
runpy.run_module(module, run_name='__main__', alter_sys=True)
"""


def run_measured(module: str, args: Sequence[str], *, cwd: Path | str | None = None, timeout: float = 600) -> Measured:
    """`python -m MODULE ARGS`, measured."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", _PEAK_WRAPPER, module, *args], capture_output=True, cwd=cwd, timeout=timeout)
    seconds = time.monotonic() - started
    marks = [line for line in result.stderr.decode(errors="replace").splitlines() if line.startswith("peak-rss-kib ")]
    if not marks:
        raise RuntimeError(f"python -m {module} reported no peak RSS: {result.stderr[-2000:]!r}")
    return Measured(result.returncode, result.stdout, seconds, int(marks[-1].split()[1]) * 1024)


def check_json(*args: str, timeout: float = HANG) -> tuple[int, dict[str, Any]]:
    """`specwatch check ARGS --json` as a user runs it: its exit code and its report."""
    done = subprocess.run([sys.executable, "-m", "specwatch", "check", *args, "--json"], capture_output=True, text=True,
                          timeout=timeout)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)
