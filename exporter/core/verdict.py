"""The one verdict on a server's logprobs (clean, fill_ins, unproven, unchecked), and every rule a gate applies to it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

from ..probe.canary import TABLE, Tally
from ..reasons import ProbeFailure, Reason


class Verdict(StrEnum):
    """Whether an eval may read logprobs from a server; `specwatch check` exits with `exit_code`."""

    CLEAN = "clean"
    """Every canary token after the first carries its alternatives: the logprobs are real."""
    FILL_INS = "fill_ins"
    """A canary got fill-ins (placeholder logprobs: 0.0 with no alternatives) from speculative decoding."""
    UNPROVEN = "unproven"
    """The server speculates (per /slots or /props) but no canary drafted, so its logprobs are not proven real."""
    UNCHECKED = "unchecked"
    """No verdict could be reached: down, unauthorised, no logprobs, an endpoint failing, not canaried yet."""

    @property
    def exit_code(self) -> int:
        return _EXIT_CODES[self]


_EXIT_CODES = {Verdict.CLEAN: 0, Verdict.FILL_INS: 1, Verdict.UNPROVEN: 1, Verdict.UNCHECKED: 2}
# Worst first: the order on-call reads a fleet in.
SEVERITY = (Verdict.FILL_INS, Verdict.UNPROVEN, Verdict.UNCHECKED, Verdict.CLEAN)


@dataclass(frozen=True)
class EndpointEvidence:
    endpoint: str
    tally: Tally | None
    """The latest successful canary's tally on this endpoint, if any."""
    failure: str | None = None
    """Why the latest canary on this endpoint failed ("reason: detail"); None when it succeeded."""


@dataclass(frozen=True)
class Evidence:
    """What the probes found about one server (or one router model)."""

    poll_failure: str | None
    """Why the last poll failed ("reason: detail"), "not polled yet", or None after a good poll."""
    speculation_slots: bool | None = None
    speculation_props: bool | None = None
    endpoints: Sequence[EndpointEvidence] = ()
    model_status: str | None = None
    """A router model's status when it is not loaded ("unloaded", "sleeping", ...): specwatch never loads one."""


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    summary: str
    """One sentence for people: the log, the landing page, `specwatch check`."""

    def onto(self, report: R) -> R:
        """The report with this decision as its verdict, exit code and summary."""
        report.verdict, report.exit_code, report.summary = self.verdict.value, self.verdict.exit_code, self.summary
        return report


class Decided(Protocol):
    """A gate's report: its top-level verdict, exit code and summary, as `specwatch check --json` prints them."""

    verdict: str
    exit_code: int
    summary: str


R = TypeVar("R", bound=Decided)


def _counts(tally: Tally) -> str:
    return f"{tally.fill_ins}/{tally.judged_tokens}"


_SPECS = {endpoint.value: spec for endpoint, spec in TABLE.items()}
"""The canary table by endpoint name, as evidence names them."""
PROOFS = tuple(sorted({spec.proof for spec in TABLE.values()}, key=lambda proof: proof.tokens))
"""Every kind of canary a server needs, long enough, where speculation cannot be seen (see DraftProof)."""


def _unproven_kinds(endpoints: Sequence[EndpointEvidence]) -> list[str]:
    """What is missing for the canaries that did not draft to prove every n-gram type off: none, once each kind of
    endpoint had one long enough that the types drafting there would have drafted."""
    proven = set()
    for evidence in endpoints:
        spec = _SPECS.get(evidence.endpoint)
        if spec is not None and evidence.tally is not None and evidence.tally.tokens >= spec.proof.tokens:
            proven.add(spec.proof)
    return [f"{proof.tokens} tokens or more on a {proof.kind} endpoint "
            f"({', '.join(e.value for e, spec in TABLE.items() if spec.proof == proof)})"
            for proof in PROOFS if proof not in proven]


def decide(evidence: Evidence) -> Decision:
    """The verdict, by precedence: not loaded or cannot poll, fill-ins seen, an endpoint unchecked, unproven, clean.

    Fill-ins outrank a failing endpoint: they are proof, whatever the other endpoints do. Nothing is clean
    unless every endpoint asked was checked.
    """
    if evidence.model_status == "sleeping":
        return Decision(
            Verdict.UNCHECKED,
            "the model is sleeping (--sleep-idle-seconds): specwatch never wakes or loads a model to check it",
        )
    if evidence.model_status not in (None, "loaded"):
        return Decision(
            Verdict.UNCHECKED,
            f"the model is {evidence.model_status}, not loaded: specwatch never loads a model to check it",
        )
    if evidence.poll_failure is not None:
        return Decision(Verdict.UNCHECKED, f"could not poll the server: {evidence.poll_failure}")
    checked = [e for e in evidence.endpoints if e.tally is not None]
    fill_ins = [e for e in checked if e.tally is not None and e.tally.fill_ins > 0]
    if fill_ins:
        counts = ", ".join(f"{e.endpoint} {_counts(e.tally)}" for e in fill_ins if e.tally is not None)
        return Decision(
            Verdict.FILL_INS,
            f"the server serves fill-in logprobs (fill-ins / tokens after the first: {counts}); do not score",
        )
    if not evidence.endpoints:
        return Decision(Verdict.UNCHECKED, "no canary has run yet")
    unchecked = [e for e in evidence.endpoints if e.failure is not None or e.tally is None]
    if unchecked:
        why = "; ".join(f"{e.endpoint}: {e.failure or 'no canary yet'}" for e in unchecked)
        return Decision(Verdict.UNCHECKED, f"could not check every endpoint: {why}")
    drafted = any(e.tally is not None and e.tally.drafted for e in evidence.endpoints)
    # A witness that says speculation comes first: with /slots off, a /props that tells the truth (upstream #28119)
    # is one, and no canary length can clear what it says.
    if (evidence.speculation_slots or evidence.speculation_props) and not drafted:
        source = "/slots" if evidence.speculation_slots else "/props"
        return Decision(
            Verdict.UNPROVEN,
            f"{source} says the server speculates, but no canary drafted (timings.draft_n), "
            "so its logprobs are not proven real; do not score",
        )
    if evidence.speculation_slots is None and not drafted and (missing := _unproven_kinds(evidence.endpoints)):
        had = ", ".join(f"{e.endpoint} {e.tally.tokens}" for e in evidence.endpoints if e.tally is not None)
        return Decision(
            Verdict.UNPROVEN,
            "speculation cannot be seen (/slots is off or not reachable) and no canary was long enough to make every "
            f"n-gram type draft: that needs a canary of {' and one of '.join(missing)}, and it had {had}; "
            "so its logprobs are not proven real; do not score",
        )
    if drafted:
        return Decision(Verdict.CLEAN, "the server drafted and still returned real logprobs with alternatives")
    return Decision(Verdict.CLEAN, "logprobs are real: every token carries its alternatives")


def worst(decisions: Iterable[tuple[str, Decision]]) -> tuple[str, Decision]:
    """The worst of several verdicts (models of a router, servers behind one address), with the name it belongs to."""
    named = list(decisions)
    if not named:
        raise ValueError("worst() of nothing: a selection that matched nothing has no verdict")
    return min(named, key=lambda pair: SEVERITY.index(pair[1].verdict))


# ---- After decide(): every rule that turns decided verdicts into the one a gate answers (runner, check, ask) -------

def worth_another_pass(decision: Decision) -> bool:
    """Whether a full round canaries again: n-gram speculation drafts on a second pass, so an unproven model may be proven."""
    return decision.verdict is Verdict.UNPROVEN


NO_V1_ENDPOINT_ASKED = Decision(
    Verdict.UNCHECKED, "only /v1/* answers here (an OpenAI-compatible front end?), and the endpoints asked for need "
    "/completion: ask for v1_completion or chat")


def load_failed(failure: ProbeFailure) -> Decision:
    """`check --load` could not load the model asked for, so nothing was canaried."""
    return Decision(Verdict.UNCHECKED, f"could not load the model: {failure}")


NOTHING_LOADED = Decision(Verdict.UNCHECKED, "the router has no model loaded, and specwatch loads none")


@dataclass(frozen=True)
class ModelDecision:
    """One model of a router, as its verdict counts towards the router's."""

    name: str
    loaded: bool
    decision: Decision


def router_verdict(models: Sequence[ModelDecision], *, one_asked: bool) -> Decision:
    """A router's verdict: the model asked for, or else its worst loaded model's, since an eval may be sent to any."""
    counted = [(m.name, m.decision) for m in models if one_asked or m.loaded]
    if not counted:
        return NOTHING_LOADED
    name, decision = worst(counted)
    if len(models) > 1:
        verdicts = ", ".join(f"{m.name}: {m.decision.verdict.value}" for m in models)
        decision = Decision(decision.verdict, f"{decision.summary} (model {name}; models: {verdicts})")
    return decision


def behind_a_balancer(decision: Decision, signs: Sequence[str], *, hint: str) -> Decision:
    """Answers from more than one server (`signs`): fill-ins seen stay proof, anything else is unchecked (`hint`: what next)."""
    if not signs:
        return decision
    said = "; ".join(signs)
    if decision.verdict is Verdict.FILL_INS:
        return Decision(Verdict.FILL_INS, f"{decision.summary}; answers cannot come from one server: {said}; a load "
                        "balancer in front spreads requests over replicas, and at least one of them serves fill-ins an "
                        "eval sent here may read (specwatch check --exporter URL says which)")
    return Decision(Verdict.UNCHECKED, f"answers cannot come from one server: {said}; {hint}")


def key_hint(decision: Decision, poll_failure: Reason | None, *, key_sent: bool, give: str) -> Decision:
    """An unauthorised poll says whether a key went with it: refused, or missing and how to give one (`give`: the front
    end's flags for a key)."""
    if poll_failure is not Reason.UNAUTHORIZED:
        return decision
    hint = "the API key sent was refused" if key_sent else f"no API key was sent: give {give}"
    return Decision(decision.verdict, f"{decision.summary}; {hint}")


def through_a_front_end(decision: Decision) -> Decision:
    """A front end that forwards only /v1/* hides speculation: the summary says the verdict rests on /v1 alone."""
    return Decision(decision.verdict, f"{decision.summary} (through a front end that forwards only /v1/*: /props and "
                    "/slots answer 404 there, so speculation cannot be seen; judged from the /v1 endpoints)")


@dataclass(frozen=True)
class Disagreement:
    """A replica that differs from its peer group (specwatch.core.peers), as a gate names it."""

    name: str
    """The server, and a router's model after a slash."""
    kind: str
    """fingerprint or answers."""
    held_against: tuple[str, ...]
    detail: str


DISAGREEING_EXIT_CODE = 1
"""A gate's exit code when a replica it selected differs from its peers: as for fill-ins, do not score."""


def among_peers(decision: Decision, disagreements: Sequence[Disagreement],
                undecided: Sequence[str] = (), *, referenced: bool = False) -> tuple[Decision, int]:
    """The fill-in verdict kept, the peer judgement said first: a replica that differs makes a gate exit 1, one the
    test could not decide on 2 (never clean). `referenced`: the servers were held to a reference file as well."""
    if disagreements:
        alone = "the reference" if referenced else "the others"
        each = "; ".join(f"{d.name} ({d.kind}: {d.detail}; held against {', '.join(d.held_against) or alone})"
                         for d in disagreements)
        said = (f"{len(disagreements)} replica(s) differ from {'the reference or ' if referenced else ''}their peer "
                f"group, so an eval routed across them mixes models: {each}")
        return Decision(decision.verdict, f"{said}; {decision.summary}"), DISAGREEING_EXIT_CODE
    if undecided:
        said = (f"the peer test has not told whether {', '.join(undecided)} answer as their peers do (too few rounds "
                "answered, rounds left unanswered, or answers off by more than the noise but not yet by enough to "
                "decide): check again")
        code = decision.verdict.exit_code or Verdict.UNCHECKED.exit_code  # a verdict that says "do not score" stays
        return Decision(decision.verdict, f"{said}; {decision.summary}"), code
    return decision, decision.verdict.exit_code


@dataclass(frozen=True)
class Freshness:
    """How recent the evidence is behind a verdict a daemon holds, and whether the daemon counts it fresh."""

    fresh: bool
    age: float | None
    """Seconds since every endpoint was last confirmed by a successful canary; None until each has been."""
    bound: float
    """The most `age` may be (cadence.freshness_bound)."""
    poll_age: float | None
    """Seconds since the last good poll; None without one."""
    poll_bound: float

    @classmethod
    def measured(cls, *, age: float | None, bound: float, poll_age: float | None, poll_bound: float) -> Freshness:
        """The daemon's rule: fresh while its polls are recent and every endpoint was confirmed within the bound."""
        fresh = not _poll_stale(poll_age, poll_bound) and age is not None and age <= bound
        return cls(fresh, age, bound, poll_age, poll_bound)


def _poll_stale(poll_age: float | None, poll_bound: float) -> bool:
    return poll_age is None or poll_age > poll_bound


def held(decision: Decision, freshness: Freshness) -> Decision:
    """A verdict a daemon holds, as a gate may use it: a stale clean (or unproven) is unchecked; fill-ins stay proof."""
    # An unchecked verdict already says why (the server down, a model not loaded): "stale" would bury that reason.
    if freshness.fresh or decision.verdict in (Verdict.FILL_INS, Verdict.UNCHECKED):
        return decision
    if _poll_stale(freshness.poll_age, freshness.poll_bound):
        why = "the exporter has no recent poll of it" if freshness.poll_age is None else (
            f"the exporter's last good poll of it is {freshness.poll_age:.0f}s old (more than {freshness.poll_bound:.0f}s)")
    elif freshness.age is None:
        why = "not every endpoint has a successful canary yet"
    else:
        # Also where the daemon's rounded figures sit on the bound: it said stale, and it measured unrounded.
        why = f"its canaries last confirmed it {freshness.age:.0f}s ago, more than its {freshness.bound:.0f}s bound"
    return Decision(Verdict.UNCHECKED, f"stale: {why} (was {decision.verdict.value}: {decision.summary})")


def selection_verdict(found: Sequence[tuple[str, Decision]], *, any_watched: bool, selection: str) -> Decision:
    """What a gate selected from the daemons: the worst of it, named when several; unchecked when nothing matched."""
    if not found:
        if any_watched:
            return NOTHING_LOADED
        return Decision(Verdict.UNCHECKED, f"nothing the exporter(s) watch matches the selection ({selection})")
    name, decision = worst(found)
    if len(found) > 1:
        decision = Decision(decision.verdict, f"{name}: {decision.summary} (worst of {len(found)} selected)")
    return decision
