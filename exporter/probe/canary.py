"""The canary: one table of the endpoints it asks (path, body, how to read tokens, streaming) and the fill-in classifier."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from exporter.reasons import ProbeFailure, Reason

ALTERNATIVES = 3
SEED = 4242
# n-gram speculation drafts only from text already in the context, so the prompt repeats a line and asks for more
# of it; a draft model drafts on any text. Lookup types (ngram-map-k: a 12-token key) need the key and what follows
# it in the context, so the line comes twelve times (about 75 tokens): measured with bench/canary_tokens.py, every
# n-gram type that drafts at all then drafts from the first request and the first few tokens.
REPEATED_LINE = "the cat sat on a mat"
PROMPT_TEXT = " ".join([REPEATED_LINE] * 12) + " the cat"
CHAT_INSTRUCTION = "Repeat the following line over and over, with nothing else: " + REPEATED_LINE
MAX_COUNT = 1 << 40
PROMPT_DRAFTS_FROM = 8
CHAT_DRAFTS_FROM = 48


class Endpoint(StrEnum):
    """The ways an eval reads logprobs; each is canaried separately, in this order by default.

    /completion comes first: a fresh server with ngram-map-k whose first request is a chat never drafts afterwards
    (measured on build 11434 with bench/canary_tokens.py), while one whose first request is a completion does.
    """

    COMPLETION = "completion"
    COMPLETION_STREAM = "completion_stream"
    COMPLETION_POST_SAMPLING = "completion_post_sampling"
    V1_COMPLETION = "v1_completion"
    V1_COMPLETION_STREAM = "v1_completion_stream"
    CHAT = "chat"
    CHAT_STREAM = "chat_stream"


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token as the answer shows it: None where the answer has no value."""

    logprob: float | None
    alternatives: int | None
    marked: bool = False
    """The answer itself says this value is a placeholder (one of PLACEHOLDER_MARKERS is true)."""


PLACEHOLDER_MARKERS = ("placeholder", "is_placeholder", "logprob_placeholder")
"""Per-token fields a build may add to say its value is a placeholder: such a token is a fill-in whatever else it
carries. Any other field a build adds changes nothing."""


@dataclass(frozen=True)
class Reading:
    """What one answer (or stream) says: its tokens and the draft counts from `timings`, when reported."""

    tokens: list[Token]
    draft_n: int | None = None
    draft_accepted: int | None = None
    model: str | None = None
    """The model the answer says produced it, when it says."""


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
    def judged(self) -> int:
        """Tokens after the first: the ones that can be fill-ins (the first is always real), the ratio's denominator."""
        return max(0, self.tokens - 1)

    @property
    def fill_in_ratio(self) -> float:
        return self.fill_ins / self.judged if self.judged > 0 else 0.0

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
    drafts_from: int
    """A canary this long makes every n-gram type that is on draft here (where a draft model drafts from 3 tokens):
    shorter and not drafting, it proves nothing where speculation cannot be seen. Measured on SmolLM2-135M-Instruct
    and the tiny cycle model with bench/canary_tokens.py, with room to spare (see the README)."""


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


def _bad(what: str) -> ProbeFailure:
    return ProbeFailure(Reason.INVALID_RESPONSE, what)


def finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond any float: JSON allows it, a probability is never one
        return False


def _entry_token(entry: Any, *, post_sampling: bool, where: str) -> Token:
    if not isinstance(entry, dict):
        raise _bad(f"{where} is not an object")
    value_key, list_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")
    value = entry.get(value_key)
    if not finite(value):
        raise _bad(f"{where}.{value_key} is {value!r}, not a finite number")
    if post_sampling:
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
    return Token(logprob=logprob, alternatives=count, marked=_marked(entry))


def _marked(entry: dict[str, Any]) -> bool:
    # Most entries carry no marker at all: the keys test, in C, spares them the generator (a third of a read's time).
    return not entry.keys().isdisjoint(PLACEHOLDER_MARKERS) and any(entry.get(key) is True for key in PLACEHOLDER_MARKERS)


def _entries(entries: Any, *, post_sampling: bool, where: str) -> list[Token]:
    if not isinstance(entries, list):
        raise _bad(f"{where} is not a list")
    value_key, list_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")
    tokens: list[Token] = []
    for i, entry in enumerate(entries):
        # The common shape (a float value, a list of alternatives) is read here; anything else, and every error
        # message, goes through _entry_token. A 48-token answer is read in a third of the time.
        if type(entry) is dict:
            value = entry.get(value_key)
            alternatives = entry.get(list_key)
            if type(value) is float and type(alternatives) is list and not _marked(entry):
                if post_sampling:
                    if 0.0 <= value <= 1.0 + 1e-6:
                        tokens.append(Token(math.log(value) if value > 0 else -1e9, len(alternatives)))
                        continue
                elif -math.inf < value <= 1e-6:
                    tokens.append(Token(value, len(alternatives)))
                    continue
        tokens.append(_entry_token(entry, post_sampling=post_sampling, where=f"{where}[{i}]"))
    return tokens


def _timings(body: Any) -> tuple[int | None, int | None]:
    timings = body.get("timings") if isinstance(body, dict) else None
    if not isinstance(timings, dict):
        return None, None
    # A count beyond any float would fail every scrape when exported; such a count is unknown, not huge.
    drafted, accepted = (
        v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT else None
        for v in (timings.get("draft_n"), timings.get("draft_n_accepted"))
    )
    return drafted, accepted


def _model(body: Any) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


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


def _logprobs_tokens(logprobs: Any, where: str) -> list[Token]:
    """A choice's `logprobs`: llama-server's `{"content": [...]}`, or OpenAI's legacy completion shape, which a proxy in
    front of llama-server may convert it to (`tokens`, `token_logprobs`, `top_logprobs` as one {token: logprob} each)."""
    if logprobs is None:
        return []
    if not isinstance(logprobs, dict):
        raise _bad(f"{where} is not an object")
    if "content" in logprobs:
        content = logprobs["content"]
        return [] if content is None else _entries(content, post_sampling=False, where=f"{where}.content")
    values = logprobs.get("token_logprobs")
    if values is None:
        return []
    if not isinstance(values, list):
        raise _bad(f"{where}.token_logprobs is not a list")
    tops = logprobs.get("top_logprobs")
    if tops is not None and (not isinstance(tops, list) or len(tops) != len(values)):
        raise _bad(f"{where}.top_logprobs is not a list as long as token_logprobs")
    tokens = []
    for i, value in enumerate(values):
        if value is not None and (not finite(value) or value > 1e-6):
            raise _bad(f"{where}.token_logprobs[{i}] is {value!r}, not a logprob")
        top = None if tops is None else tops[i]
        if top is not None and not isinstance(top, dict):
            raise _bad(f"{where}.top_logprobs[{i}] is not an object")
        tokens.append(Token(None if value is None else float(value), None if top is None else len(top)))
    return tokens


def _read_choice(body: Any) -> Reading:
    """A chat or OpenAI completion answer: the tokens of its first choice."""
    choice = _chat_choice(body, "response")
    return Reading(_logprobs_tokens(choice.get("logprobs"), "choices[0].logprobs"), *_timings(body), model=_model(body))


def _completion_reader(*, post_sampling: bool) -> Callable[[Any], Reading]:
    def read(body: Any) -> Reading:
        if not isinstance(body, dict):
            raise _bad("response is not a JSON object")
        probabilities = body.get("completion_probabilities")
        tokens = [] if probabilities is None else _entries(probabilities, post_sampling=post_sampling,
                                                           where="completion_probabilities")
        return Reading(tokens, *_timings(body), model=_model(body))

    return read


Chunk = Callable[[Any, str], tuple[Any, list[Token]]]
"""What a stream reader reads of one event: `chunk(event, where) -> (its content, its tokens)`."""


class StreamReading:
    """A stream read event by event: a speculating server sends logprobs only with the first chunk, so a content chunk
    without them is one token with no value, which the classifier counts as a fill-in."""

    __slots__ = ("_chunk", "model", "timings", "tokens")

    def __init__(self, chunk: Chunk) -> None:
        self._chunk = chunk
        self.tokens: list[Token] = []
        self.timings: tuple[int | None, int | None] = (None, None)
        self.model: str | None = None

    def add(self, event: Any, where: str) -> None:
        content, found = self._chunk(event, where)
        if found:
            self.tokens.extend(found)
        elif isinstance(content, str) and content:
            self.tokens.append(Token(logprob=None, alternatives=None))
        reported = _timings(event)
        if reported != (None, None):
            self.timings = reported
        self.model = self.model or _model(event)

    def reading(self) -> Reading:
        return Reading(self.tokens, *self.timings, model=self.model)


def _stream_reader(chunk: Chunk) -> Callable[[Any], Reading]:
    """A reader of a whole stream, the parsed events in order."""

    def read(events: Sequence[Any]) -> Reading:
        stream = StreamReading(chunk)
        for index, event in enumerate(events):
            stream.add(event, f"stream event {index}")
        return stream.reading()

    return read


def _chat_chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
    choice = _chat_choice(event, where)
    delta = choice.get("delta") or {}
    return (delta.get("content") if isinstance(delta, dict) else None,
            _logprobs_tokens(choice.get("logprobs"), f"{where} logprobs"))


def _v1_completion_chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
    choice = _chat_choice(event, where)
    return choice.get("text"), _logprobs_tokens(choice.get("logprobs"), f"{where} logprobs")


def _completion_chunk(*, post_sampling: bool) -> Chunk:
    def chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
        if not isinstance(event, dict):
            raise _bad(f"{where} is not a JSON object")
        entries = event.get("completion_probabilities")
        return event.get("content"), [] if not entries else _entries(entries, post_sampling=post_sampling,
                                                                     where=f"{where} logprobs")

    return chunk


_CHUNKS: Mapping[Endpoint, Chunk] = MappingProxyType({
    Endpoint.CHAT_STREAM: _chat_chunk,
    Endpoint.COMPLETION_STREAM: _completion_chunk(post_sampling=False),
    Endpoint.V1_COMPLETION_STREAM: _v1_completion_chunk,
})


TABLE: Mapping[Endpoint, EndpointSpec] = MappingProxyType({
    spec.endpoint: spec
    for spec in (
        # The raw prompt repeats the line: every n-gram type drafts from 3 tokens. A chat wraps it in a template and the
        # model's own words: ngram-mod needs 32 (SmolLM2-135M), 48 on Gemma 3 270M.
        EndpointSpec(Endpoint.CHAT, "/v1/chat/completions", False, _chat_body(stream=False), _read_choice, CHAT_DRAFTS_FROM),
        EndpointSpec(Endpoint.CHAT_STREAM, "/v1/chat/completions", True, _chat_body(stream=True),
                     _stream_reader(_CHUNKS[Endpoint.CHAT_STREAM]), CHAT_DRAFTS_FROM),
        EndpointSpec(Endpoint.COMPLETION, "/completion", False, _completion_body(stream=False),
                     _completion_reader(post_sampling=False), PROMPT_DRAFTS_FROM),
        EndpointSpec(Endpoint.COMPLETION_STREAM, "/completion", True, _completion_body(stream=True),
                     _stream_reader(_CHUNKS[Endpoint.COMPLETION_STREAM]), PROMPT_DRAFTS_FROM),
        EndpointSpec(Endpoint.COMPLETION_POST_SAMPLING, "/completion", False, _completion_body(stream=False, post_sampling=True),
                     _completion_reader(post_sampling=True), PROMPT_DRAFTS_FROM),
        EndpointSpec(Endpoint.V1_COMPLETION, "/v1/completions", False, _v1_completion_body(stream=False), _read_choice,
                     PROMPT_DRAFTS_FROM),
        EndpointSpec(Endpoint.V1_COMPLETION_STREAM, "/v1/completions", True, _v1_completion_body(stream=True),
                     _stream_reader(_CHUNKS[Endpoint.V1_COMPLETION_STREAM]), PROMPT_DRAFTS_FROM),
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
    fill_ins = sum(1 for t in tokens[1:] if t.logprob is None or not t.alternatives or t.marked)
    values = [t.logprob for t in tokens if t.logprob is not None]
    return Tally(
        tokens=len(tokens),
        fill_ins=fill_ins,
        mean_logprob=sum(values) / len(values) if values else None,
        draft_n=reading.draft_n,
        draft_accepted=reading.draft_accepted,
        model=reading.model,
    )


@dataclass(frozen=True)
class Shape:
    """One shape an answer can have: an endpoint's whole answer, or one event of its stream, and how to read it."""

    name: str
    """The endpoint's name (`Endpoint`), or COMPLETION_POST_SAMPLING_STREAM, which the canary does not send."""
    path: str
    read: Callable[[Any], Reading]
    """The endpoint table's reader: a whole answer, or a stream's events in a list."""
    chunk: Chunk | None = None
    """A stream's: what one event holds (see StreamReading)."""

    @property
    def streaming(self) -> bool:
        return self.chunk is not None

    def stream(self) -> StreamReading:
        """A stream of this shape to read event by event; only for a streaming shape."""
        assert self.chunk is not None
        return StreamReading(self.chunk)


COMPLETION_POST_SAMPLING_STREAM = "completion_post_sampling_stream"
_POST_SAMPLING_CHUNK = _completion_chunk(post_sampling=True)
SHAPES: Mapping[str, Shape] = MappingProxyType({
    **{e.value: Shape(e.value, spec.path, spec.read, _CHUNKS.get(e)) for e, spec in TABLE.items()},
    COMPLETION_POST_SAMPLING_STREAM: Shape(COMPLETION_POST_SAMPLING_STREAM, "/completion", _stream_reader(_POST_SAMPLING_CHUNK),
                                           _POST_SAMPLING_CHUNK),
})


def _post_sampling(entries: Any) -> bool:
    first = entries[0] if isinstance(entries, list) and entries else None
    return isinstance(first, dict) and "prob" in first and "logprob" not in first


def shape_of(answer: Any) -> Shape | None:
    """Which endpoint's answer, or which stream's event, a parsed JSON value is, from its content alone; None if none.

    OpenAI's `object` decides when present (the OpenAI SDK's dumps and llama-server's answers carry it), else the
    choice's keys do. A /v1/completions event that ends its stream (`finish_reason` set) looks like a whole answer and is
    called one: only the events before it, read in order, tell it apart. Likewise /completion's last event (`stop: true`).
    """
    if not isinstance(answer, dict):
        return None
    choices = answer.get("choices")
    if isinstance(choices, list):
        kind = answer.get("object")
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        if kind == "chat.completion.chunk" or (kind is None and "delta" in choice):
            return SHAPES[Endpoint.CHAT_STREAM]
        if kind == "chat.completion" or (kind is None and "message" in choice):
            return SHAPES[Endpoint.CHAT]
        if kind == "text_completion" or (kind is None and "text" in choice):
            ended = choice.get("finish_reason") is not None
            return SHAPES[Endpoint.V1_COMPLETION if ended else Endpoint.V1_COMPLETION_STREAM]
        return None
    if isinstance(answer.get("content"), str) and ("completion_probabilities" in answer or isinstance(answer.get("stop"), bool)):
        post = _post_sampling(answer.get("completion_probabilities"))
        if answer.get("stop") is False:
            return SHAPES[COMPLETION_POST_SAMPLING_STREAM if post else Endpoint.COMPLETION_STREAM]
        return SHAPES[Endpoint.COMPLETION_POST_SAMPLING if post else Endpoint.COMPLETION]
    return None
