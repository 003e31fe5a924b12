"""A poll that changes nothing the verdict reads keeps the decision; any that does gets a new one, the same as decide()."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.core.state import CanaryState, ModelState
from specwatch.core.verdict import Verdict, decide
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import Tally
from specwatch.probe.llama import Props, Slots
from specwatch.probe.probes import ModelPoll, PollResult

ENDPOINTS = (Endpoint.COMPLETION, Endpoint.CHAT)


def _poll(*, speculative: bool = False, marker: str = "p1", slots: bool = True) -> ModelPoll:
    props = Props("none", 1, "m.gguf", "b1", 2048, media_marker=marker)
    return ModelPoll("loaded", PollResult(props, Slots(1, speculative) if slots else None))


def _canaried(fill_ins: int = 0) -> ModelState:
    model = ModelState("", ENDPOINTS).polled(_poll(), 0.0)
    tally = Tally(8, fill_ins, -0.3, None, None)
    return replace(model, canaries={e: CanaryState(0.1, 1.0, tally, 1.0, None) for e in ENDPOINTS})


def test_a_poll_that_changes_nothing_keeps_the_decision_made() -> None:
    model = _canaried()
    decided = model.decision
    again = model.polled(_poll(), 15.0)
    assert decided.verdict is Verdict.CLEAN
    assert again.decision is decided and again.poll is not model.poll  # the new answers, the same decision


@pytest.mark.parametrize(("poll", "verdict"), [
    (ModelPoll("loaded", None), Verdict.UNCHECKED),                  # /props failed for this model
    (ModelPoll("sleeping", None), Verdict.UNCHECKED),                # a router's model unloaded or asleep
    (_poll(speculative=True), Verdict.UNCHECKED),                    # speculation on: another setup, canaries dropped
    (_poll(slots=False), Verdict.UNCHECKED),                         # /slots switched off: another setup too
])
def test_a_poll_that_changes_what_the_verdict_reads_decides_again(poll: ModelPoll, verdict: Verdict) -> None:
    model = _canaried()
    decided = model.decision
    after = model.polled(poll, 15.0)
    assert after.decision is not decided
    assert after.decision == decide(after.evidence()) and after.decision.verdict is verdict


def test_a_decision_never_made_is_not_made_up() -> None:
    model = _canaried(fill_ins=3)
    after = model.polled(_poll(), 15.0)  # the state before was never asked for its decision
    assert "decision" not in after.__dict__
    assert after.decision == decide(after.evidence()) and after.decision.verdict is Verdict.FILL_INS
