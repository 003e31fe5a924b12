"""Files of saved answers (JSON, JSONL, SSE transcripts) read line by line and judged per file: `specwatch audit`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import IO, Any

from ..probe.http import sse
from ..probe.http.sse import NotJSON, parse_json
from .received import Answers, NotAnAnswer, Outcome, Status

MAX_RECORD = 64 << 20
"""Bytes in one line, or one multi-line JSON document, at most: 512 tokens with 20 alternatives each are about 1 MB."""
PROBLEMS_KEPT = 100
"""Problems (answers with fill-ins or that cannot be judged, lines that are not answers) kept per file for --json."""
PROBLEMS_SHOWN = 10
GZIP_MAGIC = b"\x1f\x8b"
BOM = b"\xef\xbb\xbf"


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
    """Each line a JSON value, a line of a server-sent event, or part of one pretty-printed JSON document.

    A document starts with `{` or `[` at the start of a line that is not JSON by itself, and ends at a line starting
    with `}` or `]` where the lines so far parse; a line starting with `{`, `[` or `data:` before that means it never did.
    An event ends at a blank line, or at the next line that is not part of one.
    """
    document: list[bytes] | None = None
    start = size = 0
    first_error = ""
    skipping = False
    events = sse.Decoder(MAX_RECORD)
    for number, raw in lines:
        if raw is None:
            for item in events.end():
                yield _framed(item)
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
                        value = parse_json(b"".join(document))
                    except NotJSON:
                        continue
                    document = None
                    yield _Value(value, start)
                continue
        text = raw.strip()
        if not text or text.startswith(sse.FIELDS):
            for item in events.feed(text, number):
                yield _framed(item)
            continue
        for item in events.end():  # a line of no event ends the one before it
            yield _framed(item)
        if text[:1] in (b"{", b"["):
            try:
                yield _Value(parse_json(text), number)
            except NotJSON as err:
                if raw[:1] in (b"{", b"["):
                    document, start, size, first_error = [raw], number, len(raw), err.why
                else:
                    yield NotAnAnswer(f"not JSON ({err.why})", number)
            continue
        try:
            yield _Value(parse_json(text), number)  # a JSON string or number: JSON, though no answer
        except NotJSON:
            yield NotAnAnswer("not JSON, nor a server-sent event's data: line", number)
    for item in events.end():
        yield _framed(item)
    if document is not None:
        try:
            yield _Value(parse_json(b"".join(document)), start)
        except NotJSON:
            yield NotAnAnswer(f"not JSON ({first_error}), nor the start of a document that closes", start)


def _framed(item: sse.Item) -> _Value | _Done | NotAnAnswer:
    """The audit's reading of a transcript's item: an error, or data that is not JSON, is a line that is not an answer."""
    if isinstance(item, sse.Event):
        if item.done:
            return _Done(item.line)
        try:
            return _Value(parse_json(item.data), item.line)
        except NotJSON as err:
            what = ("a data: line that is not JSON" if item.lines == 1 else
                    f"an event of {item.lines} data: lines (no blank line between them) that is not JSON once joined")
            return NotAnAnswer(f"{what} ({err.why})", item.line)
    if isinstance(item, sse.StreamError):
        return NotAnAnswer(f"a stream error: {item.text[:200]}", item.line)
    return NotAnAnswer(f"an event over {MAX_RECORD >> 20} MiB: not an answer", item.line)


def read_answers(stream: IO[bytes]) -> Iterator[Outcome]:
    """Every answer in a binary stream, judged, in the order each is complete; never holds more than one record."""
    answers = Answers()
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
