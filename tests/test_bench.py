"""The benchmarks in bench/ still run: each one's --help, in a process of its own (tests never import bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.real
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_starts_and_explains_itself(script: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"bench.{script}", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and f"bench.{script}" in done.stdout
