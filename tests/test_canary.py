"""The token classifier and the canary response parsers, on the shapes docs/llama-server-behaviour.md records."""

from __future__ import annotations

import math

import pytest

from exporter.canary import Token, classify, request_for, tokens_from_events, tokens_from_response
from exporter.reasons import ProbeFailure, Reason
from exporter.settings import Endpoint
from tests.fakes import FakeLlama


def _answer(fake: FakeLlama, endpoint: Endpoint):
    import httpx

    path, body = request_for(endpoint, tokens=fake.tokens)
    response = fake(httpx.Request("POST", f"http://x{path}", json=body))
    if endpoint in (Endpoint.CHAT_STREAM, Endpoint.COMPLETION_STREAM):
        import json

        events = [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:") and "[DONE]" not in line]
        return tokens_from_events(endpoint, events)
    return tokens_from_response(endpoint, response.json())


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_plain_server_has_no_fill_ins(endpoint: Endpoint) -> None:
    verdict = classify(*_answer(FakeLlama.plain(tokens=16), endpoint))
    assert (verdict.tokens, verdict.placeholders) == (16, 0)
    assert verdict.mean_logprob == pytest.approx(math.log(0.7))


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_draft_server_fills_in_every_token_after_the_first(endpoint: Endpoint) -> None:
    verdict = classify(*_answer(FakeLlama.draft(tokens=16), endpoint))
    assert (verdict.tokens, verdict.placeholders, verdict.placeholder_ratio) == (16, 15, 1.0)
    assert verdict.draft_n == 16


def test_mean_logprob_is_what_an_eval_would_compute() -> None:
    verdict = classify(*_answer(FakeLlama.draft(tokens=16), Endpoint.CHAT))
    # The first token is real, the fill-ins add 0.0 each: the mean collapses toward zero.
    assert verdict.mean_logprob == pytest.approx(math.log(0.7) / 16)


def test_streaming_mean_uses_only_the_values_that_arrived() -> None:
    verdict = classify(*_answer(FakeLlama.draft(tokens=16), Endpoint.CHAT_STREAM))
    assert verdict.mean_logprob == pytest.approx(math.log(0.7))


def test_a_real_zero_logprob_with_alternatives_is_not_a_fill_in() -> None:
    fake = FakeLlama.plain(tokens=8, real_zero_at={3, 5})
    verdict = classify(*_answer(fake, Endpoint.COMPLETION))
    assert verdict.placeholders == 0


def test_ngram_style_mix_counts_only_the_fill_ins() -> None:
    fake = FakeLlama(speculative=True, fill_ins={4, 5, 6, 9}, drafts=6, tokens=12)
    verdict = classify(*_answer(fake, Endpoint.COMPLETION_POST_SAMPLING))
    assert (verdict.placeholders, verdict.placeholder_ratio) == (4, pytest.approx(4 / 11))


def test_the_first_token_is_always_real() -> None:
    assert classify([Token(0.0, 0), Token(-0.3, 3)]).placeholders == 0


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
        classify(tokens)
    assert caught.value.reason is Reason.NO_LOGPROBS


def test_chat_answer_without_logprobs_cannot_be_classified() -> None:
    body = {"choices": [{"message": {"content": "hi"}}]}
    tokens, _ = tokens_from_response(Endpoint.CHAT, body)
    with pytest.raises(ProbeFailure) as caught:
        classify(tokens)
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
        tokens_from_response(Endpoint.COMPLETION, body)
    assert caught.value.reason is Reason.INVALID_RESPONSE


def test_canary_requests_ask_for_alternatives_with_a_fixed_seed() -> None:
    path, body = request_for(Endpoint.CHAT, tokens=24, model="m")
    assert path == "/v1/chat/completions"
    assert (body["logprobs"], body["top_logprobs"], body["max_tokens"], body["model"]) == (True, 3, 24, "m")
    path, body = request_for(Endpoint.COMPLETION_POST_SAMPLING, tokens=24)
    assert (path, body["n_probs"], body["post_sampling_probs"], "model" in body) == ("/completion", 3, True, False)
    assert request_for(Endpoint.CHAT, tokens=8)[1]["seed"] == request_for(Endpoint.COMPLETION, tokens=8)[1]["seed"]
