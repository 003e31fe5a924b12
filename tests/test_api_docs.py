"""docs/api.md's examples, read from the page and run as written: in-process on look-alikes, and as scripts on real
llama-servers and a real `specwatch run`.

Each runs twice: where the server and the daemon's pool have real logprobs (it must let the eval score, exit 0) and
where they serve fill-ins (it must stop it, exit 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwatch.cli import main
from tests.support.loopback import FaultServer
from tests.support.pages import blocks_by_section
from tests.support.process import ExporterProcess
from tests.support.verdicts import serving
from tests.support.waiting import wait_until
from tests.support.wire import FakeLlama

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"
WORLDS = ("clean", "fill_ins")


@dataclass(frozen=True)
class Does:
    code: int
    says: str
    """A piece of what it prints."""


# For each section of the page, each python block in it: what it does in each world (clean, fill_ins).
EXPECTED: dict[str, list[tuple[Does, Does]]] = {
    "Check a server": [(Does(0, "logprobs are real: scoring"), Does(1, "fill_ins: the server serves fill-in logprobs"))],
    "Ask the daemon": [(Does(0, "eval-a: clean (fresh)"), Does(1, "eval-a: fill_ins (fresh)"))],
    "Gate each answer: `require_real` and `tally`": [
        (Does(0, "'the cat': 23 tokens after the first, each with its alternatives: scoring"), Does(1, "do not score: 23 of 23")),
        (Does(0, "3 clean"), Does(1, "3 fill_ins")),
    ],
    "The async twins": [(Does(0, "the pool: clean"), Does(1, "the pool: fill_ins"))],
    "Errors and exit codes": [(Does(0, "refused: "), Does(0, "refused: "))],
}
# The refusals the last section shows: what each says, and the same arguments on the command line, which check refuses
# (exit 64) for the same reason, said of its flags.
REFUSED = [
    ("url: 'http://127.0.0.1:8080/v1/chat/completions' ends in /v1/chat/completions: give the server's root",
     ["check", "http://127.0.0.1:8080/v1/chat/completions"],
     "url: 'http://127.0.0.1:8080/v1/chat/completions' ends in /v1/chat/completions: give the server's root"),
    ("tokens: '1000' is not a whole number from 4 to 512", ["check", "http://127.0.0.1:8080", "--tokens", "1000"],
     "argument --tokens: '1000' is not a whole number from 4 to 512"),
    ("password_file needs username",
     ["check", "--exporter", "http://specwatch:9824", "--exporter-password-file", "/run/secrets/gate"],
     "--exporter-password-file needs --exporter-username"),
]


def examples() -> dict[str, list[str]]:
    return blocks_by_section(DOC, "python")


def test_every_example_on_the_page_is_run_here() -> None:
    assert {title: len(blocks) for title, blocks in examples().items()} == \
        {title: len(does) for title, does in EXPECTED.items()}


def _checked(world: str, title: str, index: int, code: int, said: str) -> None:
    expected = EXPECTED[title][index][WORLDS.index(world)]
    assert (code, expected.says in said) == (expected.code, True), f"{title} #{index} in the {world} world:\n{said}"


def _run_here(block: str, where: str) -> tuple[int, str]:
    """The example run in this process as a script: its exit code and what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            exec(compile(block, where, "exec"), {"__name__": "__main__"})
        except SystemExit as done:
            status = done.code
        else:
            status = None
    if isinstance(status, str):  # as the interpreter does with sys.exit(message)
        return 1, out.getvalue() + status
    return status or 0, out.getvalue()


@pytest.fixture(params=WORLDS)
async def world(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """LLAMA_URL and SPECWATCH_URL on look-alikes: a server and a daemon's pool (one server, pool=eval)."""
    make = FakeLlama.plain if request.param == "clean" else FakeLlama.draft
    with FaultServer(make(tokens=None)) as llama:
        async with serving({"eval-a": make(tokens=8)}, {"eval-a": {"pool": "eval"}}) as daemon:
            monkeypatch.setenv("LLAMA_URL", llama.url)
            monkeypatch.setenv("SPECWATCH_URL", daemon)
            yield request.param


def test_every_example_on_look_alikes(world: str) -> None:
    for title, blocks in examples().items():
        for index, block in enumerate(blocks):
            _checked(world, title, index, *_run_here(block, f"{DOC.name}: {title} #{index}"))


def test_the_refusals_shown_name_the_arguments_as_check_names_its_flags() -> None:
    (block,) = examples()["Errors and exit codes"]
    code, said = _run_here(block, DOC.name)
    refusals = [line.removeprefix("refused: ") for line in said.splitlines() if line.startswith("refused: ")]
    assert code == 0 and len(refusals) == len(REFUSED), said
    for refusal, (expected, args, in_check) in zip(refusals, REFUSED, strict=True):
        assert refusal.startswith(expected), refusal
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                assert main(args) == 64
            except SystemExit as usage:  # argparse refuses a flag's value itself
                assert usage.code == 64
        assert in_check in err.getvalue(), (in_check, err.getvalue())


# --- As scripts, on real llama-servers and real daemons.

DAEMON_CONFIG = "poll_interval: 1s\ncanary_interval: 2s\n"


def _settled(url: str) -> bool:
    """Every verdict the daemon holds is fresh and decided."""
    with urllib.request.urlopen(url + "/api/v1/verdicts", timeout=5) as answer:
        document = json.load(answer)
    models = [m for s in document["servers"] for m in s["models"]]
    return bool(models) and all(m["fresh"] and m["verdict"] != "unchecked" for m in models)


@pytest.fixture(scope="module")
def real_worlds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, str]]]:
    """Per world, LLAMA_URL and SPECWATCH_URL: a real llama-server, and a real daemon watching one as pool=eval."""
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    work = tmp_path_factory.mktemp("api-docs")
    model = write_cycle_model(work / "cycle.gguf")
    with contextlib.ExitStack() as stack:
        found = {}
        for world, kind in zip(WORLDS, ("plain", "draft"), strict=True):
            server = stack.enter_context(LlamaServer.of_kind(kind, model))
            config = work / f"{world}.yml"
            config.write_text(f"servers:\n  - {{name: eval-a, url: '{server.url}', labels: {{pool: eval}}}}\n{DAEMON_CONFIG}")
            daemon = stack.enter_context(ExporterProcess("--config", str(config)))
            found[world] = {"LLAMA_URL": server.url, "SPECWATCH_URL": daemon.wait_started().url()}
        for world, env in found.items():
            wait_until(f"the {world} daemon's verdicts", lambda env=env: _settled(env["SPECWATCH_URL"]), timeout=60)
        yield found


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("world", WORLDS)
def test_every_example_as_a_script_on_real_servers(real_worlds: dict[str, dict[str, str]], world: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMA_URL", "SPECWATCH_URL")}
    for title, blocks in examples().items():
        for index, block in enumerate(blocks):
            result = subprocess.run([sys.executable, "-c", block], env={**env, **real_worlds[world]}, cwd=ROOT,
                                    capture_output=True, text=True, timeout=300)
            _checked(world, title, index, result.returncode, result.stdout + result.stderr)
