"""A harness's gate on the answers it scores, judged by the canary's own readers and classifier: tally, require_real."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..endpoints import Endpoint
from ..probe.canary import classify
from ..probe.readers import Reading, StreamReading
from ..reasons import ProbeFailure, Reason
from .shapes import Shape, shape_of

MAX_OPEN_STREAMS = 1024
"""Streams read side by side (a log of concurrent requests) at most: past it the oldest is judged as it stands."""
TRUNCATED = "truncated: the stream ends before its last event (finish_reason, stop or [DONE])"


class Status(StrEnum):
    """What one answer's logprobs are."""

    CLEAN = "clean"
    FILL_INS = "fill_ins"
    CANNOT_JUDGE = "cannot_judge"


@dataclass(frozen=True)
class AnswerTally:
    """One answer as the canary's classifier sees it."""

    shape: str
    """The endpoint shape it has: `chat`, `chat_stream`, `completion`, `completion_stream`, `completion_post_sampling`,
    `completion_post_sampling_stream`, `v1_completion` or `v1_completion_stream`."""
    tokens: int
    """Tokens the reader found (a streamed chunk without logprobs is a token with no value)."""
    fill_ins: int
    draft_n: int | None
    """`timings.draft_n`: the server drafted this many tokens; None when it does not say."""
    judged: bool
    """Its tokens were classified: False when none came with logprobs and alternatives, the stream was cut short, or
    the values are not valid; such an answer is never clean."""
    reason: str | None = None
    """Why it could not be judged."""
    line: int | None = None
    """Where it starts in the file it was read from."""

    @property
    def judged_tokens(self) -> int:
        """Tokens after the first, the ones that can be fill-ins (the first is always real); 0 when not judged."""
        return max(0, self.tokens - 1) if self.judged else 0

    @property
    def status(self) -> Status:
        if self.fill_ins:
            return Status.FILL_INS
        return Status.CLEAN if self.judged else Status.CANNOT_JUDGE

    def describe(self) -> str:
        drafted = "" if self.draft_n is None else f", timings.draft_n {self.draft_n}"
        if self.fill_ins:
            return f"fill-ins: {self.fill_ins} of {self.judged_tokens} tokens after the first ({self.shape}{drafted})"
        if self.judged:
            return f"clean: {self.judged_tokens} tokens after the first, each with its alternatives ({self.shape}{drafted})"
        return f"cannot judge ({self.shape}): {self.reason}"


class FillInLogprobs(ValueError):
    """The answer carries fill-in logprobs: placeholders a speculating llama-server sent, not the model's values."""

    def __init__(self, tally: AnswerTally) -> None:
        self.tally = tally
        drafted = "" if tally.draft_n is None else f", timings.draft_n {tally.draft_n}"
        super().__init__(
            f"{tally.fill_ins} of {tally.judged_tokens} tokens after the first carry fill-in logprobs ({tally.shape} answer"
            f"{drafted}): the server speculated and sent placeholders (logprob 0, no alternatives), not the model's "
            "logprobs; do not score them"
        )


class CannotJudge(ValueError):
    """Nothing in the answer proves its logprobs real: it carries none with alternatives, was cut short, or is not valid."""

    def __init__(self, message: str, tally: AnswerTally | None = None) -> None:
        self.tally = tally
        super().__init__(message)


class NotAnAnswer(CannotJudge):
    """Not a llama-server answer, nor an event of one's stream: nothing to judge."""

    def __init__(self, detail: str, line: int | None = None) -> None:
        self.detail, self.line = detail, line
        super().__init__(detail if line is None else f"line {line}: {detail}")


Outcome = AnswerTally | NotAnAnswer


def tally(answer: Any) -> AnswerTally:
    """Classify one answer: a parsed JSON answer (dict), a list of one stream's events, or an OpenAI SDK object (anything
    with `model_dump()`, such as a ChatCompletion, a Completion, or a list of their chunks).

    Returns the counts whatever they say (check `.status`); raises NotAnAnswer when it is not an answer at all.
    """
    answers = Answers()
    found: list[Outcome] = []
    if isinstance(answer, list | tuple):
        if not answer:
            raise NotAnAnswer("an empty list: no stream events to read")
        for index, event in enumerate(answer):
            if event == "[DONE]" or event == b"[DONE]":
                found += answers.done()
            else:
                found += answers.record(_plain(event), None, where=f"event {index}")
    elif isinstance(answer, Iterable) and not isinstance(answer, dict | str | bytes) and not hasattr(answer, "model_dump"):
        raise NotAnAnswer(f"a {type(answer).__name__}: collect its events in a list (chunks = list(stream)), tally that list "
                          "and score the same chunks")
    else:
        found += answers.record(_plain(answer), None, where="the answer")
    found += answers.end()
    for outcome in found:
        if isinstance(outcome, NotAnAnswer):
            raise outcome
    if len(found) != 1:
        raise NotAnAnswer(f"{len(found)} answers, not one: a list is one stream's events; tally each answer apart")
    (only,) = found
    assert isinstance(only, AnswerTally)
    return only


def require_real(answer: Any) -> AnswerTally:
    """Pass only an answer whose logprobs are proven real: raise FillInLogprobs or CannotJudge (both ValueErrors) otherwise.

    Takes what `tally` takes and returns its counts when the answer is clean.
    """
    counted = tally(answer)
    if counted.status is Status.FILL_INS:
        raise FillInLogprobs(counted)
    if counted.status is Status.CANNOT_JUDGE:
        raise CannotJudge(
            f"cannot judge this {counted.shape} answer: {counted.reason}; its logprobs are not proven real "
            "(ask for logprobs with alternatives: top_logprobs, n_probs, or logprobs=N on /v1/completions)",
            counted,
        )
    return counted


def _plain(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) and not isinstance(value, dict) else value


@dataclass
class _Stream:
    """One stream being read: its events so far, read by the endpoint table's chunk reader as they come."""

    shape: Shape
    line: int | None
    reading: StreamReading
    events: int = 0
    ended: bool = False
    position: int | None = None
    """/completion's `tokens_predicted` so far: a stream starting again counts from 1."""
    invalid: str | None = None


def _first_choice(value: dict[str, Any]) -> dict[str, Any]:
    choices = value.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}


def _key_part(value: Any) -> str | int | None:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else None


class Answers:
    """Parsed records in file order to answers: a whole answer at once, a stream once it ended.

    A stream's events are one answer while they share the endpoint and (OpenAI shapes) `id` and choice `index`; it ends at
    its last event (`finish_reason`, /completion's `stop: true`), at `[DONE]`, or when events of another answer follow an
    ended stream (so the usage event after `finish_reason` still counts). Streams of different ids may interleave;
    /completion's events carry no id and must not.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[Any, ...], _Stream] = {}
        self._last: tuple[Any, ...] | None = None

    def record(self, value: Any, line: int | None, *, where: str | None = None) -> Iterator[Outcome]:
        if isinstance(value, list):
            # llama-server answers a /completion with several prompts with a list; a saved stream may be a list too.
            for index, item in enumerate(value):
                if isinstance(item, list):
                    yield NotAnAnswer("a list inside a list: not an answer nor a stream's events", line)
                else:
                    yield from self.record(item, line, where=f"{where or f'line {line}'} item {index}")
            return
        shape = shape_of(value)
        if shape is None:
            yield from self._leave(None)
            yield NotAnAnswer(_what(value), line)
            return
        key = self._key(shape, value)
        yield from self._leave(key)
        if shape.streaming or self._ends_open_stream(key, shape, value):
            yield from self._event(key, shape, value, line, where or f"line {line}")
        else:
            yield _whole(shape, value, line)

    def done(self) -> Iterator[Outcome]:
        """`data: [DONE]`: the stream that had the last event ended."""
        if self._last is not None and self._last in self._open:
            self._open[self._last].ended = True
            yield self._close(self._last)

    def end(self) -> Iterator[Outcome]:
        """The end of the input: every stream still open is judged as it stands."""
        for key in list(self._open):
            yield self._close(key)

    @staticmethod
    def _key(shape: Shape, value: dict[str, Any]) -> tuple[Any, ...]:
        if shape.path == "/completion":
            return (shape.path,)
        # An event of no choices (the usage event after the last) belongs to the stream's first choice.
        index = _key_part(_first_choice(value).get("index"))
        return shape.path, _key_part(value.get("id")), index if isinstance(index, int) else 0

    def _ends_open_stream(self, key: tuple[Any, ...], shape: Shape, value: dict[str, Any]) -> bool:
        """A record shaped like a whole answer that is the last event of the stream it follows."""
        stream = self._open.get(key)
        if stream is None or stream.ended:
            return False
        if shape.name == Endpoint.V1_COMPLETION:
            return True
        # /completion's last event: no text and no probabilities (a whole answer has them, or text at least).
        return shape.path == "/completion" and value.get("content") == "" and "completion_probabilities" not in value

    def _leave(self, key: tuple[Any, ...] | None) -> Iterator[Outcome]:
        """A record of another answer: the stream before it is over if it ended (trailing events, such as the usage
        event after `finish_reason`, come before anything else)."""
        if self._last is not None and self._last != key:
            stream = self._open.get(self._last)
            if stream is not None and stream.ended:
                yield self._close(self._last)

    def _event(self, key: tuple[Any, ...], shape: Shape, value: dict[str, Any], line: int | None,
               where: str) -> Iterator[Outcome]:
        stream = self._open.get(key)
        if stream is not None and shape.streaming and _starts_again(stream, value):
            yield self._close(key)
            stream = None
        if stream is None:
            if shape.path != "/completion" and not _first_choice(value):
                return  # the usage event of a stream already judged (another's event came between): nothing to read
            if len(self._open) >= MAX_OPEN_STREAMS:
                yield self._close(next(iter(self._open)))
            stream = self._open[key] = _Stream(shape, line, shape.stream())
        try:
            stream.reading.add(value, where)
        except ProbeFailure as failure:
            stream.invalid = stream.invalid or failure.detail
        stream.events += 1
        if shape.path == "/completion":
            position = value.get("tokens_predicted")
            stream.position = position if isinstance(position, int) else stream.position
            stream.ended = value.get("stop") is True
        elif _first_choice(value).get("finish_reason") is not None:
            stream.ended = True
        self._last = key

    def _close(self, key: tuple[Any, ...]) -> AnswerTally:
        stream = self._open.pop(key)
        if self._last == key:
            self._last = None
        cut = f"not valid: {stream.invalid}" if stream.invalid else None if stream.ended else TRUNCATED
        return _judged(stream.shape.name, stream.reading.reading(), stream.line, cut)


def _starts_again(stream: _Stream, value: dict[str, Any]) -> bool:
    """An event that begins a new answer with the same key (the wire model's fixed id, a server that reuses ids)."""
    if stream.shape.path == "/completion":
        position = value.get("tokens_predicted")
        return stream.ended or (isinstance(position, int) and stream.position is not None and position <= stream.position)
    choice = _first_choice(value)
    if stream.ended and choice:
        return True
    delta = choice.get("delta")
    return stream.events > 0 and isinstance(delta, dict) and bool(delta.get("role"))


def _whole(shape: Shape, value: dict[str, Any], line: int | None) -> AnswerTally:
    try:
        reading = shape.read(value)
    except ProbeFailure as failure:
        return AnswerTally(shape.name, 0, 0, None, False, f"not valid: {failure.detail}", line)
    choices = value.get("choices")
    many = len(choices) if isinstance(choices, list) and len(choices) > 1 else 0
    # llama-server refuses n > 1; the readers read the first choice, so the others are not judged.
    cut = f"{many} choices: only the first is read (llama-server answers with one)" if many else None
    return _judged(shape.name, reading, line, cut)


def _judged(shape: str, reading: Reading, line: int | None, cut: str | None) -> AnswerTally:
    """The canary's classifier on one answer's reading; `cut` says why its tokens, if none is a fill-in, prove nothing."""
    try:
        counted = classify(reading)
    except ProbeFailure as failure:
        if failure.reason is not Reason.NO_LOGPROBS:
            raise
        reason = f"no logprobs ({failure.detail})"
        if reading.draft_n:
            reason = f"drafted (timings.draft_n {reading.draft_n}), cannot tell: {reason}"
        return AnswerTally(shape, len(reading.tokens), 0, reading.draft_n, False, "; ".join(filter(None, (reason, cut))), line)
    if cut and not counted.fill_ins:
        return AnswerTally(shape, counted.tokens, 0, counted.draft_n, False, cut, line)
    return AnswerTally(shape, counted.tokens, counted.fill_ins, counted.draft_n, True, None, line)


def _what(value: Any) -> str:
    if isinstance(value, dict):
        error = value.get("error")
        if error is not None:
            message = error.get("message") if isinstance(error, dict) else error
            return f"an error answer, not a completion: {str(message)[:200]}"
        keys = ", ".join(sorted(str(k) for k in value)[:8]) or "none"
        return f"not an answer of /completion, /v1/completions or /v1/chat/completions: an object with keys {keys}"
    return f"not an answer: a JSON {type(value).__name__}, not an object"
