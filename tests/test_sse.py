"""The one server-sent-event framer and JSON parser, and what the live canary and `specwatch audit` each make of them."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from specwatch.gate.audit import read_answers
from specwatch.gate.received import AnswerTally, NotAnAnswer
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.http.sse import Decoder, Event, Item, NotJSON, StreamError, TooLarge, parse_json
from specwatch.reasons import ProbeFailure, Reason
from tests.support.fakes import serving


def decoded(lines: list[bytes], max_bytes: int = 1 << 20) -> list[Item]:
    """Every item the lines give, numbered from 1, the end included."""
    decoder = Decoder(max_bytes)
    items = [item for number, line in enumerate(lines, 1) for item in decoder.feed(line, number)]
    return [*items, *decoder.end()]


FRAMINGS = [
    ("one event", [b'data: {"a": 1}', b""], [Event(b'{"a": 1}', 1, 1)]),
    ("no space after the colon", [b"data:1", b""], [Event(b"1", 1, 1)]),
    ("only the one space after the colon is the field's", [b"data:  1", b""], [Event(b" 1", 1, 1)]),
    ("several data lines joined with line feeds", [b"data: {", b'data: "a": 1', b"data: }", b""],
     [Event(b'{\n"a": 1\n}', 1, 3)]),
    ("a data line with nothing after the colon", [b"data: [", b"data:", b"data: ]", b""], [Event(b"[\n\n]", 1, 3)]),
    ("CRLF line ends", [b"data: 1\r\n", b"\r\n", b"data: 2\r", b"\r"], [Event(b"1", 1, 1), Event(b"2", 3, 1)]),
    ("comments, other fields and unknown ones are read past", [b": ping", b"event: message", b"id: 7", b"retry: 10",
                                                              b"data: 1", b"x-mine: y", b"nonsense", b"data: 2", b""],
     [Event(b"1\n2", 5, 2)]),
    ("blank lines alone give nothing", [b"", b"", b"   "], []),
    ("the end ends an event without its blank line", [b"data: 1", b"", b"data: 2"], [Event(b"1", 1, 1), Event(b"2", 3, 1)]),
    ("[DONE] is an event", [b"data: [DONE]", b""], [Event(b"[DONE]", 1, 1)]),
    ("an error line ends the event it cuts short, then is reported", [b"data: 1", b'error: {"message": "boom"}', b""],
     [Event(b"1", 1, 1), StreamError('{"message": "boom"}', 2)]),
    ("an indented transcript", [b"  data: 1  ", b"  "], [Event(b"1", 1, 1)]),
]


@pytest.mark.parametrize(("lines", "items"), [(lines, items) for _, lines, items in FRAMINGS], ids=[n for n, _, _ in FRAMINGS])
def test_the_decoder_frames_events_as_the_spec_says(lines: list[bytes], items: list[Item]) -> None:
    assert decoded(lines) == items


def test_done_is_told_by_the_event() -> None:
    assert [e.done for e in decoded([b"data: [DONE]", b"", b"data:[DONE] ", b"", b'data: "[DONE]"', b""])] == [True, True, False]


def test_an_event_over_the_cap_is_told_and_the_next_is_read() -> None:
    decoder = Decoder(10)
    assert decoder.feed(b"data: " + b"x" * 6, 1) == ()
    assert decoder.feed(b"data: " + b"x" * 6, 2) == ()
    assert decoder.feed(b"data: " + b"x" * 1000, 3) == ()
    assert decoder.feed(b"", 4) == (TooLarge(10, 1),)
    assert decoder.feed(b"data: 12345678", 5) == ()
    assert decoder.feed(b"", 6) == (Event(b"12345678", 5, 1),)


@pytest.mark.parametrize(("body", "value"), [
    (b'{"text": "a\\ud800"}', {"text": "a\ud800"}),  # a lone surrogate: orjson refuses it, JSON allows it
    ('{"text": "é"}'.encode("utf-16"), {"text": "é"}),
    (b"123456789012345678901234567890", 1.2345678901234568e29),  # beyond 64 bits, a float: no integer field takes it
    (b'{"a": [1, 2.5, null, true]}', {"a": [1, 2.5, None, True]}),
])
def test_what_json_allows_is_parsed(body: bytes, value: object) -> None:
    assert parse_json(body) == value


@pytest.mark.parametrize(("body", "why"), [
    (b'{"a": NaN}', "NaN is not valid JSON"),
    (b"[Infinity]", "Infinity is not valid JSON"),
    (b"{oops", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    (b"", "Expecting value: line 1 column 1 (char 0)"),
])
def test_what_json_refuses_is_not_json_to_both_readers(body: bytes, why: str) -> None:
    with pytest.raises(NotJSON) as caught:
        parse_json(body)
    assert isinstance(caught.value, ProbeFailure) and caught.value.reason is Reason.INVALID_JSON
    assert caught.value.why == why and caught.value.detail.startswith("not JSON (")


async def _live(transcript: bytes) -> list[object]:
    def serve(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=transcript)

    async with serving(serve)() as client:
        return await Fetcher(client, 1 << 20).post_events("http://a:8080/completion", {}, headers={}, timeout=5)


def _saved(transcript: bytes) -> list[object]:
    return list(read_answers(io.BytesIO(transcript)))


async def test_both_readers_frame_one_transcript_alike() -> None:
    chunks = [{"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]} for i in range(3)]
    pretty = b"".join(b"".join(b"data: " + line + b"\n" for line in json.dumps(c, indent=1).encode().split(b"\n")) + b"\n"
                      for c in chunks)
    transcript = b": keep-alive\n\n" + pretty + b"data: [DONE]\n\n" + b'data: {"after": "done"}\n\n'
    assert await _live(transcript) == chunks  # the canary stops reading at [DONE]
    answer, after = _saved(transcript)  # the audit reads on: [DONE] ends one stream, and a file holds many
    assert isinstance(answer, AnswerTally) and (answer.shape, answer.tokens, answer.line) == ("chat_stream", 3, 3)
    assert isinstance(after, NotAnAnswer) and after.line == transcript.count(b"\n", 0, transcript.index(b"after")) + 1


async def test_an_error_line_is_a_server_error_live_and_a_line_that_is_not_an_answer_in_a_file() -> None:
    transcript = b'data: {"choices": [{"index": 0, "delta": {"content": " the"}}]}\n\nerror: {"message": "slot crashed"}\n\n'
    with pytest.raises(ProbeFailure) as caught:
        await _live(transcript)
    assert (caught.value.reason, caught.value.detail) == (Reason.SERVER_ERROR, 'stream error: {"message": "slot crashed"}')
    problems = [o for o in _saved(transcript) if isinstance(o, NotAnAnswer)]
    assert [(p.detail, p.line) for p in problems] == [('a stream error: {"message": "slot crashed"}', 3)]


async def test_data_that_is_not_json_is_invalid_json_live_and_names_its_line_in_a_file() -> None:
    transcript = b': keep-alive\n\ndata: {"choices": [\ndata: oops\n\n'
    with pytest.raises(ProbeFailure) as caught:
        await _live(transcript)
    assert caught.value.reason is Reason.INVALID_JSON
    problems = [o for o in _saved(transcript) if isinstance(o, NotAnAnswer)]
    assert [p.line for p in problems] == [3] and problems[0].detail.startswith("an event of 2 data: lines")
