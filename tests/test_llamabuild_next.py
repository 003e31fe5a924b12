"""The builds upstream has in flight, played by the patched llama-server's switches: what each serves, and what specwatch
reports on every endpoint, checked against docs/llama-server-behaviour.md's table."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import pytest

from specwatch.core.report import endpoint_state
from specwatch.core.verdict import Verdict
from specwatch.daemon.landing import rows
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import cycle_text, write_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.gate.check import CheckReport, render_text, run_check
from specwatch.gate.options import DEFAULT_TOKENS
from specwatch.settings.targets import ServerConfig
from tests.support.llamabuild import (
    FILL_PRE_SAMPLING_ENV,
    FILL_PROBS_ENV,
    NGRAM_DEFAULT_ENV,
    PROPS_TRUTHFUL_ENV,
    build_env,
)
from tests.support.metrics import exposition, parse, value
from tests.support.router import PREDICTED, counters
from tests.support.waiting import wait_until_async
from tests.test_cadence_economy import CANARY_ALLOWANCE, _model, _round_done, _seen, _verdict, watching

pytestmark = pytest.mark.real

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "llama-server-behaviour.md"
N_TOKENS = 48
N_PROBS = 3
PROMPT = cycle_text(repeats=3).strip()
DRAFT = ("-md", "{model}", "--spec-type", "draft-simple")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return write_cycle_model(tmp_path_factory.mktemp("next") / "cycle.gguf")


@pytest.fixture(scope="module")
def server(model, fixed_llama_binary):
    """A patched server with these arguments and these switches on (every other one off), started once per module."""
    started: dict[tuple, LlamaServer] = {}

    def get(args: Sequence[str] = (), *switches: str) -> LlamaServer:
        key = (tuple(args), tuple(sorted(switches)))
        if key not in started:
            started[key] = LlamaServer(model, [a.replace("{model}", str(model)) for a in args], binary=fixed_llama_binary,
                                       env=build_env(*switches)).start()
        return started[key]

    yield get
    for running in started.values():
        running.close()


def _get(server: LlamaServer, path: str):
    answer = httpx.get(server.url + path, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def props_types(server: LlamaServer) -> str:
    return _get(server, "/props")["default_generation_settings"]["params"]["speculative.types"]


def slots_speculative(server: LlamaServer) -> bool:
    return _get(server, "/slots")[0]["speculative"]


def post_sampling(server: LlamaServer) -> dict:
    body = {"prompt": PROMPT, "n_predict": N_TOKENS, "temperature": 0, "n_probs": N_PROBS, "post_sampling_probs": True}
    answer = httpx.post(server.url + "/completion", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def check(server: LlamaServer, endpoints: Sequence[Endpoint] = tuple(Endpoint)) -> CheckReport:
    """`specwatch check URL` at its defaults, in this process."""
    return asyncio.run(run_check(ServerConfig(name="check", url=server.url), endpoints=list(endpoints),
                                 tokens=DEFAULT_TOKENS, timeout=60))


def test_28119_props_lists_the_types_in_use_and_can_still_hold_none(server):
    for args, types, speculating in (((), "none", False), (DRAFT, "none,draft-simple", True),
                                     (("--spec-type", "ngram-mod"), "none,ngram-mod", True),
                                     (("--spec-type", "none"), "none,none", False)):
        truthful = server(args, PROPS_TRUTHFUL_ENV)
        assert (props_types(truthful), slots_speculative(truthful)) == (types, speculating), args
    assert "LLAMA_SPEC_PROPS_TRUTHFUL=1" in server((), PROPS_TRUTHFUL_ENV).log_path.read_text()
    # Switched off, /props says "none" on a server that speculates: build 11434.
    assert (props_types(server(DRAFT)), slots_speculative(server(DRAFT))) == ("none", True)


async def test_a_props_that_tells_the_truth_is_no_contradiction_and_is_shown_as_reported(server):
    truthful, b11434 = server(DRAFT, PROPS_TRUTHFUL_ENV), server(DRAFT)
    names = ("truthful", "b11434")
    async with watching(servers=[{"name": "truthful", "url": truthful.url}, {"name": "b11434", "url": b11434.url}],
                        poll_interval="1s", canary_interval="1h") as (watcher, _):
        await wait_until_async("both polled", lambda: all((m := _model(watcher, n)) is not None and m.poll is not None
                                                          for n in names), timeout=30)
        samples = parse(exposition(watcher.fleet))
    assert [value(samples, "specwatch_speculation_contradiction", server=n) for n in names] == [0, 1]
    assert [value(samples, "specwatch_speculation_enabled", server=n, source="props") for n in names] == [1, 0]
    assert rows(watcher.fleet.get("truthful"), 0.0)[0].poll == "up; speculation per /slots: on; /props: none,draft-simple"
    assert rows(watcher.fleet.get("b11434"), 0.0)[0].poll == "up; speculation per /slots: on"


def test_28391_a_server_given_no_flag_speculates_with_ngram_mod_unless_told_not_to(server):
    assert slots_speculative(server((), NGRAM_DEFAULT_ENV)) is True
    assert props_types(server((), NGRAM_DEFAULT_ENV, PROPS_TRUTHFUL_ENV)) == "none,ngram-mod"
    for off in (("--no-spec-type",), ("--spec-type", "none")):
        assert slots_speculative(server(off, NGRAM_DEFAULT_ENV)) is False, off
    # An explicit type replaces the default rather than adding ngram-mod to it.
    assert props_types(server(DRAFT, NGRAM_DEFAULT_ENV, PROPS_TRUTHFUL_ENV)) == "none,draft-simple"
    # Switched off, no flag is no speculation, as on build 11434.
    assert slots_speculative(server()) is False


def test_post_sampling_at_temperature_0_is_one_candidate_at_1_and_the_revision_serves_pre_sampling_numbers(server):
    """What the not_post_sampling rule stands on, measured: greedy sampling keeps one candidate."""
    plain = post_sampling(server())["completion_probabilities"]
    assert all(t["prob"] == 1.0 and len(t["top_probs"]) == 1 and t["top_probs"][0]["id"] == t["id"] for t in plain)
    fixed = post_sampling(server(DRAFT, FILL_PROBS_ENV))
    tokens = fixed["completion_probabilities"]
    assert fixed["timings"]["draft_n"] > 0
    assert all(t["prob"] == 1.0 and t["top_probs"] == [] for t in tokens[1:]), "#27196 as proposed: fill-ins"
    revised = post_sampling(server(DRAFT, FILL_PRE_SAMPLING_ENV))
    tokens = revised["completion_probabilities"]
    assert revised["timings"]["draft_n"] > 0
    assert tokens[0]["prob"] == 1.0 and len(tokens[0]["top_probs"]) == 1, "the first token is sampled outside the draft"
    # Every drafted token: the model's own distribution (the cycle's successor at about 0.7), not what sampling kept.
    assert all(0.5 < t["prob"] < 0.9 and len(t["top_probs"]) == N_PROBS for t in tokens[1:]), tokens[1:4]
    assert [t["id"] for t in tokens] == [t["id"] for t in plain]


def test_a_props_that_speculates_on_a_no_slots_server_that_never_drafted_is_unproven(server):
    # ngram-simple never drafts on the raw prompt: the canaries there prove nothing, and /props says it is on.
    quiet = server(("--no-slots", "--spec-type", "ngram-simple"), PROPS_TRUTHFUL_ENV)
    report = check(quiet, [Endpoint.COMPLETION, Endpoint.V1_COMPLETION])
    assert (report.verdict, report.speculation_slots, report.speculation_props) == ("unproven", None, True)
    assert report.speculation_types == "none,ngram-simple"
    assert report.summary.startswith("/props says the server speculates, but no canary drafted")
    assert all(e.draft_n is None and e.fill_ins == 0 for e in report.endpoints)
    assert "speculation: /slots unknown, /props on (none,ngram-simple)" in render_text(report)


async def test_an_upgrade_to_a_build_that_speculates_by_default_is_caught_with_no_flag_given(
        model: pathlib.Path, fixed_llama_binary: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The same command line, restarted on #28391's build: caught at the next poll, one round at the speculating size."""
    poll = 2.0
    args = ["--metrics"]
    before = LlamaServer(model, args, binary=fixed_llama_binary, env=build_env(), log_dir=tmp_path).start()
    upgraded: LlamaServer | None = None
    try:
        async with watching(servers=[{"name": "target", "url": before.url}], poll_interval=f"{poll:g}s",
                            canary_interval="1h") as (watcher, _):
            await wait_until_async("a clean first round", lambda: _verdict(watcher, "target") is Verdict.CLEAN and _round_done(watcher, "target"), timeout=30)
            await asyncio.to_thread(before.stop)
            upgraded = LlamaServer(model, args, binary=fixed_llama_binary, env=build_env(NGRAM_DEFAULT_ENV),
                                   port=before.port, log_dir=tmp_path)
            await asyncio.to_thread(upgraded.start)
            answered = time.monotonic()
            caught = await _seen("fill_ins after the upgrade", lambda: _verdict(watcher, "target") is Verdict.FILL_INS, timeout=30)
            assert caught - answered <= 2 * poll + CANARY_ALLOWANCE, f"caught {caught - answered:.1f}s after /health"
            await wait_until_async("the round after the upgrade", lambda: _round_done(watcher, "target"), timeout=30)
            state = _model(watcher, "target")
            settings = watcher.settings
            # ngram-mod drafts on the repeated line of every raw-prompt endpoint and, at 32 tokens, on chat too.
            assert {e for e, c in state.canaries.items() if c.tally is not None and c.tally.fill_ins > 0} == set(Endpoint)
            predicted = (await asyncio.to_thread(counters, upgraded.url))[PREDICTED]
            assert predicted == len(Endpoint) * settings.canary_tokens_speculating
    finally:
        for running in (before, upgraded):
            if running is not None:
                running.stop()


@dataclass(frozen=True)
class Row:
    """One line of the doc's table: a build (its switches) and a server's flags on it."""

    build: str
    switches: tuple[str, ...]
    flags: tuple[str, ...]

    def cells(self, report: CheckReport) -> list[str]:
        slots = {None: "unknown", True: "on", False: "off"}[report.speculation_slots]
        by_endpoint = {e.endpoint: e for e in report.endpoints}
        return [self.build, " ".join(f"`{f}`" for f in self.flags) or "none", f"`{report.speculation_types}`", slots,
                f"**{report.verdict}**", *(_cell(by_endpoint[e.value]) for e in Endpoint)]


def _cell(entry) -> str:
    kind, words = endpoint_state(entry)
    return {"fill_ins": words, "drafted": "real, drafted", "quiet": "real"}.get(kind, f"`{entry.reason}`")


ROWS = (
    Row("b11434 as released", (), ()),
    Row("b11434 as released", (), ("-md MODEL", "--spec-type draft-simple")),
    Row("#27196 as proposed", (FILL_PROBS_ENV,), ("-md MODEL", "--spec-type draft-simple")),
    Row("#27196 revised", (FILL_PRE_SAMPLING_ENV,), ("-md MODEL", "--spec-type draft-simple")),
    Row("#28119", (PROPS_TRUTHFUL_ENV,), ("-md MODEL", "--spec-type draft-simple")),
    Row("#28119", (PROPS_TRUTHFUL_ENV,), ("--no-slots", "--spec-type ngram-mod")),
    Row("#28391", (NGRAM_DEFAULT_ENV,), ()),
    Row("#28391", (NGRAM_DEFAULT_ENV,), ("--no-spec-type",)),
    Row("#28391 with #28119", (NGRAM_DEFAULT_ENV, PROPS_TRUTHFUL_ENV), ()),
)


def _table(text: str) -> list[list[str]]:
    """The rows of the table under the doc's "Builds in flight" heading, split into cells."""
    section = text.split("\n## Builds in flight", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_doc_table_of_builds_is_what_specwatch_reports_on_each(server):
    header = ["build", "server flags", "/props `speculative.types`", "/slots", "verdict", *(f"`{e.value}`" for e in Endpoint)]
    text = DOC.read_text()
    section = text.split("\n## Builds in flight", 1)[1]
    assert "| " + " | ".join(header) + " |" in section
    measured = []
    for row in ROWS:
        args = [word for flag in row.flags for word in flag.replace("MODEL", "{model}").split()]
        measured.append(row.cells(check(server(args, *row.switches))))
    assert _table(text) == measured
