"""The canary: one table of the endpoints it asks (path, body, reader, streaming) and the one fill-in classifier."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..endpoints import Endpoint
from ..reasons import ProbeFailure, Reason
from .readers import (
    Chunk,
    Reading,
    chat_chunk,
    completion_chunk,
    completion_reader,
    read_choice,
    stream_reader,
    v1_completion_chunk,
)

ALTERNATIVES = 3
SEED = 4242
# n-gram speculation drafts only from text already in the context, so the prompt repeats a line and asks for more
# of it; a draft model drafts on any text. Lookup types (ngram-map-k: a 12-token key) need the key and what follows
# it in the context, so the line comes twelve times (about 75 tokens): measured with bench/canary_tokens.py, every
# n-gram type that drafts at all then drafts from the first request and the first few tokens.
REPEATED_LINE = "the cat sat on a mat"
PROMPT_TEXT = " ".join([REPEATED_LINE] * 12) + " the cat"
CHAT_INSTRUCTION = "Repeat the following line over and over, with nothing else: " + REPEATED_LINE


@dataclass(frozen=True)
class DraftProof:
    """Where speculation cannot be seen, a canary this long on this kind of endpoint that did not draft proves that
    the n-gram types that draft there are off. No one kind covers every type (bench/canary_tokens.py, build 11434, on
    SmolLM2-135M-Instruct and the cycle model): on the raw prompt ngram-mod, ngram-map-k(4v) and ngram-cache draft
    from 3 tokens and ngram-simple never; on chat ngram-simple drafts from 16, ngram-map-k only on some models.
    So a server is proven only when both kinds were canaried long enough."""

    kind: str
    tokens: int


PROMPT_PROOF = DraftProof("raw-prompt", 8)
CHAT_PROOF = DraftProof("chat", 32)


@dataclass(frozen=True)
class Tally:
    """The classified canary answer of one endpoint: how many tokens, how many of them fill-ins."""

    tokens: int
    fill_ins: int
    mean_logprob: float | None
    draft_n: int | None
    draft_accepted: int | None
    model: str | None = None
    """The model the answer says produced it, when it says."""

    @property
    def judged_tokens(self) -> int:
        """Tokens after the first: the ones that can be fill-ins (the first is always real), the ratio's denominator."""
        return max(0, self.tokens - 1)

    @property
    def fill_in_ratio(self) -> float:
        return self.fill_ins / self.judged_tokens if self.judged_tokens > 0 else 0.0

    @property
    def drafted(self) -> bool:
        """The server went through its speculative path for this answer."""
        return bool(self.draft_n) or self.fill_ins > 0


@dataclass(frozen=True)
class EndpointSpec:
    """Everything specwatch knows about one canary endpoint."""

    endpoint: Endpoint
    path: str
    streaming: bool
    body: Callable[[int], dict[str, Any]]
    """The request body for a canary of so many tokens (the probe adds `model` for routers)."""
    read: Callable[[Any], Reading]
    """Tokens from the answer: the parsed JSON body, or the list of parsed events when streaming."""
    proof: DraftProof
    """How long a canary here must be to prove, by not drafting, the n-gram types that draft here off."""
    post_sampling: bool = False
    """The answer's values are post-sampling probabilities (`post_sampling_probs`)."""


def _common() -> dict[str, Any]:
    return {"temperature": 0.0, "seed": SEED, "cache_prompt": False}


def _chat_body(*, stream: bool) -> Callable[[int], dict[str, Any]]:
    def body(tokens: int) -> dict[str, Any]:
        return {
            **_common(),
            "messages": [{"role": "system", "content": CHAT_INSTRUCTION}, {"role": "user", "content": PROMPT_TEXT}],
            "max_tokens": tokens,
            "logprobs": True,
            "top_logprobs": ALTERNATIVES,
            "stream": stream,
        }

    return body


def _completion_body(*, stream: bool, post_sampling: bool = False) -> Callable[[int], dict[str, Any]]:
    def body(tokens: int) -> dict[str, Any]:
        answer = {**_common(), "prompt": PROMPT_TEXT, "n_predict": tokens, "n_probs": ALTERNATIVES, "stream": stream}
        if post_sampling:
            answer["post_sampling_probs"] = True
        return answer

    return body


def _v1_completion_body(*, stream: bool) -> Callable[[int], dict[str, Any]]:
    def body(tokens: int) -> dict[str, Any]:
        return {**_common(), "prompt": PROMPT_TEXT, "max_tokens": tokens, "logprobs": ALTERNATIVES, "stream": stream}

    return body


CHUNKS: Mapping[Endpoint, Chunk] = MappingProxyType({
    Endpoint.CHAT_STREAM: chat_chunk,
    Endpoint.COMPLETION_STREAM: completion_chunk(post_sampling=False),
    Endpoint.V1_COMPLETION_STREAM: v1_completion_chunk,
})


TABLE: Mapping[Endpoint, EndpointSpec] = MappingProxyType({
    spec.endpoint: spec
    for spec in (
        # The raw prompt repeats the line: the n-gram types that draft on it do from 3 tokens. A chat wraps it in a
        # template and the model's own words: ngram-simple drafts there from 16 (ngram-mod from 32, 48 on Gemma 3 270M).
        EndpointSpec(Endpoint.CHAT, "/v1/chat/completions", False, _chat_body(stream=False), read_choice, CHAT_PROOF),
        EndpointSpec(Endpoint.CHAT_STREAM, "/v1/chat/completions", True, _chat_body(stream=True),
                     stream_reader(CHUNKS[Endpoint.CHAT_STREAM]), CHAT_PROOF),
        EndpointSpec(Endpoint.COMPLETION, "/completion", False, _completion_body(stream=False),
                     completion_reader(post_sampling=False), PROMPT_PROOF),
        EndpointSpec(Endpoint.COMPLETION_STREAM, "/completion", True, _completion_body(stream=True),
                     stream_reader(CHUNKS[Endpoint.COMPLETION_STREAM]), PROMPT_PROOF),
        EndpointSpec(Endpoint.COMPLETION_POST_SAMPLING, "/completion", False, _completion_body(stream=False, post_sampling=True),
                     completion_reader(post_sampling=True), PROMPT_PROOF, post_sampling=True),
        EndpointSpec(Endpoint.V1_COMPLETION, "/v1/completions", False, _v1_completion_body(stream=False), read_choice,
                     PROMPT_PROOF),
        EndpointSpec(Endpoint.V1_COMPLETION_STREAM, "/v1/completions", True, _v1_completion_body(stream=True),
                     stream_reader(CHUNKS[Endpoint.V1_COMPLETION_STREAM]), PROMPT_PROOF),
    )
})


def classify(reading: Reading) -> Tally:
    """Count fill-ins: after the first token, a token with no value, an empty alternatives list, or a placeholder mark.

    An exact 0.0 alone proves nothing (a real token can be certain); the empty list is the signal.
    """
    tokens = reading.tokens
    if not tokens:
        raise ProbeFailure(Reason.NO_LOGPROBS, "the answer carries no tokens")
    if all(t.logprob is None for t in tokens):
        raise ProbeFailure(Reason.NO_LOGPROBS, "logprobs were requested but none came back")
    if all(t.alternatives is None for t in tokens):
        raise ProbeFailure(Reason.NO_LOGPROBS, "alternatives were requested but none came back")
    fill_ins = sum(1 for i, t in enumerate(tokens) if t.fill_in(i))
    values = [t.logprob for t in tokens if t.logprob is not None]
    return Tally(
        tokens=len(tokens),
        fill_ins=fill_ins,
        mean_logprob=sum(values) / len(values) if values else None,
        draft_n=reading.draft_n,
        draft_accepted=reading.draft_accepted,
        model=reading.model,
    )


def judge(spec: EndpointSpec, reading: Reading) -> Tally:
    """A canary's answer classified; on a post-sampling one, values that cannot be post-sampling fail it."""
    tally = classify(reading)
    # Fill-ins found on the same answer are proof, and stay the verdict.
    if not spec.post_sampling or tally.fill_ins:
        return tally
    # The canary asks at temperature 0, where sampling keeps one candidate: a real post-sampling token is prob 1.0 with
    # one entry in top_probs. Several entries, or a lower prob, are pre-sampling numbers under the post-sampling keys
    # (a revision of upstream #27196 fills drafted tokens so): real-looking, and not what was asked.
    other = [t for t in reading.tokens[1:] if (t.alternatives or 0) > 1 or (t.logprob is not None and t.logprob < -1e-6)]
    if other:
        lowest = math.exp(min(t.logprob for t in other if t.logprob is not None))
        drafted = f"; the server drafted (timings.draft_n {tally.draft_n})" if tally.draft_n else ""
        raise ProbeFailure(
            Reason.NOT_POST_SAMPLING,
            f"{len(other)} of {tally.judged_tokens} tokens after the first carry pre-sampling numbers under prob/top_probs "
            f"(up to {max(t.alternatives or 0 for t in other)} alternatives, prob as low as {lowest:.3f}; at temperature 0 "
            f"a post-sampling token is prob 1.0 with one){drafted}",
        )
    return tally
