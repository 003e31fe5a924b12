"""Saved llama-server answers judged by the canary's readers and classifier: `specwatch audit`, and a harness's gate."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import IO, Any

import orjson

from exporter.probe.canary import Endpoint, Reading, Shape, StreamReading, classify, shape_of
from exporter.reasons import ProbeFailure, Reason

MAX_RECORD = 64 << 20
"""Bytes in one line, or one multi-line JSON document, at most: 512 tokens with 20 alternatives each are about 1 MB."""
MAX_OPEN_STREAMS = 1024
"""Streams read side by side (a log of concurrent requests) at most: past it the oldest is judged as it stands."""
PROBLEMS_KEPT = 100
"""Problems (answers with fill-ins or that cannot be judged, lines that are not answers) kept per file for --json."""
PROBLEMS_SHOWN = 10
TRUNCATED = "truncated: the stream ends before its last event (finish_reason, stop or [DONE])"
GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"


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
    answers = _Answers()
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


class _Answers:
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


# Reading files: JSON, JSONL, SSE transcripts, line by line.

@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    line: int


@dataclass(frozen=True, slots=True)
class _Done:
    line: int


def _lines(stream: IO[bytes]) -> Iterator[tuple[int, bytes | None]]:
    """Numbered lines; None for a line over MAX_RECORD, which is skipped, never held."""
    number = 0
    while line := stream.readline(MAX_RECORD + 1):
        number += 1
        if len(line) > MAX_RECORD and not line.endswith(b"\n"):
            while (rest := stream.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            yield number, None
        else:
            yield number, line


def _records(lines: Iterable[tuple[int, bytes | None]]) -> Iterator[_Value | _Done | NotAnAnswer]:
    """Each line a JSON value, a `data:` line of a transcript, or part of one pretty-printed JSON document.

    A document starts with `{` or `[` at the start of a line that is not JSON by itself, and ends at a line starting
    with `}` or `]` where the lines so far parse; a line starting with `{`, `[` or `data:` before that means it never did.
    """
    document: list[bytes] | None = None
    start = size = 0
    first_error = ""
    skipping = False
    for number, raw in lines:
        if raw is None:
            yield NotAnAnswer(f"a line over {MAX_RECORD >> 20} MiB: not an answer", number)
            continue
        if number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        opens = raw[:1] in (b"{", b"[") or raw.startswith(b"data:")
        if skipping and not opens:
            continue
        skipping = False
        if document is not None:
            if opens:
                yield NotAnAnswer(f"not JSON ({first_error}), nor the start of a document that closes", start)
                document = None
            else:
                document.append(raw)
                size += len(raw)
                if size > MAX_RECORD:
                    yield NotAnAnswer(f"a JSON document over {MAX_RECORD >> 20} MiB: save answers one per line (JSONL)", start)
                    document, skipping = None, True
                elif raw[:1] in (b"}", b"]"):
                    try:
                        value = orjson.loads(b"".join(document))
                    except orjson.JSONDecodeError:
                        continue
                    document = None
                    yield _Value(value, start)
                continue
        text = raw.strip()
        if not text:
            continue
        if text.startswith(b"data:"):
            payload = text[5:].strip()
            if payload == b"[DONE]":
                yield _Done(number)
                continue
            try:
                yield _Value(orjson.loads(payload), number)
            except orjson.JSONDecodeError as err:
                yield NotAnAnswer(f"a data: line that is not JSON ({err})", number)
            continue
        if text[:1] in (b"{", b"["):
            try:
                yield _Value(orjson.loads(text), number)
            except orjson.JSONDecodeError as err:
                if raw[:1] in (b"{", b"["):
                    document, start, size, first_error = [raw], number, len(raw), str(err)
                else:
                    yield NotAnAnswer(f"not JSON ({err})", number)
            continue
        if text.startswith((b"event:", b"id:", b"retry:", b":")):
            continue  # the other fields of a server-sent event
        if text.startswith(b"error:"):
            yield NotAnAnswer(f"a stream error: {text[6:].strip()[:200].decode(errors='replace')}", number)
            continue
        try:
            yield _Value(orjson.loads(text), number)  # a JSON string or number: JSON, though no answer
        except orjson.JSONDecodeError:
            yield NotAnAnswer("not JSON, nor a server-sent event's data: line", number)
    if document is not None:
        try:
            yield _Value(orjson.loads(b"".join(document)), start)
        except orjson.JSONDecodeError:
            yield NotAnAnswer(f"not JSON ({first_error}), nor the start of a document that closes", start)


def read_answers(stream: IO[bytes]) -> Iterator[Outcome]:
    """Every answer in a binary stream, judged, in the order each is complete; never holds more than one record."""
    answers = _Answers()
    for record in _records(_lines(stream)):
        if isinstance(record, _Value):
            yield from answers.record(record.value, record.line)
        elif isinstance(record, _Done):
            yield from answers.done()
        else:
            yield record
    yield from answers.end()


# Counting and reporting.

@dataclass
class Counts:
    """What a file (or every file) holds."""

    answers: int = 0
    clean: int = 0
    fill_in_answers: int = 0
    cannot_judge: int = 0
    not_answers: int = 0
    """Lines (or documents) that are not answers: not JSON, an error answer, an object of no endpoint's shape."""
    unreadable: int = 0
    """Files that could not be read to their end."""
    tokens: int = 0
    """Tokens of the judged answers."""
    judged_tokens: int = 0
    fill_ins: int = 0
    drafted: int = 0
    """Answers whose `timings.draft_n` says the server drafted."""

    def add(self, other: Counts) -> None:
        for f in fields(Counts):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def verdict(self) -> Status:
        if self.fill_in_answers:
            return Status.FILL_INS
        if self.cannot_judge or self.not_answers or self.unreadable or not self.answers:
            return Status.CANNOT_JUDGE
        return Status.CLEAN

    @property
    def exit_code(self) -> int:
        return {Status.CLEAN: 0, Status.FILL_INS: 1, Status.CANNOT_JUDGE: 2}[self.verdict]

    def counts(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(Counts)}


@dataclass
class FileReport(Counts):
    file: str = "-"
    shapes: dict[str, int] = field(default_factory=dict)
    """Answers per endpoint shape."""
    error: str | None = None
    problems: list[dict[str, Any]] = field(default_factory=list)
    problems_left_off: int = 0

    def take(self, outcome: Outcome) -> None:
        if isinstance(outcome, NotAnAnswer):
            self.not_answers += 1
            self._problem(outcome.line, "not_an_answer", None, outcome.detail)
            return
        self.answers += 1
        self.shapes[outcome.shape] = self.shapes.get(outcome.shape, 0) + 1
        if outcome.draft_n:
            self.drafted += 1
        status = outcome.status
        if status is Status.CANNOT_JUDGE:
            self.cannot_judge += 1
            self._problem(outcome.line, status.value, outcome.shape, outcome.reason or "")
            return
        self.tokens += outcome.tokens
        self.judged_tokens += outcome.judged_tokens
        self.fill_ins += outcome.fill_ins
        if status is Status.CLEAN:
            self.clean += 1
        else:
            self.fill_in_answers += 1
            self._problem(outcome.line, status.value, outcome.shape, outcome.describe())

    def _problem(self, line: int | None, status: str, shape: str | None, detail: str) -> None:
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append({"line": line, "status": status, "shape": shape, "detail": detail})
        else:
            self.problems_left_off += 1

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "verdict": self.verdict.value, "exit_code": self.exit_code, **self.counts(),
                "shapes": self.shapes, "error": self.error, "problems": self.problems,
                "problems_left_off": self.problems_left_off}


def audit_file(name: str, stream: IO[bytes] | None = None) -> FileReport:
    """Read and judge one file (`-` or a given stream: that stream), line by line."""
    report = FileReport(file=name)
    try:
        if stream is None:
            with open(name, "rb") as opened:
                _audit_stream(report, opened)
        else:
            _audit_stream(report, stream)
    except OSError as err:
        report.error = f"cannot read {name}: {err.strerror or err}"
        report.unreadable = 1
    return report


def _audit_stream(report: FileReport, stream: IO[bytes]) -> None:
    head = stream.peek(2)[:2] if hasattr(stream, "peek") else b""
    if head == GZIP_MAGIC:
        report.error = f"{report.file} is gzip-compressed: decompress it first (zcat FILE | specwatch audit -)"
        report.unreadable = 1
        return
    for outcome in read_answers(stream):
        report.take(outcome)


def _many(count: int, thing: str) -> str:
    return f"{count} {thing}{'' if count == 1 else 's'}"


def _not_answers(count: int) -> str:
    return f"{count} not {'an answer' if count == 1 else 'answers'}"


def _summary(totals: Counts, files: int) -> str:
    where = f"in {_many(files, 'file')}"
    if totals.verdict is Status.FILL_INS:
        verb = "carries" if totals.fill_in_answers == 1 else "carry"
        return (f"{totals.fill_in_answers} of {_many(totals.answers, 'answer')} {where} {verb} fill-in logprobs "
                f"({totals.fill_ins} of {totals.judged_tokens} tokens after the first): do not score them")
    if totals.verdict is Status.CLEAN:
        every = "the answer" if totals.answers == 1 else f"all {totals.answers} answers"
        return (f"{every} {where} {'carries' if totals.answers == 1 else 'carry'} real logprobs "
                f"({totals.judged_tokens} tokens after the first, each with its alternatives)")
    parts = []
    if totals.cannot_judge:
        parts.append(f"{totals.cannot_judge} of {_many(totals.answers, 'answer')} cannot be judged")
    if totals.not_answers:
        parts.append(_not_answers(totals.not_answers))
    if totals.unreadable:
        parts.append(f"{_many(totals.unreadable, 'file')} not read")
    if not totals.answers:
        parts.append(f"no answers {where}")
    return "; ".join(parts) + ": not proven real"


def _file_lines(report: FileReport) -> list[str]:
    name = "<stdin>" if report.file == "-" else report.file
    lines = []
    if report.answers or report.not_answers or not report.error:
        judged = (f"fill-ins {report.fill_ins} of {report.judged_tokens} tokens after the first" if report.judged_tokens
                  else "no tokens judged")
        counts = (f"{_many(report.answers, 'answer')}: {report.clean} clean, {report.fill_in_answers} with fill-ins, "
                  f"{report.cannot_judge} cannot judge" if report.answers else "no answers")
        extra = f", {_not_answers(report.not_answers)}" if report.not_answers else ""
        lines.append(f"{name}: {counts}{extra}; {judged}")
    if report.error:
        lines.append(f"{name}: {report.error}")
    for problem in report.problems[:PROBLEMS_SHOWN]:
        where = f"line {problem['line']}" if problem["line"] is not None else "?"
        detail = problem["detail"]
        if problem["status"] == "not_an_answer":
            detail = f"not an answer: {detail}" if not detail.startswith("not ") else detail
        elif problem["status"] == Status.CANNOT_JUDGE:
            detail = f"cannot judge ({problem['shape']}): {detail}"
        lines.append(f"  {where}: {detail}")
    more = len(report.problems) - PROBLEMS_SHOWN + report.problems_left_off
    if more > 0:
        lines.append(f"  ... and {more} more (--json lists the first {PROBLEMS_KEPT})")
    return lines


def run_audit(names: list[str], *, as_json: bool, stdin: IO[bytes], out: IO[str]) -> int:
    """`specwatch audit`: judge every file, print what each holds and the verdict; returns the exit code."""
    totals = Counts()
    reports = []
    for name in names:
        report = audit_file(name, stdin if name == "-" else None)
        totals.add(report)
        if as_json:
            reports.append(report.as_json())
        else:
            out.write("\n".join(_file_lines(report)) + "\n")
            out.flush()
    summary = _summary(totals, len(names))
    if as_json:
        document = {"verdict": totals.verdict.value, "exit_code": totals.exit_code, "summary": summary, "files": reports,
                    "totals": {"files": len(names), **totals.counts()}}
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(f"{totals.verdict.value.upper()}: {summary}\n")
    return totals.exit_code
