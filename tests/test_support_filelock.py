"""The test rig's one file lock: a second process waits for it, and a bounded wait fails naming the lock."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.filelock import held

pytestmark = pytest.mark.real  # a second process holds the lock

HOLD = "import sys, time; from pathlib import Path; from tests.support.filelock import held\n" \
       "with held(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(float(sys.argv[2]))\n"


def _holder(path: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    return holder


def test_a_second_process_waits_until_the_first_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "x.lock"  # its directory is made
    holder = _holder(path, 1.0)
    started = time.monotonic()
    with held(path):
        waited = time.monotonic() - started
    holder.wait(timeout=30)
    assert waited >= 0.5


def test_a_bounded_wait_fails_naming_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    holder = _holder(path, 30.0)
    try:
        with pytest.raises(AssertionError, match=f"another test run held {path} for 1s"), held(path, timeout=1):
            pass
    finally:
        holder.kill()
        holder.wait()
    with held(path, timeout=1):  # a holder killed let go with it
        pass
