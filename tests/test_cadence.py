"""When canaries are due: at once after a change, one endpoint per interval otherwise, none for a model that cannot answer."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

from specwatch.core.state import CanaryState, ModelState
from specwatch.daemon.cadence import MAX_STRETCH, due, spacing
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import Tally
from specwatch.probe.llama import Props, Slots
from specwatch.probe.probes import ModelPoll, PollResult
from specwatch.reasons import Reason

ENDPOINTS = (Endpoint.COMPLETION, Endpoint.CHAT, Endpoint.CHAT_STREAM)
INTERVAL = 60.0


def _result(*, speculative: bool = False, build: str = "b1") -> PollResult:
    return PollResult(Props("none", 1, "m.gguf", build, 2048), Slots(1, speculative))


def _polled(model: ModelState | None = None, **kw: object) -> ModelState:
    return (model or ModelState("", ENDPOINTS)).polled(ModelPoll("loaded", _result(**kw)), 0.0)


def _after_round(model: ModelState, now: float, endpoints: tuple[Endpoint, ...] = ENDPOINTS, *, ok: bool = True,
                 full: bool = True) -> ModelState:
    canaries = dict(model.canaries)
    for endpoint in endpoints:
        canaries[endpoint] = CanaryState(0.1, now, Tally(8, 0, -0.3, None, None) if ok else None,
                                         now if ok else None, None if ok else Reason.TIMEOUT)
    changed = {"canaries": canaries, "rotated_at": now}
    if full:
        changed.update(full_round_due=None, full_round_at=now)
    return replace(model, **changed)


def test_a_new_model_gets_every_endpoint_at_once() -> None:
    found = due(_polled(), 0.0, interval=INTERVAL)
    assert found is not None and found.endpoints == ENDPOINTS and found.full


def test_nothing_is_due_for_a_model_that_cannot_answer() -> None:
    never_polled = ModelState("", ENDPOINTS)
    failed = replace(_polled(), poll=None, poll_failure="timeout: no answer")
    unloaded = _polled().polled(ModelPoll("unloaded"), 0.0)
    assert [due(m, 0.0, interval=INTERVAL) for m in (never_polled, failed, unloaded)] == [None, None, None]


def test_a_steady_model_gets_one_endpoint_per_interval_in_turn() -> None:
    model = _after_round(_polled(), 0.0)
    assert due(model, 59.0, interval=INTERVAL) is None
    seen = []
    now = 60.0
    for _ in range(6):
        found = due(model, now, interval=INTERVAL)
        assert found is not None and len(found.endpoints) == 1 and not found.full
        seen.append(found.endpoints[0])
        model = _after_round(model, now, found.endpoints, full=False)
        now += INTERVAL
    assert seen == list(ENDPOINTS) * 2  # every endpoint confirmed every interval x endpoints


def test_a_change_seen_by_the_poll_makes_a_full_round_due_at_once() -> None:
    model = _after_round(_polled(), 0.0)
    for change in ({"speculative": True}, {"build": "b2"}):
        changed = _polled(model, **change)
        found = due(changed, 1.0, interval=INTERVAL)
        assert found is not None and found.full, change
        assert changed.canaries == {}  # what ran before the change says nothing about what runs now


def test_a_model_that_comes_back_gets_a_full_round_at_most_once_per_interval() -> None:
    model = _after_round(_polled(), 0.0)
    back = _polled(replace(model, poll=None, poll_failure="connection_refused: down"))
    assert back.canaries == model.canaries  # same fingerprint: its verdict holds until the round ends
    assert due(back, 30.0, interval=INTERVAL) is None  # a full round 30 s ago: a flapping server costs no more
    found = due(back, 61.0, interval=INTERVAL)
    assert found is not None and found.full


def test_a_failing_endpoint_is_retried_after_one_interval_besides_the_rotation() -> None:
    model = _after_round(_polled(), 0.0)
    model = _after_round(model, 60.0, (Endpoint.COMPLETION,), ok=False, full=False)
    found = due(model, 120.0, interval=INTERVAL)
    assert found is not None and set(found.endpoints) == {Endpoint.CHAT, Endpoint.COMPLETION}


def _hour_of_ticks(model: ModelState, *, poll: float = 15.0, **tokens: int) -> list[float]:
    """The times periodic canaries start over an hour of polls every `poll` seconds after a first full round."""
    model = _after_round(model, 0.0)
    started = []
    now = poll
    while now <= 3600.0:
        found = due(model, now, interval=INTERVAL, **tokens)
        if found is not None:
            assert not found.full and len(found.endpoints) == 1
            started.append(now)
            model = _after_round(model, now, found.endpoints, full=False)
        now += poll
    return started


def test_canaries_keep_their_interval_when_polls_take_a_few_milliseconds_more_or_less() -> None:
    """Found by the network-fault test (polls every 1 s, canaries every 2 s): a round begun after a 5 ms poll was not due
    after a 4 ms one, so canaries came 3 s apart about half the time. Time since a round is counted in polls."""
    jitter = random.Random(7)
    for interval, poll in ((2.0, 1.0), (INTERVAL, 15.0), (50.0, 15.0)):
        counted, exact = [], []
        for poll_interval in (poll, 0.0):
            model = _after_round(_polled(), 0.0 + jitter.uniform(0.002, 0.03))
            started = []
            for tick in range(1, int(3600 / poll) + 1):
                now = tick * poll + jitter.uniform(0.002, 0.03)  # each poll's answer takes a few ms
                found = due(model, now, interval=interval, poll_interval=poll_interval)
                if found is not None:
                    started.append(now)
                    model = _after_round(model, now, found.endpoints, full=False)
            (counted if poll_interval else exact).extend(b - a for a, b in itertools.pairwise(started))
        # Never sooner than the interval allows, never a poll later than the first poll at or after it.
        wanted = math.ceil(interval / poll) * poll
        assert min(counted) > wanted - poll / 2 and max(counted) < wanted + poll / 2, (interval, poll)
        if interval % poll == 0:
            assert max(exact) > wanted + poll / 2, (interval, poll)  # what it did before: a poll late, now and then


def test_a_larger_canary_comes_less_often_so_a_speculating_server_costs_at_most_twice_a_plain_one() -> None:
    plain, speculating = _polled(), _polled(speculative=True)
    no_slots = replace(plain, poll=PollResult(plain.poll.props, None))  # speculation unknown: canaried as if on
    assert not plain.suspect and speculating.suspect and no_slots.suspect
    assert spacing(plain, interval=INTERVAL) == INTERVAL
    assert spacing(speculating, interval=INTERVAL) == spacing(no_slots, interval=INTERVAL) == 2 * INTERVAL
    for model, size, per_hour in ((plain, 8, 480), (speculating, 32, 960), (no_slots, 32, 960)):
        canaries = _hour_of_ticks(model)
        assert len(canaries) * size == per_hour, (model.suspect, canaries)  # every periodic canary on time: the most
        assert per_hour <= 1440  # a tenth of the 14,400 tokens an hour of five 48-token canaries a minute


def test_the_configured_canary_sizes_set_the_spacing() -> None:
    speculating = _polled(speculative=True)
    assert spacing(speculating, interval=INTERVAL, tokens=16, tokens_speculating=16) == INTERVAL
    assert spacing(speculating, interval=INTERVAL, tokens=16, tokens_speculating=8) == INTERVAL  # never more often
    assert spacing(speculating, interval=INTERVAL, tokens=16, tokens_speculating=24) == 1.5 * INTERVAL
    model = _after_round(speculating, 0.0)
    assert due(model, 60.0, interval=INTERVAL, tokens=16, tokens_speculating=16) is not None
    assert due(model, 60.0, interval=INTERVAL) is None  # the defaults: 32 tokens every 2 x 60 s
    assert due(model, 119.0, interval=INTERVAL) is None
    assert due(model, 120.0, interval=INTERVAL) is not None


def test_no_model_goes_long_enough_without_a_canary_for_the_stale_warning() -> None:
    # SpecwatchCanaryStale: no successful canary for 2.5 x canary_interval, for 2m more.
    for tokens, speculating in ((8, 32), (4, 512), (8, 8)):
        model = _polled(speculative=True)
        assert spacing(model, interval=INTERVAL, tokens=tokens, tokens_speculating=speculating) <= MAX_STRETCH * INTERVAL
    assert MAX_STRETCH * INTERVAL + 15.0 < 2.5 * INTERVAL  # a canary one poll late is still not stale


def test_a_change_on_a_speculating_model_still_gets_a_full_round_at_once() -> None:
    model = _after_round(_polled(speculative=True), 0.0)
    for change in ({"speculative": False}, {"speculative": True, "build": "b2"}):
        found = due(_polled(model, **change), 1.0, interval=INTERVAL)
        assert found is not None and found.full, change


def test_a_failing_endpoint_of_a_speculating_model_is_still_retried_after_one_interval() -> None:
    model = _after_round(_polled(speculative=True), 0.0)
    model = _after_round(model, 10.0, (Endpoint.CHAT,), ok=False, full=False)
    found = due(model, 70.0, interval=INTERVAL)
    assert found is not None and found.endpoints == (Endpoint.CHAT,) and not found.rotation
