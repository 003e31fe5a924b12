"""The canary: requests that make a speculating server draft, and the token classifier."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exporter.fetch import finite
from exporter.reasons import ProbeFailure, Reason
from exporter.settings import Endpoint

ALTERNATIVES = 3
SEED = 4242
# n-gram speculation drafts only from text already in the context, so the prompt repeats a line
# and asks for more of it; a draft model drafts on any text.
REPEATED_LINE = "the cat sat on the mat."
PROMPT_TEXT = " ".join([REPEATED_LINE] * 6) + " the cat"
CHAT_INSTRUCTION = "Repeat the following line over and over, with nothing else: " + REPEATED_LINE

MAX_COUNT = 1 << 40
STREAMING = frozenset({Endpoint.CHAT_STREAM, Endpoint.COMPLETION_STREAM})


@dataclass(frozen=True)
class Token:
    """One generated token as the response shows it: None where the response has no value."""

    logprob: float | None
    alternatives: int | None


@dataclass(frozen=True)
class Verdict:
    tokens: int
    placeholders: int
    mean_logprob: float | None
    draft_n: int | None
    draft_accepted: int | None

    @property
    def placeholder_ratio(self) -> float:
        after_first = self.tokens - 1
        return self.placeholders / after_first if after_first > 0 else 0.0


def request_for(endpoint: Endpoint, *, tokens: int, model: str | None = None) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) of the canary for one endpoint."""
    common: dict[str, Any] = {"temperature": 0.0, "seed": SEED, "cache_prompt": False}
    if model:
        common["model"] = model
    if endpoint in (Endpoint.CHAT, Endpoint.CHAT_STREAM):
        body = {
            **common,
            "messages": [
                {"role": "system", "content": CHAT_INSTRUCTION},
                {"role": "user", "content": PROMPT_TEXT},
            ],
            "max_tokens": tokens,
            "logprobs": True,
            "top_logprobs": ALTERNATIVES,
            "stream": endpoint is Endpoint.CHAT_STREAM,
        }
        return "/v1/chat/completions", body
    body = {
        **common,
        "prompt": PROMPT_TEXT,
        "n_predict": tokens,
        "n_probs": ALTERNATIVES,
        "stream": endpoint is Endpoint.COMPLETION_STREAM,
    }
    if endpoint is Endpoint.COMPLETION_POST_SAMPLING:
        body["post_sampling_probs"] = True
    return "/completion", body


def _bad(what: str) -> ProbeFailure:
    return ProbeFailure(Reason.INVALID_RESPONSE, what)


def _entry_token(entry: Any, *, value_key: str, list_key: str, where: str) -> Token:
    if not isinstance(entry, dict):
        raise _bad(f"{where} is not an object")
    value = entry.get(value_key)
    if not finite(value):
        raise _bad(f"{where}.{value_key} is {value!r}, not a finite number")
    if value_key == "prob":
        if not 0.0 <= value <= 1.0 + 1e-6:
            raise _bad(f"{where}.prob {value!r} is outside [0, 1]")
        logprob = math.log(value) if value > 0 else -1e9
    else:
        if value > 1e-6:
            raise _bad(f"{where}.logprob {value!r} is positive")
        logprob = float(value)
    alternatives = entry.get(list_key)
    if alternatives is None:
        count = None
    elif isinstance(alternatives, list):
        count = len(alternatives)
    else:
        raise _bad(f"{where}.{list_key} is not a list")
    return Token(logprob=logprob, alternatives=count)


def _entries(entries: Any, *, post_sampling: bool, where: str) -> list[Token]:
    if not isinstance(entries, list):
        raise _bad(f"{where} is not a list")
    value_key, list_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")
    return [_entry_token(e, value_key=value_key, list_key=list_key, where=f"{where}[{i}]") for i, e in enumerate(entries)]


def _timings(body: Any) -> tuple[int | None, int | None]:
    timings = body.get("timings") if isinstance(body, dict) else None
    if not isinstance(timings, dict):
        return None, None
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    # A count beyond any float would fail every scrape when exported; such a count is unknown, not huge.
    as_int = [v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT else None for v in (drafted, accepted)]
    return as_int[0], as_int[1]


def _chat_choice(body: Any, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad(f"{where} is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise _bad(f"{where} has no choices list")
    if not choices:
        return {}
    if not isinstance(choices[0], dict):
        raise _bad(f"{where}.choices[0] is not an object")
    return choices[0]


def tokens_from_response(endpoint: Endpoint, body: Any) -> tuple[list[Token], tuple[int | None, int | None]]:
    """Tokens and (draft_n, draft_n_accepted) from a non-streaming answer."""
    if endpoint is Endpoint.CHAT:
        choice = _chat_choice(body, "response")
        logprobs = choice.get("logprobs")
        if logprobs is None:
            return [], _timings(body)
        if not isinstance(logprobs, dict):
            raise _bad("choices[0].logprobs is not an object")
        content = logprobs.get("content")
        tokens = [] if content is None else _entries(content, post_sampling=False, where="logprobs.content")
        return tokens, _timings(body)
    if not isinstance(body, dict):
        raise _bad("response is not a JSON object")
    probabilities = body.get("completion_probabilities")
    if probabilities is None:
        return [], _timings(body)
    post = endpoint is Endpoint.COMPLETION_POST_SAMPLING
    return _entries(probabilities, post_sampling=post, where="completion_probabilities"), _timings(body)


def tokens_from_events(endpoint: Endpoint, events: Sequence[Any]) -> tuple[list[Token], tuple[int | None, int | None]]:
    """Tokens from a stream: a content chunk without logprobs is one token with no value."""
    tokens: list[Token] = []
    timings: tuple[int | None, int | None] = (None, None)
    for index, event in enumerate(events):
        where = f"stream event {index}"
        if endpoint is Endpoint.CHAT_STREAM:
            choice = _chat_choice(event, where)
            delta = choice.get("delta") or {}
            content = delta.get("content") if isinstance(delta, dict) else None
            logprobs = choice.get("logprobs")
            entries = logprobs.get("content") if isinstance(logprobs, dict) else None
            post = False
        else:
            if not isinstance(event, dict):
                raise _bad(f"{where} is not a JSON object")
            content = event.get("content")
            entries = event.get("completion_probabilities")
            post = False
        if entries:
            tokens.extend(_entries(entries, post_sampling=post, where=f"{where} logprobs"))
        elif isinstance(content, str) and content:
            tokens.append(Token(logprob=None, alternatives=None))
        found = _timings(event)
        if found != (None, None):
            timings = found
    return tokens, timings


def classify(tokens: Sequence[Token], timings: tuple[int | None, int | None] = (None, None)) -> Verdict:
    """Count fill-ins: after the first token, a token with no value or an empty alternatives list.

    An exact 0.0 alone proves nothing (a real token can be certain); the empty list is the signal.
    """
    if not tokens:
        raise ProbeFailure(Reason.NO_LOGPROBS, "the answer carries no tokens")
    if all(t.logprob is None for t in tokens):
        raise ProbeFailure(Reason.NO_LOGPROBS, "logprobs were requested but none came back")
    if all(t.alternatives is None for t in tokens):
        raise ProbeFailure(Reason.NO_LOGPROBS, "alternatives were requested but none came back")
    placeholders = sum(1 for t in tokens[1:] if t.logprob is None or t.alternatives == 0 or t.alternatives is None)
    values = [t.logprob for t in tokens if t.logprob is not None]
    mean = sum(values) / len(values) if values else None
    return Verdict(
        tokens=len(tokens),
        placeholders=placeholders,
        mean_logprob=mean,
        draft_n=timings[0],
        draft_accepted=timings[1],
    )
