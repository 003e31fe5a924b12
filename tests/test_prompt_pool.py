"""The peer probe's prompt pool as shipped: loaded once, the size the recordings count on, and what bench.prompt_pool
makes (its candidates and order; whether each was kept needs a server, so that is not asked here)."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from specwatch.probe.peerprobe import prompts

ROOT = Path(__file__).resolve().parent.parent


def test_the_pool_is_read_once_and_holds_distinct_ordinary_prompts() -> None:
    pool = prompts()
    assert prompts() is pool
    assert len(pool) >= 2500 and len(set(pool)) == len(pool)
    assert all(isinstance(p, str) and 4 <= len(p.split()) <= 25 for p in pool)


def test_the_pool_ships_in_the_package_and_stays_small() -> None:
    shipped = resources.files("specwatch.probe").joinpath("prompts.json")
    assert shipped.is_file() and len(shipped.read_bytes()) < 300_000


@pytest.mark.real
def test_the_shipped_pool_is_what_the_script_makes() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.prompt_pool", "--check"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith("ok")
