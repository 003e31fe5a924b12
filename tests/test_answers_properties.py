"""Property tests: the parsers and the classifier take any JSON and fail only with ProbeFailure; the classifier's invariants."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from specwatch.durations import parse_duration
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE, classify
from specwatch.probe.http.fetch import parse_json
from specwatch.probe.llama import MAX_LABEL_CHARS, MAX_SLOTS, model_names, parse_props, parse_slots
from specwatch.probe.readers import Reading, Token
from specwatch.reasons import ProbeFailure, Reason
from tests.support.wire import FakeLlama

settings.register_profile("specwatch", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("specwatch")

HUGE = 10**400
scalars = (
    st.none() | st.booleans() | st.integers() | st.sampled_from([HUGE, -HUGE, 2**63, -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
    | st.sampled_from(["\ud800", "none", "draft", "", "0.5", "-0.3"])
)
any_json = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=25
)


def maybe(value: st.SearchStrategy) -> st.SearchStrategy:
    """The value, or something of the wrong kind: shapes a broken or hostile server could send."""
    return value | scalars | st.lists(scalars, max_size=2) | st.dictionaries(st.text(max_size=5), scalars, max_size=2)


alternative = st.fixed_dictionaries({"token": st.text(max_size=3), "logprob": maybe(st.floats(max_value=0))})
alternatives = st.lists(alternative, max_size=3)
entry = st.fixed_dictionaries(
    {},
    optional={
        "token": maybe(st.text(max_size=4)),
        "logprob": maybe(st.floats(min_value=-50, max_value=0)),
        "prob": maybe(st.floats(min_value=0, max_value=1)),
        "top_logprobs": maybe(alternatives),
        "top_probs": maybe(alternatives),
    },
)
entries = maybe(st.lists(entry, max_size=6))
timings = maybe(st.fixed_dictionaries({}, optional={"draft_n": maybe(st.integers(min_value=0)),
                                                     "draft_n_accepted": maybe(st.integers(min_value=0))}))
choice = st.fixed_dictionaries(
    {},
    optional={
        "logprobs": maybe(st.fixed_dictionaries({}, optional={"content": entries})),
        "delta": maybe(st.fixed_dictionaries({}, optional={"content": maybe(st.text(max_size=4))})),
        "message": maybe(st.fixed_dictionaries({"content": st.text(max_size=4)})),
    },
)
chat_body = maybe(st.fixed_dictionaries({}, optional={"choices": maybe(st.lists(maybe(choice), max_size=2)), "timings": timings}))
completion_body = maybe(st.fixed_dictionaries({}, optional={
    "completion_probabilities": entries, "content": maybe(st.text(max_size=4)), "timings": timings,
}))
props_body = maybe(st.fixed_dictionaries({}, optional={
    "default_generation_settings": maybe(st.fixed_dictionaries({}, optional={
        "params": maybe(st.fixed_dictionaries({}, optional={"speculative.types": maybe(st.sampled_from(["none", "draft"]))}))
    })),
    "total_slots": maybe(st.integers()),
    "model_alias": maybe(st.text(max_size=300)),
    "model_path": maybe(st.text(max_size=30)),
    "build_info": maybe(st.text(max_size=300)),
}))
slots_body = maybe(st.lists(maybe(st.fixed_dictionaries({"id": st.integers(0, 8)}, optional={
    "speculative": maybe(st.booleans()), "next_token": maybe(st.lists(any_json, max_size=1)),
})), max_size=4))
endpoints = st.sampled_from(list(Endpoint))


def body_for(endpoint: Endpoint) -> st.SearchStrategy:
    return chat_body if endpoint in (Endpoint.CHAT, Endpoint.CHAT_STREAM) else completion_body


def check_tokens(reading: Reading) -> None:
    for token in reading.tokens:
        finite = isinstance(token.logprob, float) and math.isfinite(token.logprob)
        assert token.logprob is None or (finite and token.logprob <= 1e-6)
        assert token.alternatives is None or (isinstance(token.alternatives, int) and token.alternatives >= 0)
    for count in (reading.draft_n, reading.draft_accepted):
        # Every number that reaches a metric must render as a float.
        assert count is None or (isinstance(count, int) and 0 <= count and math.isfinite(float(count)))


def expect_probe_failure(run) -> Any:
    try:
        return run()
    except ProbeFailure as failure:
        assert isinstance(failure.reason, Reason)
        return None


@given(data=props_body | any_json)
@example(data={"default_generation_settings": {}, "total_slots": HUGE})
@example(data={"default_generation_settings": {}, "model_alias": "\ud800" * 1000})
def test_parse_props_fails_only_with_probe_failure(data: Any) -> None:
    props = expect_probe_failure(lambda: parse_props(data))
    model_names(data)
    if props is not None:
        assert props.total_slots is None or 0 <= props.total_slots <= MAX_SLOTS
        for label in (props.model, props.build):
            assert len(label) <= MAX_LABEL_CHARS
            label.encode("utf-8")  # a label that cannot be encoded would fail every scrape
        assert props.speculative in (None, True, False)


@given(data=slots_body | any_json)
def test_parse_slots_fails_only_with_probe_failure(data: Any) -> None:
    slots = expect_probe_failure(lambda: parse_slots(data))
    if slots is not None:
        assert slots.count == len(data)
        assert slots.speculative == any(slot["speculative"] for slot in data)


@settings(max_examples=400)
@given(endpoint=endpoints, data=st.data())
def test_responses_of_any_shape_fail_only_with_probe_failure(endpoint: Endpoint, data: st.DataObject) -> None:
    spec = TABLE[endpoint]
    if spec.streaming:
        answer = data.draw(st.lists(body_for(endpoint) | any_json, max_size=5))
    else:
        answer = data.draw(body_for(endpoint) | any_json)
    parsed = expect_probe_failure(lambda: spec.read(answer))
    if parsed is not None:
        check_tokens(parsed)
        tally = expect_probe_failure(lambda: classify(parsed))
        if tally is not None:
            assert 0 <= tally.fill_ins <= tally.tokens - 1
            assert 0.0 <= tally.fill_in_ratio <= 1.0


@pytest.mark.parametrize("number", [HUGE, -HUGE, math.nan, math.inf, -math.inf, 2**63, "-0.5", True],
                         ids=["1e400", "-1e400", "nan", "inf", "-inf", "2**63", "string", "bool"])
@pytest.mark.parametrize("endpoint", [Endpoint.COMPLETION, Endpoint.COMPLETION_POST_SAMPLING, Endpoint.COMPLETION_STREAM])
def test_hostile_numbers_fail_only_with_probe_failure(number: Any, endpoint: Endpoint) -> None:
    """Numbers JSON allows but no float can hold, or of the wrong type, in every numeric field the canary reads."""
    real = {"logprob": -0.5, "prob": 0.5, "top_logprobs": [{"logprob": -1.0}], "top_probs": [{"prob": 0.2}]}
    for field in ("logprob", "prob", "draft_n"):
        entries = [real, {**real, field: number}]
        body = {"completion_probabilities": entries, "timings": {"draft_n": number if field == "draft_n" else 3}}
        spec = TABLE[endpoint]
        answer = [body] if spec.streaming else body
        parsed = expect_probe_failure(lambda answer=answer, spec=spec: spec.read(answer))
        if parsed is not None:
            check_tokens(parsed)


@given(body=st.binary(max_size=200) | any_json.map(lambda v: json.dumps(v, allow_nan=True).encode()))
@example(body=b'{"a": NaN}')
@example(body=b"1" * 5000)
def test_parse_json_is_strict_and_fails_only_with_probe_failure(body: bytes) -> None:
    value = expect_probe_failure(lambda: parse_json(body))
    json.dumps(value, allow_nan=False)  # raises on any NaN or Infinity that got through


tokens = st.builds(
    Token,
    logprob=st.none() | st.floats(min_value=-100, max_value=0),
    alternatives=st.none() | st.integers(min_value=0, max_value=5),
)


def is_fill_in(token: Token) -> bool:
    return token.logprob is None or not token.alternatives


@given(found=st.lists(tokens, max_size=40), drafted=st.none() | st.integers(0, 100))
def test_classify_invariants(found: list[Token], drafted: int | None) -> None:
    try:
        tally = classify(Reading(found, drafted))
    except ProbeFailure as failure:
        assert failure.reason is Reason.NO_LOGPROBS
        assert not found or all(t.logprob is None for t in found) or all(t.alternatives is None for t in found)
        return
    assert tally.tokens == len(found)
    assert 0 <= tally.fill_ins <= tally.tokens - 1
    assert tally.fill_ins == sum(is_fill_in(t) for t in found[1:])
    assert 0.0 <= tally.fill_in_ratio <= 1.0
    values = [t.logprob for t in found if t.logprob is not None]
    assert tally.mean_logprob is not None and min(values) - 1e-9 <= tally.mean_logprob <= max(values) + 1e-9
    assert tally.draft_n == drafted


@given(rest=st.lists(tokens, min_size=1, max_size=20), first=tokens, other_first=tokens)
def test_the_first_token_is_never_counted(rest: list[Token], first: Token, other_first: Token) -> None:
    real = Token(logprob=-0.5, alternatives=3)
    one = classify(Reading([first, real, *rest]))
    two = classify(Reading([other_first, real, *rest]))
    assert one.fill_ins == two.fill_ins


@given(fill_ins=st.sets(st.integers(0, 15)), zeros=st.sets(st.integers(0, 15)), endpoint=endpoints)
def test_fill_ins_are_counted_exactly_and_a_real_zero_is_not_one(fill_ins: set[int], zeros: set[int],
                                                                 endpoint: Endpoint) -> None:
    assume(0 not in fill_ins)  # the first token is always real on a real server
    fake = FakeLlama(speculative=True, fill_ins=fill_ins, tokens=16, real_zero_at=zeros)
    spec = TABLE[endpoint]
    response = fake(httpx.Request("POST", f"http://fake{spec.path}", json=spec.body(16)))
    if spec.streaming:
        lines = [line for line in response.text.splitlines() if line.startswith("data:") and "[DONE]" not in line]
        answer: Any = [json.loads(line[5:]) for line in lines]
    else:
        answer = response.json()
    tally = classify(spec.read(answer))
    assert (tally.tokens, tally.fill_ins) == (16, len(fill_ins))


@given(hours=st.integers(0, 48), minutes=st.integers(0, 59), seconds=st.integers(0, 59), millis=st.integers(0, 999))
def test_parse_duration_adds_its_parts(hours: int, minutes: int, seconds: int, millis: int) -> None:
    parts = [(hours, "h"), (minutes, "m"), (seconds, "s"), (millis, "ms")]
    text = "".join(f"{n}{unit}" for n, unit in parts if n)
    assume(text)
    assert parse_duration(text) == pytest.approx(hours * 3600 + minutes * 60 + seconds + millis / 1000)


@given(value=st.text(max_size=20) | st.floats(allow_nan=True, allow_infinity=True) | st.integers() | st.booleans()
       | st.none() | st.sampled_from(["1e400", "nan", "-5s", "0s", "1h-1m", "15 s", "1_0"]))
def test_parse_duration_is_positive_finite_or_value_error(value: Any) -> None:
    try:
        seconds = parse_duration(value)
    except ValueError:
        return
    assert isinstance(seconds, float) and 0 < seconds < math.inf
