"""The one verdict: decide()'s precedence and the gates' rules after it as a table, and what builds that move in other ways
get from it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from specwatch.core.verdict import (
    NO_V1_ENDPOINT_ASKED,
    NOTHING_LOADED,
    SEVERITY,
    Decision,
    EndpointEvidence,
    Evidence,
    Freshness,
    ModelDecision,
    Verdict,
    behind_a_balancer,
    decide,
    held,
    key_hint,
    load_failed,
    router_verdict,
    selection_verdict,
    through_a_front_end,
    worst,
    worth_another_pass,
)
from specwatch.probe.canary import Tally
from specwatch.reasons import ProbeFailure, Reason
from tests.support.metrics import exposition, parse, value
from tests.support.wire import FakeLlama

REAL = Tally(tokens=8, fill_ins=0, mean_logprob=-0.3, draft_n=None, draft_accepted=None)
DRAFTED_REAL = Tally(tokens=8, fill_ins=0, mean_logprob=-0.3, draft_n=6, draft_accepted=5)
LONG = Tally(tokens=48, fill_ins=0, mean_logprob=-0.3, draft_n=None, draft_accepted=None)
CHAT_PROOF = Tally(tokens=32, fill_ins=0, mean_logprob=-0.3, draft_n=None, draft_accepted=None)
FILLED = Tally(tokens=8, fill_ins=7, mean_logprob=-0.04, draft_n=8, draft_accepted=7)


def ok(endpoint: str = "chat", tally: Tally = REAL) -> EndpointEvidence:
    return EndpointEvidence(endpoint, tally)


def failed(endpoint: str = "chat", tally: Tally | None = None) -> EndpointEvidence:
    return EndpointEvidence(endpoint, tally, "timeout: no answer within 30s")


# Each row: the evidence, the verdict, and a phrase its summary must hold. Rows go down the precedence.
TABLE = [
    # A model that is not loaded outranks everything, even a failed poll: specwatch never loads one.
    (Evidence(poll_failure="connection_refused: x", model_status="unloaded"), Verdict.UNCHECKED, "not loaded"),
    (Evidence(poll_failure=None, model_status="sleeping", endpoints=[ok(tally=FILLED)]), Verdict.UNCHECKED, "sleeping"),
    # A failed poll outranks cached fill-ins: the server is down, its old answers are not today's.
    (Evidence(poll_failure="connection_refused: x", endpoints=[ok(tally=FILLED)]), Verdict.UNCHECKED, "could not poll"),
    (Evidence(poll_failure="not polled yet"), Verdict.UNCHECKED, "not polled yet"),
    # Fill-ins outrank a failing or unchecked endpoint: they are proof.
    (Evidence(poll_failure=None, endpoints=[ok(tally=FILLED), failed("completion")]), Verdict.FILL_INS, "chat 7/7"),
    (Evidence(poll_failure=None, endpoints=[ok(tally=FILLED), EndpointEvidence("completion", None)]), Verdict.FILL_INS,
     "do not score"),
    # A failed canary keeps its last tally: fill-ins seen stay proof.
    (Evidence(poll_failure=None, endpoints=[failed(tally=FILLED)]), Verdict.FILL_INS, "fill-in"),
    (Evidence(poll_failure=None), Verdict.UNCHECKED, "no canary has run yet"),
    (Evidence(poll_failure=None, endpoints=[ok(), EndpointEvidence("completion", None)]), Verdict.UNCHECKED,
     "completion: no canary yet"),
    # A failing endpoint outranks unproven and clean: nothing is clean unless every endpoint was checked.
    (Evidence(poll_failure=None, speculation_slots=True, endpoints=[ok(), failed("completion", REAL)]), Verdict.UNCHECKED,
     "completion: timeout"),
    (Evidence(poll_failure=None, speculation_slots=True, endpoints=[ok(), ok("completion")]), Verdict.UNPROVEN, "/slots says"),
    (Evidence(poll_failure=None, speculation_slots=False, speculation_props=True, endpoints=[ok()]), Verdict.UNPROVEN,
     "/props says"),
    # /slots off and a /props that tells the truth (#28119) says speculation: that witness is named, whatever the canaries.
    (Evidence(poll_failure=None, speculation_slots=None, speculation_props=True, endpoints=[ok()]), Verdict.UNPROVEN,
     "/props says the server speculates, but no canary drafted"),
    (Evidence(poll_failure=None, speculation_slots=None, speculation_props=True,
              endpoints=[ok(tally=CHAT_PROOF), ok("completion", LONG)]), Verdict.UNPROVEN, "/props says"),
    # Speculation unseen (/slots off, or a front end that hides it): a short canary that did not draft proves nothing.
    (Evidence(poll_failure=None, speculation_slots=None, speculation_props=None, endpoints=[ok()]), Verdict.UNPROVEN,
     "needs a canary of 8 tokens or more on a raw-prompt endpoint (completion, completion_stream, "
     "completion_post_sampling, v1_completion, v1_completion_stream) and one of 32 tokens or more on a chat endpoint "
     "(chat, chat_stream), and it had chat 8;"),
    # No kind of endpoint covers every n-gram type: ngram-simple never drafts on the raw prompt, ngram-map-k on chat
    # only on some models. However long, one kind alone proves nothing.
    (Evidence(poll_failure=None, speculation_slots=None, endpoints=[ok("completion", LONG), ok("v1_completion", LONG)]),
     Verdict.UNPROVEN, "needs a canary of 32 tokens or more on a chat endpoint (chat, chat_stream), and it had"),
    (Evidence(poll_failure=None, speculation_slots=None, endpoints=[ok(tally=LONG), ok("chat_stream", LONG)]),
     Verdict.UNPROVEN, "needs a canary of 8 tokens or more on a raw-prompt endpoint"),
    # 8 tokens on a raw-prompt endpoint and 32 on chat: every measured type would have drafted.
    (Evidence(poll_failure=None, speculation_slots=None, speculation_props=False, endpoints=[ok(tally=CHAT_PROOF), ok("completion")]),
     Verdict.CLEAN, "every token carries its alternatives"),
    (Evidence(poll_failure=None, speculation_slots=True, endpoints=[ok(tally=DRAFTED_REAL), ok("completion")]), Verdict.CLEAN,
     "drafted and still returned real logprobs"),
    (Evidence(poll_failure=None, speculation_slots=False, endpoints=[ok(), ok("completion")]), Verdict.CLEAN,
     "every token carries its alternatives"),
]


CLEAN = decide(Evidence(poll_failure=None, speculation_slots=False, endpoints=[ok(), ok("completion")]))
UNPROVEN = decide(Evidence(poll_failure=None, speculation_slots=True, endpoints=[ok(), ok("completion")]))
FILL_INS = decide(Evidence(poll_failure=None, endpoints=[ok(tally=FILLED), ok("completion")]))
DOWN = decide(Evidence(poll_failure="unauthorized: HTTP 401 on /props"))
SIGNS = ["/props changed between requests (...)"]
FRESH = Freshness(True, age=10.0, bound=500.0, poll_age=5.0, poll_bound=45.0)


def stale(age: float | None = 600.4, poll_age: float | None = 5.0) -> Freshness:
    return Freshness(False, age=age, bound=500.0, poll_age=poll_age, poll_bound=45.0)


def router(*models: tuple[str, bool, Decision], one_asked: bool = False) -> Callable[[], Decision]:
    return lambda: router_verdict([ModelDecision(*m) for m in models], one_asked=one_asked)


# After decide(), the rules a gate applies, in the order check and check --exporter apply them. Each row: the rule
# applied to decided verdicts, the verdict, and a phrase its summary must hold.
RULES = [
    # check through a front end that forwards only /v1/*, when none of the endpoints asked for is a /v1 one.
    (lambda: NO_V1_ENDPOINT_ASKED, Verdict.UNCHECKED, "need /completion: ask for v1_completion or chat"),
    (lambda: load_failed(ProbeFailure(Reason.TIMEOUT, "no answer within 5s")), Verdict.UNCHECKED,
     "could not load the model: timeout: no answer within 5s"),
    # A router: its worst loaded model, named with every model's verdict; the model asked for, loaded or not.
    (router(("a", True, CLEAN), ("b", True, FILL_INS), ("c", False, DOWN)), Verdict.FILL_INS,
     "(model b; models: a: clean, b: fill_ins, c: unchecked)"),
    (router(("a", True, CLEAN), ("c", False, DOWN)), Verdict.CLEAN, "(model a; models: a: clean, c: unchecked)"),
    (router(("c", False, DOWN), one_asked=True), Verdict.UNCHECKED, "could not poll"),
    (router(("c", False, DOWN), ("d", False, CLEAN)), Verdict.UNCHECKED, "the router has no model loaded"),
    # Signs of a load balancer: fill-ins seen stay proof, said beside the sign; nothing else is proven.
    (lambda: behind_a_balancer(FILL_INS, SIGNS, hint="ask the daemon"), Verdict.FILL_INS,
     "chat 7/7); do not score; answers cannot come from one server: /props changed between requests (...); a load "
     "balancer in front spreads requests over replicas, and at least one of them serves fill-ins"),
    (lambda: behind_a_balancer(CLEAN, SIGNS, hint="ask the daemon"), Verdict.UNCHECKED,
     "answers cannot come from one server: /props changed between requests (...); ask the daemon"),
    (lambda: behind_a_balancer(UNPROVEN, SIGNS, hint="ask the daemon"), Verdict.UNCHECKED, "cannot come from one server"),
    (lambda: behind_a_balancer(CLEAN, [], hint="ask the daemon"), Verdict.CLEAN, "every token carries its alternatives"),
    # An unauthorised poll says whether a key was sent.
    (lambda: key_hint(DOWN, Reason.UNAUTHORIZED, key_sent=False, give="--api-key-file or --api-key-env"), Verdict.UNCHECKED,
     "HTTP 401 on /props; no API key was sent: give --api-key-file or --api-key-env"),
    (lambda: key_hint(DOWN, Reason.UNAUTHORIZED, key_sent=True, give="--api-key-file or --api-key-env"), Verdict.UNCHECKED, "/props; the API key sent was refused"),
    (lambda: through_a_front_end(FILL_INS), Verdict.FILL_INS, "do not score (through a front end that forwards only /v1/*"),
    # check --exporter: a verdict the daemon holds counts while fresh; a stale one is unchecked, save fill-ins.
    (lambda: held(CLEAN, FRESH), Verdict.CLEAN, "every token carries its alternatives"),
    (lambda: held(FILL_INS, stale(poll_age=None)), Verdict.FILL_INS, "do not score"),
    (lambda: held(CLEAN, stale(poll_age=None)), Verdict.UNCHECKED, "stale: the exporter has no recent poll of it (was clean: "),
    (lambda: held(UNPROVEN, stale(poll_age=46.2)), Verdict.UNCHECKED,
     "stale: the exporter's last good poll of it is 46s old (more than 45s) (was unproven: /slots says"),
    (lambda: held(CLEAN, stale(age=None)), Verdict.UNCHECKED, "stale: not every endpoint has a successful canary yet"),
    (lambda: held(CLEAN, stale()), Verdict.UNCHECKED, "stale: its canaries last confirmed it 600s ago, more than its 500s bound"),
    (lambda: selection_verdict([("a", CLEAN), ("b", UNPROVEN)], any_watched=True, selection="label=pool=eval"),
     Verdict.UNPROVEN, "b: /slots says the server speculates, but no canary drafted (timings.draft_n), so its logprobs are "
     "not proven real; do not score (worst of 2 selected)"),
    (lambda: selection_verdict([("a", CLEAN)], any_watched=True, selection="x"), Verdict.CLEAN, "logprobs are real"),
    (lambda: selection_verdict([], any_watched=True, selection="x"), Verdict.UNCHECKED, "the router has no model loaded"),
    (lambda: selection_verdict([], any_watched=False, selection="server=a"), Verdict.UNCHECKED,
     "nothing the exporter(s) watch matches the selection (server=a)"),
]


@pytest.mark.parametrize(("case", "verdict", "phrase"), TABLE + RULES)
def test_decide_by_precedence(case: Evidence | Callable[[], Decision], verdict: Verdict, phrase: str) -> None:
    decision = decide(case) if isinstance(case, Evidence) else case()
    assert decision.verdict is verdict
    assert phrase in decision.summary


@pytest.mark.parametrize(("age", "poll_age", "fresh"), [
    (500.0, 45.0, True),  # both on their bounds: still fresh
    (500.001, 45.0, False), (500.0, 45.001, False), (None, 1.0, False), (1.0, None, False),
])
def test_the_daemons_freshness_and_the_gates_reason_agree(age: float | None, poll_age: float | None, fresh: bool) -> None:
    freshness = Freshness.measured(age=age, bound=500.0, poll_age=poll_age, poll_bound=45.0)
    assert freshness.fresh is fresh
    assert (held(CLEAN, freshness) == CLEAN) is fresh
    if not fresh:
        assert held(CLEAN, freshness).summary.startswith("stale: ")


@pytest.mark.parametrize("freshness", [stale(), stale(age=None), stale(poll_age=None), stale(poll_age=46.2)])
def test_a_stale_unchecked_keeps_its_own_reason(freshness: Freshness) -> None:
    """A server the daemon cannot poll is unchecked for that reason, not "stale: ... (was unchecked: ...)"."""
    assert held(DOWN, freshness) == DOWN


def test_only_an_unproven_model_is_worth_another_pass() -> None:
    assert [v for v in Verdict if worth_another_pass(Decision(v, ""))] == [Verdict.UNPROVEN]


def test_the_table_reaches_every_verdict() -> None:
    assert {row[1] for row in TABLE} == set(Verdict)


def test_exit_codes_and_severity() -> None:
    assert {v: v.exit_code for v in Verdict} == {Verdict.CLEAN: 0, Verdict.FILL_INS: 1, Verdict.UNPROVEN: 1,
                                                 Verdict.UNCHECKED: 2}
    assert SEVERITY[0] is Verdict.FILL_INS and SEVERITY[-1] is Verdict.CLEAN and set(SEVERITY) == set(Verdict)


def test_worst_names_the_one_that_decided() -> None:
    decisions = [("a", Decision(Verdict.CLEAN, "x")), ("b", Decision(Verdict.UNCHECKED, "y")),
                 ("c", Decision(Verdict.FILL_INS, "z"))]
    assert worst(decisions) == ("c", decisions[2][1])
    assert worst(decisions[:2]) == ("b", decisions[1][1])
    with pytest.raises(ValueError, match="matched nothing"):
        worst([])
    assert NOTHING_LOADED.verdict is Verdict.UNCHECKED


async def _verdict_of(make_watcher, fake: FakeLlama) -> tuple[Verdict, dict]:
    watcher = make_watcher({"srv": fake}, canary_tokens=8)
    await watcher.poll("srv")
    await watcher.canary("srv")
    model = watcher.fleet.get("srv").model()
    return model.decision.verdict, parse(exposition(watcher.fleet))


async def test_a_props_that_tells_the_truth_is_no_contradiction_and_the_canaries_still_decide(make_watcher) -> None:
    for fake, verdict in ((FakeLlama.draft(tokens=8, props_types="draft-simple"), Verdict.FILL_INS),
                          (FakeLlama.future_fixed(tokens=8, props_types="draft-simple"), Verdict.CLEAN),
                          (FakeLlama(speculative=True, drafts=0, tokens=8, props_types="ngram-mod"), Verdict.UNPROVEN)):
        found, samples = await _verdict_of(make_watcher, fake)
        assert found is verdict, fake
        assert value(samples, "specwatch_speculation_contradiction", server="srv") == 0
        assert value(samples, "specwatch_speculation_enabled", server="srv", source="props") == 1
        assert value(samples, "specwatch_speculation_enabled", server="srv", source="slots") == 1


@pytest.mark.parametrize(("types", "names", "speculative"), [
    (None, (), None),
    ("none", ("none",), False),
    ("", (), False),
    # --spec-type none on a build whose /props tells the truth: "none" twice is no speculation.
    ("none,none", ("none", "none"), False),
    ("none,ngram-mod", ("none", "ngram-mod"), True),
    (" NONE , draft-eagle3 ", ("NONE", "draft-eagle3"), True),
    # A type this specwatch does not know is kept as reported, and counts as speculation.
    ("none,draft-tomorrow", ("none", "draft-tomorrow"), True),
    ("ngram-mod,ngram-map-k", ("ngram-mod", "ngram-map-k"), True),
])
def test_props_types_are_a_comma_list_where_any_name_but_none_is_speculation(types, names, speculative) -> None:
    from specwatch.probe.llama import parse_props

    props = parse_props({"default_generation_settings": {"params": {} if types is None else {"speculative.types": types}}})
    assert (props.speculation_types, props.speculation_type_names, props.speculative) == (types, names, speculative)


async def test_an_unknown_type_in_props_is_shown_and_counted_as_speculation(make_watcher) -> None:
    from specwatch.core.report import model_report
    from specwatch.daemon.landing import rows

    watcher = make_watcher({"srv": FakeLlama.draft(tokens=8, props_types="none,draft-tomorrow")}, canary_tokens=8)
    await watcher.poll("srv")
    await watcher.canary("srv")
    state = watcher.fleet.get("srv")
    samples = parse(exposition(watcher.fleet))
    assert value(samples, "specwatch_speculation_enabled", server="srv", source="props") == 1
    assert value(samples, "specwatch_speculation_contradiction", server="srv") == 0
    assert model_report("", state.model()).speculation_types == "none,draft-tomorrow"
    assert rows(state, 0.0)[0].poll == "up; speculation per /slots: on; /props: none,draft-tomorrow"


async def test_props_alone_saying_speculation_is_on_makes_a_quiet_server_unproven(make_watcher) -> None:
    """/slots off (--no-slots) and /props truthful: a canary without drafting proves nothing."""
    found, samples = await _verdict_of(make_watcher, FakeLlama(speculative=True, drafts=None, tokens=8, props_types="draft-simple",
                                                               slots_enabled=False))
    assert found is Verdict.UNPROVEN
    assert value(samples, "specwatch_speculation_enabled", server="srv", source="slots") is None


async def test_a_build_that_drops_draft_n_leaves_a_speculating_server_without_fill_ins_unproven(make_watcher) -> None:
    found, _ = await _verdict_of(make_watcher, FakeLlama(speculative=True, fill_ins=set(), drafts=None, tokens=8))
    assert found is Verdict.UNPROVEN
    # And with fill-ins, no draft count is needed: the fill-ins are the proof.
    found, _ = await _verdict_of(make_watcher, FakeLlama(speculative=True, fill_ins={2, 3}, drafts=None, tokens=8))
    assert found is Verdict.FILL_INS


async def test_a_build_that_marks_its_placeholders_serves_fill_ins(make_watcher) -> None:
    fake = FakeLlama(speculative=True, fill_ins={2, 4}, drafts=6, tokens=8, placeholder_field="placeholder",
                     fill_in_alternatives=True)
    found, _ = await _verdict_of(make_watcher, fake)
    assert found is Verdict.FILL_INS
