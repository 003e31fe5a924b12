"""The rigs that go first for a CPU: one at a time across a run's workers, ahead of everything else on the machine."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CPU_HIERARCHY = Path("/sys/fs/cgroup/cpu")
"""cgroup v1's cpu controller, as these machines and CI mount it."""
GROUP_PREFIX = "specwatch-favoured-"
SHARES = 10240
"""Ten times a default group's 1024: about what nice -10 weighs against nice 0 (9548 to 1024)."""


@dataclass
class Favour:
    """What favoured() got: the CPU group this thread runs in (or why none), its nice value, the wait for the others."""

    group: str | None
    refused: str
    """Why there is no CPU group, when there is none."""
    nice: int
    waited: float

    def report(self) -> str:
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        where = f"CPU group {self.group} at {SHARES} shares" if self.group else f"no CPU group ({self.refused})"
        return f"{where}, nice {self.nice}, waited {self.waited:.1f}s for the other rigs, load {load} on {os.cpu_count()} CPUs"


_depth = 0
"""How deep this process is in favoured(): a module fixture and a test of it may both ask."""
_depth_lock = threading.Lock()
_lock_file: IO[str] | None = None
"""Open, and locked, while _depth > 0."""


def _run() -> str:
    """The test run, shared by its workers (pytest-xdist names it), or this process without them."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())


def cpu_group(pid: int | str = "thread-self") -> str:
    """The cgroup v1 cpu group a process (or this thread) runs in, as a path from the hierarchy's top."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise FileNotFoundError("no cgroup v1 cpu controller")


def _join_group() -> tuple[Path | None, Path | None, str]:
    """Move this thread into the run's CPU group: (the group, the one it left, why not)."""
    name = f"{GROUP_PREFIX}{_run()}"
    try:
        left = CPU_HIERARCHY / cpu_group().lstrip("/")
        if left.name == name:  # favoured() within favoured(): already there
            return left, left, ""
        # Under the group it runs in, not at the top: a job confined to a cgroup stays inside its limits.
        group = left / name
        for stale in left.glob(f"{GROUP_PREFIX}*"):
            if stale != group:
                # Busy: another run's, in use. Swept between another run's mkdir and its join, that rig gets nice only.
                with contextlib.suppress(OSError):
                    stale.rmdir()
        group.mkdir(exist_ok=True)
        (group / "cpu.shares").write_text(str(SHARES))
        (group / "tasks").write_text(str(threading.get_native_id()))
    except OSError as err:
        return None, None, str(err)
    return group, left, ""


@contextlib.contextmanager
def favoured(nice: int = -10) -> Iterator[Favour]:
    """This thread, and the threads and processes it starts meanwhile, ahead of the machine's other work for a CPU.

    For a rig whose assertions are about time (cadence, timeouts of a healthy server): the suite's other workers and
    whatever else runs on the machine then cannot starve it into a false failure. A nice value alone does not do it
    where the kernel groups processes by session (autogroup, on these machines and CI): nice then weighs only within
    a session, and a llama-server started in a session of its own is a group of its own. A cgroup does: whatever is
    started from a member joins it, whatever its session. Only one rig at a time goes first: two would share the CPUs
    between them as equals, so one waits (a lock the run's workers share). Where a CPU group cannot be made, the nice
    value is what there is, and the Favour says so.
    """
    global _depth, _lock_file
    started = time.monotonic()
    with _depth_lock:
        if _depth == 0:
            _lock_file = (Path(tempfile.gettempdir()) / f"specwatch-favoured-{_run()}.lock").open("a")
            fcntl.flock(_lock_file, fcntl.LOCK_EX)  # released by the kernel too, should this worker die holding it
        _depth += 1
    waited = time.monotonic() - started
    before = os.getpriority(os.PRIO_PROCESS, 0)
    # On Linux the nice value and the cgroup are per thread (0 is this one); new threads and processes inherit both.
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    group, left, refused = _join_group()
    try:
        yield Favour(group.name if group else None, refused, os.getpriority(os.PRIO_PROCESS, 0), waited)
    finally:
        if left is not None and left != group:
            (left / "tasks").write_text(str(threading.get_native_id()))
        os.setpriority(os.PRIO_PROCESS, 0, before)
        with _depth_lock:
            _depth -= 1
            if _depth == 0 and _lock_file is not None:
                if group is not None:
                    with contextlib.suppress(OSError):  # a process the rig started still runs: the next rig sweeps it
                        group.rmdir()
                _lock_file.close()
                _lock_file = None
