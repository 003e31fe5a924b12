"""The rigs that go first for a CPU: ahead of other sessions, one at a time across the run's workers, never blocked by themselves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.favour import CPU_HIERARCHY, GROUP_PREFIX, cpu_group, favoured
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from tests.support.favour import favoured
with favoured():
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
    released = time.time()
print(f"released {released}", flush=True)
"""


def test_nested_favour_in_one_worker_does_not_wait_for_itself(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"nested-{tmp_path.name}")
    with favoured() as outer, favoured() as inner:
        assert outer.waited < 1 and inner.waited < 1
        assert inner.group == outer.group and cpu_group().count(GROUP_PREFIX) == (outer.group is not None)
        assert "waited" in inner.report() and "CPUs" in inner.report()


@pytest.mark.real
def test_a_second_worker_waits_until_the_first_rig_is_done(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"pair-{tmp_path.name}")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, "1.5"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with favoured() as favour:
            went = time.time()
        released = float(holder.communicate(timeout=10)[0].split()[-1])
        assert went >= released, f"this worker's rig went first {released - went:.2f}s before the other worker's ended"
        assert favour.waited > 0.5
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.real
def test_another_run_is_not_held_up(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"mine-{tmp_path.name}")
    other = subprocess.Popen([sys.executable, "-c", HOLDER, "30"], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                             env={**os.environ, "PYTEST_XDIST_TESTRUNUID": f"theirs-{tmp_path.name}"})
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        started = time.monotonic()
        with favoured() as favour:
            assert favour.waited < 5
        wait_until("the other run's rig to still be running", lambda: other.poll() is None, timeout=1)
        assert time.monotonic() - started < 5
    finally:
        other.kill()
        other.wait()


BURNER = """
import os, time
end = time.monotonic() + float(os.environ["BURN_SECONDS"])
while time.monotonic() < end:
    pass
used = os.times()
print(used.user + used.system, flush=True)
"""


def burner(cpu: int) -> subprocess.Popen[str]:
    """A CPU burner on one CPU, in a session of its own as the rigs' llama-servers are; it prints the CPU it got."""
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", BURNER], stdout=subprocess.PIPE,
                            text=True, start_new_session=True, env={**os.environ, "BURN_SECONDS": "1.5"})


@pytest.mark.real
def test_a_server_in_a_session_of_its_own_goes_first(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"groups-{tmp_path.name}")
    cpu, home = min(os.sched_getaffinity(0)), cpu_group()
    other, first = burner(cpu), None
    try:
        with favoured() as favour:
            assert favour.group == f"{GROUP_PREFIX}groups-{tmp_path.name}", favour.report()
            inside = f"{home.rstrip('/')}/{favour.group}"
            assert cpu_group() == inside, "the group is made under the one the thread ran in"
            first = burner(cpu)
            assert cpu_group(first.pid) == inside, "a server in a session of its own stays in the rig's group"
        got, theirs = float(first.communicate(timeout=20)[0]), float(other.communicate(timeout=20)[0])
        # As equals (a nice value does not reach across sessions) the two would get 0.7 s each; in the group, 5 to 1.
        assert got > 2 * theirs, f"the rig's server got {got:.2f}s of CPU, the other session {theirs:.2f}s"
        assert cpu_group() == home, "the thread is back where it was"
        with favoured():  # the group outlived the rig while its server ran; the run's next rig clears it
            pass
        assert not (CPU_HIERARCHY / inside.lstrip("/")).exists()
    finally:
        for process in (other, first):
            if process is not None:
                process.kill()
                process.wait()
