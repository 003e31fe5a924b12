"""The benchmarks in bench/ still run: each one's --help, in a process of its own (tests never import bench)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.core.evidence import SHIPPED

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.real
@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_starts_and_explains_itself(script: str) -> None:
    done = subprocess.run([sys.executable, "-m", f"bench.{script}", "--help"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout and f"bench.{script}" in done.stdout


@pytest.mark.real
def test_the_profile_split_names_the_http_client_and_our_modules(tmp_path: Path) -> None:
    site = "/usr/lib/python3.11/site-packages"
    raw = tmp_path / "stacks.raw"
    raw.write_text(
        f"Fetcher._exchange (/src/exporter/probe/http/fetch.py:83);ClientSession._request ({site}/aiohttp/client.py:740) 3\n"
        f"_prepare_forever (/src/exporter/daemon/exposition/serve.py:260);TextRenderer._update "
        f"(/src/exporter/daemon/exposition/text.py:190) 2\n"
        f"start_connection ({site}/aiohappyeyeballs/impl.py:40) 1\n"
        f"start_connection ({site}/aiohappyeyeballs/impl.py:40);other ({site}/somelib/x.py:1) 1\n"
        "not a stack line\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "bench.profile", str(raw)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = {line.rsplit(maxsplit=2)[0]: tuple(line.rsplit(maxsplit=2)[1:]) for line in done.stdout.splitlines()[1:]}
    assert rows == {"aiohttp": ("42.9", "42.9"), "specwatch.daemon.exposition": ("28.6", "28.6"),
                    "aiohappyeyeballs": ("14.3", "28.6"), "other libraries": ("14.3", "14.3")}, done.stdout


@pytest.mark.real
def test_the_peer_power_bench_counts_a_ticket_as_the_shipped_alert_would_fire() -> None:
    script = """
import json
from bench.peer_power import Alert
shipped = Alert.shipped()
alert = Alert(window=5, hold=10, text="")
runs = {
    "one round decided": [[False, True] + [False] * 30],
    "six rounds decided": [[False] * 2 + [True] * 6 + [False] * 30],
    "two stretches": [[True] * 6 + [False] * 20 + [True] * 6 + [False] * 20],
    "two members, one gap bridged": [[True] * 4 + [False] * 30, [False] * 6 + [True] * 2 + [False] * 30],
}
print(json.dumps({"shipped": [shipped.window, shipped.hold, shipped.text],
                  **{name: alert.tickets(states) for name, states in runs.items()}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    # The rules ship min_over_time over 5m and for: 10m: at one round a minute, 5 and 10 rounds.
    assert found.pop("shipped") == [5, 10, "min_over_time [5m], for: 10m"]
    # A member differs while it was decided in the last 5 rounds; the ticket fires once that held 10 rounds in a row.
    assert found == {"one round decided": [], "six rounds decided": [11], "two stretches": [9, 35],
                     "two members, one gap bridged": [9]}


def _recording(path: Path, apart: float, prompts: int = 40) -> Path:
    """A bench.peer_record recording of two healthy one-slot members, each prompt answered twice alike, whose every
    value stands `apart` nats from the other's."""
    import gzip

    lines = [{"kind": "run", "prompts": [0, prompts], "changed_prompts": [0, 0], "seeds": []}]
    for name, shift in (("plain", 0.0), ("other", apart)):
        lines.append({"kind": "member", "member": name, "group": "null", "config": {"parallel": 1, "build": "b11434"}})
        for take in (0, 1):
            for prompt in range(prompts):
                tokens = [[t, -0.5 - shift, [[t, -0.5 - shift], [" else", -2.5 - shift]]] for t in (" a", " b", " c")]
                lines.append({"kind": "answer", "member": name, "prompt": prompt, "take": take, "tokens": tokens})
    with gzip.open(path, "wt") as out:
        out.writelines(json.dumps(line) + "\n" for line in lines)
    return path


@pytest.mark.real
def test_the_peer_power_bench_scores_against_the_floor_it_is_given(tmp_path: Path) -> None:
    recording = _recording(tmp_path / "pair.jsonl.gz", apart=0.15)

    def decisions(*extra: str) -> tuple[str, int]:
        done = subprocess.run([sys.executable, "-m", "bench.peer_power", "--recording", str(recording), "--rounds",
                               "200", *extra], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        (pairs,) = [line for line in done.stdout.splitlines() if line.startswith("| 2 | 2 |")]
        return done.stdout.splitlines()[0], int(pairs.split("|")[4])

    # 0.15 a value is 2.5 times a floor of 0.06 (over the allowance: decided within the 40 rounds), 0.75 of one of 0.2
    # (under it: never); a test shaped to take 2.6 off each answer never decides at 2.5 either.
    low, high = decisions("--floor", "0.06"), decisions("--floor", "0.2")
    assert "noise floor 0.06 (--floor)" in low[0] and low[1] == 4  # both members of both pairs
    assert "noise floor 0.2 (--floor)" in high[0] and high[1] == 0
    assert SHIPPED.allowance < 2.5 and "(tried)" not in low[0]
    shaped = decisions("--floor", "0.06", "--allowance", "2.6", "--cap", "3")
    assert f"allowance 2.6, cap 3, threshold {SHIPPED.threshold:g} (tried)" in shaped[0] and shaped[1] == 0
    refused = subprocess.run([sys.executable, "-m", "bench.peer_power", "--recording", str(recording), "--allowance",
                              "3", "--cap", "2"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "--allowance 3, --cap 2: the allowance is positive and under" in refused.stderr
    refused = subprocess.run([sys.executable, "-m", "bench.peer_power", "--recording", str(recording), "--floor", "0"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "--floor 0.0: a noise floor is a positive number" in refused.stderr
    # Declared deployed alike: 0.09 a value is 0.9 of the floor (never), 1.5 of a uniform floor of 0.06 (decided).
    recording = _recording(tmp_path / "alike.jsonl.gz", apart=0.09)
    assert decisions()[1] == 0
    alike = decisions("--uniform", "0.06")
    assert "deployed alike: floor 0.06 while one build answers" in alike[0] and alike[1] == 4
    refused = subprocess.run([sys.executable, "-m", "bench.peer_power", "--recording", str(recording), "--uniform",
                              "tight"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "--uniform tight: a noise floor is a number of nats" in refused.stderr
    refused = subprocess.run([sys.executable, "-m", "bench.peer_power", "--recording", str(recording), "--rounds", "0"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2 and "--rounds 0: the resampled null needs 100 rounds at least" in refused.stderr
