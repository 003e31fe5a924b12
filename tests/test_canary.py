"""The token classifier and the canary response parsers, on the shapes docs/llama-server-behaviour.md records."""

from __future__ import annotations

import math

import pytest

from exporter.probe.canary import TABLE, Endpoint, Reading, Token, classify
from exporter.reasons import ProbeFailure, Reason
from tests.support.wire import FakeLlama


def _answer(fake: FakeLlama, endpoint: Endpoint) -> Reading:
    import httpx

    spec = TABLE[endpoint]
    response = fake(httpx.Request("POST", f"http://x{spec.path}", json=spec.body(fake.tokens)))
    if spec.streaming:
        import json

        events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and "[DONE]" not in line]
        return spec.read(events)
    return spec.read(response.json())


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_plain_server_has_no_fill_ins(endpoint: Endpoint) -> None:
    tally = classify(_answer(FakeLlama.plain(tokens=16), endpoint))
    assert (tally.tokens, tally.fill_ins) == (16, 0)
    assert tally.mean_logprob == pytest.approx(math.log(0.7))


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_draft_server_fills_in_every_token_after_the_first(endpoint: Endpoint) -> None:
    tally = classify(_answer(FakeLlama.draft(tokens=16), endpoint))
    assert (tally.tokens, tally.fill_ins, tally.fill_in_ratio) == (16, 15, 1.0)
    assert tally.draft_n == 16


def test_mean_logprob_is_what_an_eval_would_compute() -> None:
    tally = classify(_answer(FakeLlama.draft(tokens=16), Endpoint.CHAT))
    # The first token is real, the fill-ins add 0.0 each: the mean collapses toward zero.
    assert tally.mean_logprob == pytest.approx(math.log(0.7) / 16)


def test_streaming_mean_uses_only_the_values_that_arrived() -> None:
    tally = classify(_answer(FakeLlama.draft(tokens=16), Endpoint.CHAT_STREAM))
    assert tally.mean_logprob == pytest.approx(math.log(0.7))


def test_a_real_zero_logprob_with_alternatives_is_not_a_fill_in() -> None:
    fake = FakeLlama.plain(tokens=8, real_zero_at={3, 5})
    tally = classify(_answer(fake, Endpoint.COMPLETION))
    assert tally.fill_ins == 0


def test_ngram_style_mix_counts_only_the_fill_ins() -> None:
    fake = FakeLlama(speculative=True, fill_ins={4, 5, 6, 9}, drafts=6, tokens=12)
    tally = classify(_answer(fake, Endpoint.COMPLETION_POST_SAMPLING))
    assert (tally.fill_ins, tally.fill_in_ratio) == (4, pytest.approx(4 / 11))


def test_the_first_token_is_always_real() -> None:
    assert classify(Reading([Token(0.0, 0), Token(-0.3, 3)])).fill_ins == 0


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([], "no tokens"),
        ([Token(None, None), Token(None, None)], "none came back"),
        ([Token(-0.1, None), Token(-0.2, None)], "alternatives were requested"),
    ],
)
def test_no_logprobs_is_cannot_tell_not_clean(tokens: list[Token], message: str) -> None:
    with pytest.raises(ProbeFailure, match=message) as caught:
        classify(Reading(tokens))
    assert caught.value.reason is Reason.NO_LOGPROBS


def test_chat_answer_without_logprobs_cannot_be_classified() -> None:
    body = {"choices": [{"message": {"content": "hi"}}]}
    reading = TABLE[Endpoint.CHAT].read(body)
    with pytest.raises(ProbeFailure) as caught:
        classify(reading)
    assert caught.value.reason is Reason.NO_LOGPROBS


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1, 2], "not a JSON object"),
        ({"completion_probabilities": "x"}, "is not a list"),
        ({"completion_probabilities": [{"logprob": "0.1", "top_logprobs": []}]}, "not a finite number"),
        ({"completion_probabilities": [{"logprob": 0.5, "top_logprobs": []}]}, "is positive"),
        ({"completion_probabilities": [{"logprob": -0.1, "top_logprobs": {}}]}, "not a list"),
        ({"completion_probabilities": [{"logprob": True, "top_logprobs": []}]}, "not a finite number"),
    ],
)
def test_wrong_shapes_are_invalid_responses(body: object, message: str) -> None:
    with pytest.raises(ProbeFailure, match=message) as caught:
        TABLE[Endpoint.COMPLETION].read(body)
    assert caught.value.reason is Reason.INVALID_RESPONSE


def test_canary_requests_ask_for_alternatives_with_a_fixed_seed() -> None:
    chat = TABLE[Endpoint.CHAT]
    body = chat.body(24)
    assert (chat.path, chat.streaming) == ("/v1/chat/completions", False)
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"], body["stream"]) == (True, 3, 24, False)
    post = TABLE[Endpoint.COMPLETION_POST_SAMPLING]
    body = post.body(24)
    assert (post.path, body["n_probs"], body["post_sampling_probs"], "model" in body) == ("/completion", 3, True, False)
    assert TABLE[Endpoint.CHAT].body(8)["seed"] == TABLE[Endpoint.COMPLETION].body(8)["seed"]


def test_the_table_covers_every_endpoint_and_streams_where_the_name_says() -> None:
    assert set(TABLE) == set(Endpoint)
    for endpoint, spec in TABLE.items():
        assert spec.endpoint is endpoint
        assert spec.streaming == endpoint.value.endswith("_stream") == spec.body(4)["stream"]
