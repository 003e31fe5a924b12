"""How llama-server's answers carry logprobs: a reader for each shape, whole or one stream event at a time."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from sys import intern
from typing import Any

from ..reasons import ProbeFailure, Reason

MAX_COUNT = 1 << 40


Alternatives = tuple[Any, ...]
"""A token's alternatives, flat: (text, logprob, text, logprob, ...). Flat, because a fleet keeps every endpoint's last
answer, and pairs of their own took 40% of that memory."""


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token as the answer shows it: None where the answer has no value."""

    logprob: float | None
    alternatives: int | None
    marked: bool = False
    """The answer itself says this value is a placeholder (one of PLACEHOLDER_MARKERS is true)."""
    text: str | None = None
    """The token as the answer spells it (a stream's content for a token without logprobs); None when not given."""
    top: Alternatives = ()
    """The alternatives the answer lists that carry a text and a finite value."""

    def fill_in(self, index: int) -> bool:
        """A value that is no measurement: after the first token, no value, an empty alternatives list, or a mark."""
        return index > 0 and (self.logprob is None or not self.alternatives or self.marked)


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
    return Token(logprob=logprob, alternatives=count, marked=_marked(entry), text=_text(entry),
                 top=_top(alternatives, value_key, post_sampling=post_sampling) if isinstance(alternatives, list) else ())


def _text(entry: dict[str, Any]) -> str | None:
    # Interned: a fleet's kept answers hold the same few token texts thousands of times (a third of their memory).
    text = entry.get("token")
    return intern(text) if type(text) is str else None


def _top(alternatives: list[Any], value_key: str, *, post_sampling: bool) -> Alternatives:
    """The alternatives with a text and a usable value, as (text, logprob); the rest are left out, not refused."""
    top: list[Any] = []
    for entry in alternatives:
        if type(entry) is dict:
            text, value = entry.get("token"), entry.get(value_key)
            if type(text) is str and type(value) is float and math.isfinite(value):
                if post_sampling:
                    if 0.0 < value <= 1.0 + 1e-6:
                        top += (intern(text), math.log(value))
                elif value <= 1e-6:
                    top += (intern(text), value)
    return tuple(top)


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
                        tokens.append(Token(math.log(value) if value > 0 else -1e9, len(alternatives), False, _text(entry),
                                            _top(alternatives, value_key, post_sampling=True)))
                        continue
                elif -math.inf < value <= 1e-6:
                    tokens.append(Token(value, len(alternatives), False, _text(entry),
                                        _top(alternatives, value_key, post_sampling=False)))
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
    texts = logprobs.get("tokens")
    if not isinstance(texts, list) or len(texts) != len(values):
        texts = [None] * len(values)
    tokens = []
    for i, value in enumerate(values):
        if value is not None and (not finite(value) or value > 1e-6):
            raise _bad(f"{where}.token_logprobs[{i}] is {value!r}, not a logprob")
        top = None if tops is None else tops[i]
        if top is not None and not isinstance(top, dict):
            raise _bad(f"{where}.top_logprobs[{i}] is not an object")
        text = texts[i] if isinstance(texts[i], str) else None
        pairs = () if top is None else tuple(x for k, v in top.items() if isinstance(k, str) and finite(v) and v <= 1e-6
                                             for x in (intern(k), float(v)))
        tokens.append(Token(None if value is None else float(value), None if top is None else len(top), text=text, top=pairs))
    return tokens


def read_choice(body: Any) -> Reading:
    """A chat or OpenAI completion answer: the tokens of its first choice."""
    choice = _chat_choice(body, "response")
    return Reading(_logprobs_tokens(choice.get("logprobs"), "choices[0].logprobs"), *_timings(body), model=_model(body))


def completion_reader(*, post_sampling: bool) -> Callable[[Any], Reading]:
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
            self.tokens.append(Token(logprob=None, alternatives=None, text=content))
        reported = _timings(event)
        if reported != (None, None):
            self.timings = reported
        self.model = self.model or _model(event)

    def reading(self) -> Reading:
        return Reading(self.tokens, *self.timings, model=self.model)


def stream_reader(chunk: Chunk) -> Callable[[Any], Reading]:
    """A reader of a whole stream, the parsed events in order."""

    def read(events: Sequence[Any]) -> Reading:
        stream = StreamReading(chunk)
        for index, event in enumerate(events):
            stream.add(event, f"stream event {index}")
        return stream.reading()

    return read


def chat_chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
    choice = _chat_choice(event, where)
    delta = choice.get("delta") or {}
    return (delta.get("content") if isinstance(delta, dict) else None,
            _logprobs_tokens(choice.get("logprobs"), f"{where} logprobs"))


def v1_completion_chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
    choice = _chat_choice(event, where)
    return choice.get("text"), _logprobs_tokens(choice.get("logprobs"), f"{where} logprobs")


def completion_chunk(*, post_sampling: bool) -> Chunk:
    def chunk(event: Any, where: str) -> tuple[Any, list[Token]]:
        if not isinstance(event, dict):
            raise _bad(f"{where} is not a JSON object")
        entries = event.get("completion_probabilities")
        return event.get("content"), [] if not entries else _entries(entries, post_sampling=post_sampling,
                                                                     where=f"{where} logprobs")

    return chunk
