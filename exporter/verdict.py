"""The one verdict on a server's logprobs (clean, fill_ins, unproven, unchecked), decided in one place for every consumer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from specwatch.probe.canary import TABLE, Tally


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


def _counts(tally: Tally) -> str:
    return f"{tally.fill_ins}/{tally.judged_tokens}"


PROOFS = tuple(sorted({spec.proof for spec in TABLE.values()}, key=lambda proof: proof.tokens))
"""Every kind of canary a server needs, long enough, where speculation cannot be seen (see DraftProof)."""


def _unproven_kinds(endpoints: Sequence[EndpointEvidence]) -> list[str]:
    """What is missing for the canaries that did not draft to prove every n-gram type off: none, once each kind of
    endpoint had one long enough that the types drafting there would have drafted."""
    proven = set()
    for evidence in endpoints:
        spec = TABLE.get(evidence.endpoint)  # type: ignore[call-overload]  # StrEnum keys: the plain value finds them
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
    if evidence.speculation_slots is None and not drafted and (missing := _unproven_kinds(evidence.endpoints)):
        had = ", ".join(f"{e.endpoint} {e.tally.tokens}" for e in evidence.endpoints if e.tally is not None)
        return Decision(
            Verdict.UNPROVEN,
            "speculation cannot be seen (/slots is off or not reachable) and no canary was long enough to make every "
            f"n-gram type draft: that needs a canary of {' and one of '.join(missing)}, and it had {had}; "
            "so its logprobs are not proven real; do not score",
        )
    if (evidence.speculation_slots or evidence.speculation_props) and not drafted:
        source = "/slots" if evidence.speculation_slots else "/props"
        return Decision(
            Verdict.UNPROVEN,
            f"{source} says the server speculates, but no canary drafted (timings.draft_n), "
            "so its logprobs are not proven real; do not score",
        )
    if drafted:
        return Decision(Verdict.CLEAN, "the server drafted and still returned real logprobs with alternatives")
    return Decision(Verdict.CLEAN, "logprobs are real: every token carries its alternatives")


NOTHING_LOADED = Decision(Verdict.UNCHECKED, "the router has no model loaded, and specwatch loads none")


def worst(decisions: Iterable[tuple[str, Decision]]) -> tuple[str, Decision]:
    """The worst of several verdicts (models of a router, servers behind one address), with the name it belongs to."""
    named = list(decisions)
    if not named:
        raise ValueError("worst() of nothing: a selection that matched nothing has no verdict")
    return min(named, key=lambda pair: SEVERITY.index(pair[1].verdict))
