"""The token classifier and the canary response parsers, on the shapes docs/llama-server-behaviour.md records."""

from __future__ import annotations

import math
import re

import pytest

from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE, classify, judge
from specwatch.probe.readers import Reading, Token
from specwatch.reasons import ProbeFailure, Reason
from tests.support import builds
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
    # At the canary's temperature 0, sampling keeps one candidate: post-sampling, every real token is certain.
    assert tally.mean_logprob == pytest.approx(0.0 if TABLE[endpoint].post_sampling else math.log(0.7))


@pytest.mark.parametrize("fake", [FakeLlama.plain(tokens=16), FakeLlama.fixed_build(tokens=16),
                                  FakeLlama.future_fixed(tokens=16)], ids=["plain", "fixed", "future"])
@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_judge_is_classify_where_the_values_are_what_was_asked(fake: FakeLlama, endpoint: Endpoint) -> None:
    assert judge(TABLE[endpoint], _answer(fake, endpoint)) == classify(_answer(fake, endpoint))


def test_pre_sampling_numbers_under_post_sampling_keys_fail_the_post_sampling_canary() -> None:
    fake = FakeLlama(speculative=True, fill_ins=set(range(1, 16)), drafts=12, tokens=16, pre_sampling_under_post=True)
    spec = TABLE[Endpoint.COMPLETION_POST_SAMPLING]
    reading = _answer(fake, Endpoint.COMPLETION_POST_SAMPLING)
    # Not fill-ins: every token has its value and its alternatives, only not the post-sampling ones.
    assert classify(reading).fill_ins == 0
    with pytest.raises(ProbeFailure) as caught:
        judge(spec, reading)
    assert caught.value.reason is Reason.NOT_POST_SAMPLING
    assert caught.value.detail == (
        "15 of 15 tokens after the first carry pre-sampling numbers under prob/top_probs (up to 3 alternatives, prob as "
        "low as 0.700; at temperature 0 a post-sampling token is prob 1.0 with one); the server drafted (timings.draft_n 12)")
    # Only the post-sampling canary asks for post-sampling values: the other endpoints of that build are real.
    assert judge(TABLE[Endpoint.COMPLETION], _answer(fake, Endpoint.COMPLETION)).fill_ins == 15
    # One such token is enough, and fill-ins on the same answer stay the verdict.
    one = FakeLlama(speculative=True, fill_ins={5}, drafts=1, tokens=16, pre_sampling_under_post=True)
    with pytest.raises(ProbeFailure, match="1 of 15 tokens"):
        judge(spec, _answer(one, Endpoint.COMPLETION_POST_SAMPLING))
    filled = judge(spec, _answer(FakeLlama.draft(tokens=16), Endpoint.COMPLETION_POST_SAMPLING))
    assert filled.fill_ins == 15


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


def test_openai_completions_ask_for_alternatives_the_openai_way() -> None:
    for endpoint, stream in ((Endpoint.V1_COMPLETION, False), (Endpoint.V1_COMPLETION_STREAM, True)):
        spec = TABLE[endpoint]
        body = spec.body(12)
        assert (spec.path, body["logprobs"], body["max_tokens"], body["stream"]) == ("/v1/completions", 3, 12, stream)
        assert "n_probs" not in body and "top_logprobs" not in body and "messages" not in body


def _legacy(entries: list[dict | None], values: list[float | None]) -> dict:
    """OpenAI's legacy completions logprobs, as a converting proxy in front of llama-server would send them."""
    return {"choices": [{"text": "x", "index": 0, "logprobs": {
        "tokens": [" a"] * len(values), "token_logprobs": values, "top_logprobs": entries, "text_offset": [0] * len(values)}}]}


@pytest.mark.parametrize(("body", "fill_ins"), [
    (_legacy([{" a": -0.3, " b": -2.0}] * 4, [-0.3] * 4), 0),
    # A fill-in converted: 0.0 with an empty or a null alternatives entry.
    (_legacy([{" a": -0.3, " b": -2.0}, {}, None, {}], [-0.3, 0.0, 0.0, 0.0]), 3),
    (_legacy([{" a": 0.0}, {" a": 0.0, " b": -9.0}, {}, {" a": -1.0}], [0.0, 0.0, 0.0, -1.0]), 1),
])
def test_the_legacy_completions_shape_is_read_too(body: dict, fill_ins: int) -> None:
    tally = classify(TABLE[Endpoint.V1_COMPLETION].read(body))
    assert (tally.tokens, tally.fill_ins) == (4, fill_ins)


def test_legacy_answers_without_alternatives_cannot_be_classified() -> None:
    body = {"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, 0.0], "top_logprobs": None}}]}
    with pytest.raises(ProbeFailure, match="alternatives were requested") as caught:
        classify(TABLE[Endpoint.V1_COMPLETION].read(body))
    assert caught.value.reason is Reason.NO_LOGPROBS


@pytest.mark.parametrize(("logprobs", "message"), [
    ("x", "is not an object"),
    ({"token_logprobs": "x"}, "token_logprobs is not a list"),
    ({"token_logprobs": [0.5]}, "not a logprob"),
    ({"token_logprobs": [-0.1, -0.2], "top_logprobs": [{}]}, "as long as token_logprobs"),
    ({"token_logprobs": [-0.1], "top_logprobs": [[" a"]]}, "top_logprobs[0] is not an object"),
])
def test_wrong_legacy_shapes_are_invalid_responses(logprobs: object, message: str) -> None:
    with pytest.raises(ProbeFailure, match=re.escape(message)) as caught:
        TABLE[Endpoint.V1_COMPLETION].read({"choices": [{"logprobs": logprobs}]})
    assert caught.value.reason is Reason.INVALID_RESPONSE


@pytest.mark.parametrize("endpoint", [e for e in Endpoint if e is not Endpoint.COMPLETION_POST_SAMPLING])
def test_a_placeholder_marked_in_a_field_of_its_own_is_never_real(endpoint: Endpoint) -> None:
    """A build that marks its placeholders (and lists alternatives even for them): the mark decides."""
    fake = FakeLlama(speculative=True, fill_ins={2, 3, 5}, drafts=6, tokens=8, placeholder_field="placeholder",
                     fill_in_alternatives=True)
    tally = classify(_answer(fake, endpoint))
    # Streaming, the speculated chunks carry no logprobs at all: fill-ins by absence, mark or not.
    assert tally.fill_ins == 3


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_token_field_specwatch_does_not_know_changes_nothing(endpoint: Endpoint) -> None:
    extra = (("speculative", True), ("draft", 1), ("placeholder", "yes"), ("source", "target"))
    plain = classify(_answer(FakeLlama.plain(tokens=8, token_extra=extra), endpoint))
    draft = classify(_answer(FakeLlama.draft(tokens=8, token_extra=extra), endpoint))
    assert (plain.fill_ins, draft.fill_ins) == (0, 7)


def test_counts_and_ratio_agree_on_what_is_judged() -> None:
    """specwatch_canary_tokens is the ratio's denominator: fill-ins / judged reaches 1.0 on a draft server."""
    tally = classify(_answer(FakeLlama.draft(tokens=16), Endpoint.V1_COMPLETION))
    assert (tally.judged_tokens, tally.fill_ins, tally.fill_in_ratio) == (15, 15, 1.0)
    assert tally.fill_ins / tally.judged_tokens == tally.fill_in_ratio


SPECULATION = {
    "plain": [],
    "draft-simple": ["-md", "{model}", "--spec-type", "draft-simple"],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-map-k": ["--spec-type", "ngram-map-k"],
}


@pytest.fixture(scope="module")
def cycle_model(tmp_path_factory: pytest.TempPathFactory):
    from specwatch.demo.tinymodel import write_cycle_model

    return write_cycle_model(tmp_path_factory.mktemp("canary") / "cycle.gguf")


@pytest.mark.real
@pytest.mark.parametrize("kind", list(SPECULATION))
@builds.each
async def test_every_endpoint_on_a_real_server_of_each_kind(build: str, kind: str, cycle_model) -> None:
    """Each build, fresh server per kind, every endpoint in the canary's order at the speculating size (32 tokens)."""
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.probe import probes
    from specwatch.probe.http.client import new_client
    from specwatch.probe.http.fetch import Fetcher
    from specwatch.settings.targets import ServerConfig

    args = [a.replace("{model}", str(cycle_model)) for a in SPECULATION[kind]]
    with LlamaServer(cycle_model, args, build=builds.get(build)) as server:
        target = ServerConfig(name=kind, url=server.url)
        async with new_client() as client:
            fetcher = Fetcher(client, 1 << 22)
            tallies = {e: await probes.canary(fetcher, target, e, tokens=32, timeout=60) for e in Endpoint}
    assert all(t.tokens == 32 for t in tallies.values())
    if kind == "plain":
        assert {e: t.fill_ins for e, t in tallies.items()} == dict.fromkeys(Endpoint, 0)
        assert all(t.draft_n is None for t in tallies.values())
    else:
        caught = {e for e, t in tallies.items() if t.fill_ins > 0}
        assert {Endpoint.V1_COMPLETION, Endpoint.V1_COMPLETION_STREAM} <= caught, {e: t.fill_ins for e, t in tallies.items()}
        assert tallies[Endpoint.V1_COMPLETION].draft_n, "timings.draft_n says the server drafted"
