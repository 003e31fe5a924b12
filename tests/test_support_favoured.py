"""The rigs that go first for a CPU: one at a time across the run's workers, and nested use within one never blocks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.process import favoured
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]

HOLDER = """
import sys, time
from tests.support.process import favoured
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
