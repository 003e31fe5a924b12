"""`specwatch audit` and the Python API on saved answers of every shape the wire model (and the OpenAI SDK) gives."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specwatch.cli import main
from specwatch.endpoints import Endpoint
from specwatch.gate.audit import audit_file, read_answers, run_audit
from specwatch.gate.received import AnswerTally, CannotJudge, FillInLogprobs, NotAnAnswer, Status, require_real, tally
from specwatch.gate.shapes import shape_of
from specwatch.probe import probes
from specwatch.probe.canary import TABLE, classify
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.targets import ServerConfig
from tests.support import markdown
from tests.support.fakes import serving
from tests.support.process import run_measured
from tests.support.saved import events, saved, sdk_dump, sdk_objects, unit, write_repeated
from tests.support.wire import FakeLlama

ROOT = Path(__file__).resolve().parent.parent
OPENAI_SHAPED = [e for e in Endpoint if TABLE[e].path != "/completion"]


def audit(tmp_path: Path, content: bytes, *args: str, name: str = "answers") -> subprocess.CompletedProcess:
    """`specwatch audit FILE ARGS` on `content`, in this process (the subprocess tests below run the real command)."""
    path = tmp_path / name
    path.write_bytes(content)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["audit", str(path), *args])
    return subprocess.CompletedProcess(["specwatch", "audit", str(path), *args], code, out.getvalue(), err.getvalue())


def audited(tmp_path: Path, content: bytes) -> dict[str, Any]:
    """--json's object for one file."""
    result = audit(tmp_path, content, "--json")
    assert "Traceback" not in result.stderr, result.stderr
    document = json.loads(result.stdout)
    assert document["exit_code"] == result.returncode
    (only,) = document["files"]
    return only


def jsonl(*answers: bytes) -> bytes:
    """Each JSON answer on a line of its own, as a harness appends them."""
    return b"".join(a.replace(b"\n", b"") + b"\n" for a in answers)


# Shapes.

def _shapes(fake: FakeLlama, endpoint: Endpoint, **changes: Any) -> list[str | None]:
    answer = saved(fake, endpoint, 4, **changes)
    parsed = events(answer) if TABLE[endpoint].streaming else [json.loads(answer)]
    return [None if (s := shape_of(value)) is None else s.name for value in parsed]


@pytest.mark.parametrize(("endpoint", "expected"), [
    (Endpoint.COMPLETION, ["completion"]),
    (Endpoint.COMPLETION_POST_SAMPLING, ["completion_post_sampling"]),
    (Endpoint.V1_COMPLETION, ["v1_completion"]),
    (Endpoint.CHAT, ["chat"]),
    # A stream's last event looks like a whole answer: only the events before it tell them apart.
    (Endpoint.COMPLETION_STREAM, ["completion_stream"] * 4 + ["completion"]),
    (Endpoint.V1_COMPLETION_STREAM, ["v1_completion_stream"] * 4 + ["v1_completion"]),
    (Endpoint.CHAT_STREAM, ["chat_stream"] * 6),
])
def test_each_endpoint_answer_and_event_has_its_shape(endpoint: Endpoint, expected: list[str]) -> None:
    assert _shapes(FakeLlama.plain(tokens=4), endpoint) == expected


def test_a_post_sampling_stream_is_told_by_its_keys() -> None:
    shapes = _shapes(FakeLlama.plain(tokens=4), Endpoint.COMPLETION_STREAM, post_sampling_probs=True)
    assert shapes == ["completion_post_sampling_stream"] * 4 + ["completion"]


@pytest.mark.parametrize("endpoint", OPENAI_SHAPED)
def test_the_sdk_dumps_have_the_shape_of_what_the_server_sent(endpoint: Endpoint) -> None:
    fake = FakeLlama.draft(tokens=4)
    dumped = [shape_of(json.loads(line)) for line in sdk_dump(fake, endpoint, 4).splitlines()]
    assert [s.name if s else None for s in dumped] == _shapes(fake, endpoint)


@pytest.mark.parametrize("value", [
    {}, [], "text", 3, None, {"choices": []}, {"content": 1}, {"content": "hi"}, {"object": "response", "choices": [{"text": "x"}]},
    {"error": {"code": 500, "message": "boom", "type": "server_error"}}, {"status": "ok"},
])
def test_what_is_not_an_answer_has_no_shape(value: Any) -> None:
    assert shape_of(value) is None


# The same classifier as the canary.

@pytest.mark.parametrize("kind", ["plain", "draft", "ngram"])
@pytest.mark.parametrize("endpoint", list(Endpoint))
async def test_the_audit_of_a_canary_answer_counts_what_the_canary_counted(endpoint: Endpoint, kind: str, tmp_path: Path) -> None:
    fake = {"plain": FakeLlama.plain(tokens=24), "draft": FakeLlama.draft(tokens=24),
            "ngram": FakeLlama(speculative=True, fill_ins={4, 5, 9, 17}, drafts=9, tokens=24)}[kind]
    bodies: list[bytes] = []

    def keep(request: httpx.Request) -> httpx.Response:
        response = fake(request)
        bodies.append(response.content)
        return response

    async with serving(keep)() as client:
        canary = await probes.canary(Fetcher(client, 1 << 22), ServerConfig(name="a", url="http://a:8080"), endpoint,
                                     tokens=24, timeout=5)
    (body,) = bodies
    counted = audited(tmp_path, body)
    assert (counted["answers"], counted["tokens"], counted["fill_ins"], counted["judged_tokens"], counted["drafted"]) == (
        1, canary.tokens, canary.fill_ins, canary.judged_tokens, int(bool(canary.draft_n)))
    api = tally(json.loads(body) if not TABLE[endpoint].streaming else events(body))
    assert (api.tokens, api.fill_ins, api.draft_n, api.judged_tokens) == (canary.tokens, canary.fill_ins, canary.draft_n,
                                                                         canary.judged_tokens)


def _with_lone_surrogate(value: Any) -> Any:
    """The answer with a lone surrogate ending each text, as a server that split a character may send (orjson refuses)."""
    if isinstance(value, dict):
        return {k: v + "\ud800" if k in ("content", "text", "token") and isinstance(v, str) and v
                else _with_lone_surrogate(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_with_lone_surrogate(v) for v in value]
    return value


def _reframed(body: bytes, endpoint: Endpoint, change: Callable[[Any], bytes]) -> bytes:
    """The body with each JSON value (each event's, in a stream) written anew by `change`, as `data:` lines."""
    if not TABLE[endpoint].streaming:
        return change(json.loads(body))
    done = b"data: [DONE]\n\n" if b"[DONE]" in body else b""
    return b"".join(b"".join(b"data: " + line + b"\n" for line in change(e).split(b"\n")) + b"\n" for e in events(body)) + done


async def _canary_and_audit(fake: FakeLlama, endpoint: Endpoint, served: Callable[[bytes], bytes],
                            tmp_path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What the canary counted of `served(answer)` and what `specwatch audit` counted of the same bytes."""
    bodies: list[bytes] = []

    def serve(request: httpx.Request) -> httpx.Response:
        response = fake(request)
        body = served(response.content) if request.method == "POST" else response.content
        bodies.append(body)
        return httpx.Response(response.status_code, headers={"Content-Type": response.headers["content-type"]}, content=body)

    async with serving(serve)() as client:
        canary = await probes.canary(Fetcher(client, 1 << 22), ServerConfig(name="a", url="http://a:8080"), endpoint,
                                     tokens=24, timeout=5)
    counted = audited(tmp_path, bodies[-1])
    assert (counted["answers"], counted["not_answers"]) == (1, 0), counted["problems"]
    return ((canary.tokens, canary.fill_ins, canary.judged_tokens, int(bool(canary.draft_n))),
            (counted["tokens"], counted["fill_ins"], counted["judged_tokens"], counted["drafted"]))


def _orjson_refuses(value: bytes) -> bool:
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return True
    return False


@pytest.mark.parametrize("endpoint", list(Endpoint))
async def test_an_answer_with_a_lone_surrogate_is_judged_alike_by_the_canary_and_the_audit(endpoint: Endpoint,
                                                                                            tmp_path: Path) -> None:
    def lone(body: bytes) -> bytes:
        changed = _reframed(body, endpoint, lambda value: json.dumps(_with_lone_surrogate(value)).encode())
        values = [line[6:] for line in changed.splitlines() if line.startswith(b"data: {")] or [changed]
        assert sum(map(_orjson_refuses, values)) >= len(values) - 2  # all but a stream's first and last: no text
        return changed

    canary, audit_ = await _canary_and_audit(FakeLlama.draft(tokens=24), endpoint, lone, tmp_path)
    assert canary == audit_ == (24, 23, 23, 1)


@pytest.mark.parametrize("endpoint", [e for e in Endpoint if TABLE[e].streaming])
@pytest.mark.parametrize("framing", ["multi-line data", "crlf, comments and fields", "no blank line at the end"])
async def test_a_stream_framed_any_way_sse_allows_is_judged_alike_by_the_canary_and_the_audit(
        endpoint: Endpoint, framing: str, tmp_path: Path) -> None:
    def framed(body: bytes) -> bytes:
        if framing == "multi-line data":  # each event's JSON across several data: lines, joined with line feeds
            return _reframed(body, endpoint, lambda value: json.dumps(value, indent=1).encode())
        if framing == "crlf, comments and fields":
            return b": ping\r\nevent: message\r\nid: 1\r\nretry: 100\r\n" + body.replace(b"\n", b"\r\n")
        return body.replace(b"data: [DONE]\n\n", b"").rstrip(b"\n")

    ngram = FakeLlama(speculative=True, fill_ins={4, 5, 9, 17}, drafts=9, tokens=24)
    canary, audit_ = await _canary_and_audit(ngram, endpoint, framed, tmp_path)
    assert canary == audit_ and canary[:3] == (24, 4, 23)


# Exit codes and what each file line says.

@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_plain_server_s_answers_are_clean_and_exit_0(endpoint: Endpoint, tmp_path: Path) -> None:
    fake = FakeLlama.plain(tokens=16)
    result = audit(tmp_path, saved(fake, endpoint) + b"\n" + saved(fake, endpoint))
    assert result.returncode == 0, result.stdout
    assert re.search(r": 2 answers: 2 clean, 0 with fill-ins, 0 cannot judge; fill-ins 0 of 30 tokens after the first", result.stdout)
    assert result.stdout.splitlines()[-1].startswith("CLEAN: all 2 answers in 1 file carry real logprobs")


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_draft_server_s_answers_have_fill_ins_and_exit_1(endpoint: Endpoint, tmp_path: Path) -> None:
    result = audit(tmp_path, saved(FakeLlama.plain(tokens=16), endpoint) + b"\n" + saved(FakeLlama.draft(tokens=16), endpoint))
    assert result.returncode == 1, result.stdout
    assert "1 clean, 1 with fill-ins" in result.stdout and "fill-ins 15 of 30 tokens after the first" in result.stdout
    assert re.search(rf"  line \d+: fill-ins: 15 of 15 tokens after the first \({endpoint.value}, timings.draft_n 16\)",
                     result.stdout), result.stdout
    assert result.stdout.splitlines()[-1].startswith("FILL_INS: 1 of 2 answers in 1 file carries fill-in logprobs")


@pytest.mark.real
def test_fill_ins_win_over_what_cannot_be_judged_and_over_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "draft.json").write_bytes(saved(FakeLlama.draft(tokens=16), Endpoint.CHAT))
    (tmp_path / "bad.jsonl").write_bytes(b'{"status": "ok"}\n')
    result = subprocess.run([sys.executable, "-m", "specwatch", "audit", str(tmp_path / "draft.json"), str(tmp_path / "bad.jsonl"),
                             str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1
    assert f"{tmp_path / 'missing.json'}: cannot read {tmp_path / 'missing.json'}: No such file or directory" in result.stdout


@pytest.mark.parametrize(("content", "message"), [
    (b"", "no answers"),
    (b"\n\n", "no answers"),
    (b'{"status": "ok"}\n', "line 1: not an answer of /completion, /v1/completions or /v1/chat/completions: "
                           "an object with keys status"),
    (b'{"error": {"code": 503, "message": "Loading model"}}\n', "line 1: not an answer: an error answer, not a completion: Loading model"),
    (b"hello\n", "line 1: not JSON, nor a server-sent event's data: line"),
    (b"data: {oops\n", "line 1: not an answer: a data: line that is not JSON"),
    (b'\n\ndata: {"a": 1}\ndata: {"b": 2}\n\n', "line 3: not an answer: an event of 2 data: lines (no blank line between "
                                              "them) that is not JSON once joined (Extra data: line 2 column 1"),
    (b'data: {"choices": []}\nerror: {"message": "slot crashed"}\n\n',
     'line 2: not an answer: a stream error: {"message": "slot crashed"}'),
    (b"[[1]]\n", "line 1: not an answer: a list inside a list"),
    (b'"text"\n', "line 1: not an answer: a JSON str, not an object"),
])
def test_what_is_not_an_answer_exits_2_with_its_line(content: bytes, message: str, tmp_path: Path) -> None:
    result = audit(tmp_path, content)
    assert result.returncode == 2 and message in result.stdout, result.stdout
    assert result.stdout.splitlines()[-1].startswith("CANNOT_JUDGE:")


def test_an_unknown_object_among_answers_is_blamed_on_its_line(tmp_path: Path) -> None:
    plain = saved(FakeLlama.plain(tokens=16), Endpoint.CHAT)
    content = jsonl(plain, plain, b'{"id": 7, "kind": "eval-result", "score": 0.93}', plain)
    counted = audited(tmp_path, content)
    assert (counted["answers"], counted["clean"], counted["not_answers"], counted["exit_code"]) == (3, 3, 1, 2)
    assert counted["problems"] == [{"line": 3, "status": "not_an_answer", "shape": None, "detail": (
        "not an answer of /completion, /v1/completions or /v1/chat/completions: an object with keys id, kind, score")}]


@pytest.mark.real
def test_an_unreadable_file_exits_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "specwatch", "audit", str(tmp_path)], capture_output=True, text=True,
                            timeout=60, cwd=ROOT)
    assert result.returncode == 2 and "cannot read" in result.stdout and "Is a directory" in result.stdout


def test_a_gzipped_file_says_to_decompress_it(tmp_path: Path) -> None:
    result = audit(tmp_path, gzip.compress(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT)), name="answers.jsonl.gz")
    assert result.returncode == 2 and "is gzip-compressed: decompress it first (zcat FILE | specwatch audit -)" in result.stdout


@pytest.mark.real
@pytest.mark.parametrize("args", [(), ("--bogus", "x")])
def test_usage_errors_exit_64(args: tuple[str, ...]) -> None:
    result = subprocess.run([sys.executable, "-m", "specwatch", "audit", *args], capture_output=True, text=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 64 and "error:" in result.stderr and "Traceback" not in result.stderr


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    out = capsys.readouterr().out
    assert "0  every answer was judged" in out and "1  an answer carries fill-in logprobs" in out
    assert "2  could not judge" in out and "64 command-line usage error" in out


@pytest.mark.real
def test_standard_input(tmp_path: Path) -> None:
    content = saved(FakeLlama.draft(tokens=16), Endpoint.CHAT_STREAM)
    result = subprocess.run([sys.executable, "-m", "specwatch", "audit", "-"], input=content, capture_output=True, timeout=60,
                            cwd=ROOT)
    assert result.returncode == 1 and b"<stdin>: 1 answer: 0 clean, 1 with fill-ins" in result.stdout


# What cannot be judged: never clean.

@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_an_answer_without_logprobs_says_no_logprobs_never_0_of_0(endpoint: Endpoint, tmp_path: Path) -> None:
    off = {"chat": {"logprobs": None, "top_logprobs": None}, "v1": {"logprobs": None}, "native": {"n_probs": None}}
    kind = "chat" if "chat" in endpoint.value else "v1" if "v1" in endpoint.value else "native"
    result = audit(tmp_path, saved(FakeLlama.plain(tokens=16), endpoint, **off[kind]))
    assert result.returncode == 2, result.stdout
    # Nothing tells a post_sampling_probs answer without probabilities from any other /completion answer.
    shape = "completion" if endpoint is Endpoint.COMPLETION_POST_SAMPLING else endpoint.value
    assert f"cannot judge ({shape}): no logprobs (" in result.stdout
    assert "0 of 0" not in result.stdout and "no tokens judged" in result.stdout


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_an_answer_that_drafted_without_alternatives_is_drafted_cannot_tell(endpoint: Endpoint, tmp_path: Path) -> None:
    off = {"chat": {"logprobs": None, "top_logprobs": None}, "v1": {"logprobs": None}, "native": {"n_probs": None}}
    kind = "chat" if "chat" in endpoint.value else "v1" if "v1" in endpoint.value else "native"
    counted = audited(tmp_path, saved(FakeLlama.draft(tokens=16), endpoint, **off[kind]))
    assert (counted["exit_code"], counted["cannot_judge"], counted["clean"], counted["drafted"]) == (2, 1, 0, 1)
    assert counted["problems"][0]["detail"].startswith("drafted (timings.draft_n 16), cannot tell: no logprobs")


def test_a_real_zero_logprob_with_alternatives_is_real(tmp_path: Path) -> None:
    fake = FakeLlama.plain(tokens=8, real_zero_at={0, 3, 5})
    for endpoint in (Endpoint.CHAT, Endpoint.COMPLETION, Endpoint.V1_COMPLETION_STREAM):
        counted = audited(tmp_path, saved(fake, endpoint, 8))
        assert (counted["exit_code"], counted["clean"], counted["fill_ins"]) == (0, 1, 0)


def test_post_sampling_answers_and_streams(tmp_path: Path) -> None:
    for fake, code in ((FakeLlama.plain(tokens=16), 0), (FakeLlama.draft(tokens=16), 1)):
        whole = saved(fake, Endpoint.COMPLETION_POST_SAMPLING)
        stream = saved(fake, Endpoint.COMPLETION_STREAM, post_sampling_probs=True)
        counted = audited(tmp_path, jsonl(whole) + stream)
        assert counted["shapes"] == {"completion_post_sampling": 1, "completion_post_sampling_stream": 1}
        assert (counted["exit_code"], counted["answers"], counted["fill_ins"]) == (code, 2, 15 * 2 * code)


def _legacy(values: list[float], tops: list[dict | None]) -> bytes:
    """OpenAI's legacy completions shape, as a converting proxy in front of llama-server sends it."""
    return json.dumps({"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": [{
        "text": " a" * len(values), "index": 0, "finish_reason": "length", "logprobs": {
            "tokens": [" a"] * len(values), "token_logprobs": values, "top_logprobs": tops, "text_offset": list(range(len(values)))}}],
    }).encode()


def test_the_legacy_completions_shape(tmp_path: Path) -> None:
    real = _legacy([-0.3, 0.0, -1.2], [{" a": -0.3, " b": -2.0}, {" a": 0.0, " b": -9.0}, {" a": -1.2, " c": -1.5}])
    filled = _legacy([-0.3, 0.0, 0.0], [{" a": -0.3, " b": -2.0}, {}, None])
    bare = _legacy([-0.3, 0.0], None)  # type: ignore[arg-type]
    counted = audited(tmp_path, jsonl(real, filled, bare))
    assert (counted["clean"], counted["fill_in_answers"], counted["cannot_judge"], counted["fill_ins"]) == (1, 1, 1, 2)
    assert counted["shapes"] == {"v1_completion": 3}
    assert counted["problems"][1] == {"line": 3, "status": "cannot_judge", "shape": "v1_completion",
                                      "detail": "no logprobs (alternatives were requested but none came back)"}


def test_values_that_are_not_logprobs_are_not_valid_never_clean(tmp_path: Path) -> None:
    answer = json.loads(saved(FakeLlama.plain(tokens=4), Endpoint.CHAT, 4))
    answer["choices"][0]["logprobs"]["content"][2]["logprob"] = 0.5
    counted = audited(tmp_path, json.dumps(answer).encode())
    assert counted["exit_code"] == 2
    assert counted["problems"][0]["detail"] == "not valid: choices[0].logprobs.content[2].logprob 0.5 is positive"


# Streams: one answer until its last event, [DONE] or another id.

def test_a_truncated_transcript_cannot_be_judged_unless_it_already_shows_fill_ins(tmp_path: Path) -> None:
    for endpoint in (Endpoint.CHAT_STREAM, Endpoint.COMPLETION_STREAM, Endpoint.V1_COMPLETION_STREAM):
        plain = saved(FakeLlama.plain(tokens=16), endpoint).split(b"\n\n")
        cut = b"\n\n".join(plain[:6]) + b"\n\n"
        counted = audited(tmp_path, cut)
        assert (counted["exit_code"], counted["cannot_judge"]) == (2, 1), endpoint
        assert counted["problems"][0]["detail"].startswith("truncated: the stream ends before its last event")
        draft = saved(FakeLlama.draft(tokens=16), endpoint).split(b"\n\n")
        counted = audited(tmp_path, b"\n\n".join(draft[:6]) + b"\n\n")
        assert (counted["exit_code"], counted["fill_in_answers"]) == (1, 1), endpoint


def test_a_transcript_cut_inside_a_line_blames_that_line(tmp_path: Path) -> None:
    transcript = saved(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM)
    cut = transcript[: transcript.index(b"data:", 2000) + 40]
    line = cut.count(b"\n") + 1
    counted = audited(tmp_path, cut)
    assert counted["exit_code"] == 2
    assert {"line": line, "status": "not_an_answer", "shape": None} == {k: counted["problems"][0][k] for k in ("line", "status", "shape")}
    assert counted["problems"][0]["detail"].startswith("a data: line that is not JSON")
    assert counted["problems"][1]["detail"].startswith("truncated")


def test_transcripts_back_to_back_are_one_answer_each(tmp_path: Path) -> None:
    plain, draft = FakeLlama.plain(tokens=16), FakeLlama.draft(tokens=16)
    content, starts = b"", []
    for endpoint in (Endpoint.CHAT_STREAM, Endpoint.V1_COMPLETION_STREAM, Endpoint.COMPLETION_STREAM):
        for fake in (plain, draft, plain):
            if fake is draft:
                starts.append(content.count(b"\n") + 1)
            content += saved(fake, endpoint)
    counted = audited(tmp_path, content)
    assert (counted["answers"], counted["clean"], counted["fill_in_answers"], counted["fill_ins"]) == (9, 6, 3, 45)
    assert [p["line"] for p in counted["problems"]] == starts


def _with_id(value: dict[str, Any], answer_id: str) -> bytes:
    return json.dumps({**value, "id": answer_id}).encode()


def test_interleaved_streams_are_told_apart_by_id(tmp_path: Path) -> None:
    plain = events(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM))
    draft = events(saved(FakeLlama.draft(tokens=16), Endpoint.CHAT_STREAM))
    lines = [line for pair in zip(plain, draft, strict=True) for line in (_with_id(pair[0], "a"), _with_id(pair[1], "b"))]
    counted = audited(tmp_path, jsonl(*lines))
    assert (counted["answers"], counted["clean"], counted["fill_in_answers"], counted["fill_ins"]) == (2, 1, 1, 15)
    assert counted["problems"][0]["line"] == 2


def test_a_usage_event_after_another_stream_s_event_is_no_answer_of_its_own(tmp_path: Path) -> None:
    plain = events(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM))
    usage = {**plain[-1], "choices": [], "usage": {"completion_tokens": 16}}
    lines = [_with_id(c, "a") for c in plain[:-1]] + [_with_id(plain[0], "b"), _with_id(plain[-1], "a"),
                                                      *(_with_id(c, "b") for c in plain[1:]), _with_id(usage, "a")]
    counted = audited(tmp_path, jsonl(*lines))
    assert (counted["answers"], counted["clean"], counted["exit_code"]) == (2, 2, 0)


def test_a_usage_event_after_the_last_choice_still_belongs_to_its_stream(tmp_path: Path) -> None:
    """With stream_options.include_usage, llama-server sends timings (draft_n) in an event of no choices after finish_reason."""
    chunks = events(saved(FakeLlama.draft(tokens=16), Endpoint.CHAT_STREAM, logprobs=None, top_logprobs=None))
    timings = chunks[-1].pop("timings")
    usage = {**chunks[-1], "choices": [], "usage": {"completion_tokens": 16}, "timings": timings}
    counted = audited(tmp_path, jsonl(*(json.dumps(c).encode() for c in [*chunks, usage])))
    assert (counted["answers"], counted["drafted"], counted["cannot_judge"]) == (1, 1, 1)
    assert counted["problems"][0]["detail"].startswith("drafted (timings.draft_n 16), cannot tell")


@pytest.mark.parametrize("endpoint", [e for e in OPENAI_SHAPED if TABLE[e].streaming])
def test_sdk_chunk_dumps_are_grouped_into_their_streams(endpoint: Endpoint, tmp_path: Path) -> None:
    plain, draft = FakeLlama.plain(tokens=16), FakeLlama.draft(tokens=16)
    # The wire model gives every answer the same id: the stream's own start (or the events after its last) tell them apart.
    content = sdk_dump(plain, endpoint) + sdk_dump(draft, endpoint) + sdk_dump(plain, endpoint)
    counted = audited(tmp_path, content)
    assert (counted["answers"], counted["clean"], counted["fill_in_answers"], counted["fill_ins"]) == (3, 2, 1, 15)


def test_a_pretty_printed_answer_and_a_list_of_answers(tmp_path: Path) -> None:
    pretty = json.dumps(json.loads(saved(FakeLlama.draft(tokens=16), Endpoint.CHAT)), indent=2).encode() + b"\n"
    listed = json.dumps([json.loads(saved(FakeLlama.plain(tokens=16), Endpoint.COMPLETION))] * 3).encode() + b"\n"
    counted = audited(tmp_path, pretty + listed + pretty)
    assert (counted["answers"], counted["clean"], counted["fill_in_answers"], counted["not_answers"]) == (5, 3, 2, 0)
    assert [p["line"] for p in counted["problems"]] == [1, pretty.count(b"\n") + 2]


def test_a_document_that_never_closes_is_blamed_where_it_starts_and_the_rest_is_read(tmp_path: Path) -> None:
    plain = saved(FakeLlama.plain(tokens=16), Endpoint.CHAT)
    counted = audited(tmp_path, jsonl(plain) + plain[:500] + b"\n" + jsonl(plain))
    assert (counted["answers"], counted["clean"], counted["not_answers"]) == (2, 2, 1)
    assert counted["problems"][0]["line"] == 2 and "nor the start of a document that closes" in counted["problems"][0]["detail"]


def test_one_file_mixes_every_shape(tmp_path: Path) -> None:
    plain = FakeLlama.plain(tokens=16)
    content = b"".join(
        jsonl(saved(plain, e)) if not TABLE[e].streaming else saved(plain, e) for e in Endpoint
    ) + sdk_dump(plain, Endpoint.CHAT_STREAM) + sdk_dump(plain, Endpoint.V1_COMPLETION)
    counted = audited(tmp_path, content)
    assert (counted["answers"], counted["clean"], counted["exit_code"]) == (len(Endpoint) + 2, len(Endpoint) + 2, 0)


def test_problems_are_listed_up_to_a_bound_and_counted_past_it(tmp_path: Path) -> None:
    draft = saved(FakeLlama.draft(tokens=4), Endpoint.CHAT, 4)
    counted = audited(tmp_path, jsonl(*[draft] * 130))
    assert (len(counted["problems"]), counted["problems_left_off"], counted["fill_in_answers"]) == (100, 30, 130)
    result = audit(tmp_path, jsonl(*[draft] * 130))
    assert "  ... and 120 more (--json lists the first 100)" in result.stdout
    assert len([line for line in result.stdout.splitlines() if line.startswith("  line ")]) == 10


def test_json_keys_are_the_documented_ones(tmp_path: Path) -> None:
    result = audit(tmp_path, saved(FakeLlama.draft(tokens=16), Endpoint.CHAT), "--json")
    document = json.loads(result.stdout)
    section = markdown.section(markdown.DOCS / "gating.md", "`specwatch audit`: saved answers")
    assert set(document) == {"verdict", "exit_code", "summary", "files", "totals"}
    for key in [*document, *document["files"][0], *document["totals"], *document["files"][0]["problems"][0]]:
        assert f"`{key}`" in section, key


# The Python API.

def test_tally_takes_a_dict_a_list_of_events_and_sdk_objects() -> None:
    draft = FakeLlama.draft(tokens=16)
    counted = tally(json.loads(saved(draft, Endpoint.CHAT)))
    assert (counted.shape, counted.tokens, counted.judged_tokens, counted.fill_ins, counted.draft_n, counted.judged) == (
        "chat", 16, 15, 15, 16, True)
    assert counted.status is Status.FILL_INS
    streamed = tally(events(saved(draft, Endpoint.V1_COMPLETION_STREAM)))
    assert (streamed.shape, streamed.fill_ins) == ("v1_completion_stream", 15)
    (completion,) = sdk_objects(draft, Endpoint.V1_COMPLETION)
    assert tally(completion).fill_ins == 15
    chunks = sdk_objects(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM)
    assert (tally(chunks).status, tally([*chunks, "[DONE]"]).status) == (Status.CLEAN, Status.CLEAN)


def test_require_real_returns_the_counts_of_a_clean_answer() -> None:
    counted = require_real(json.loads(saved(FakeLlama.plain(tokens=16), Endpoint.COMPLETION)))
    assert (counted.status, counted.judged_tokens, counted.fill_ins) == (Status.CLEAN, 15, 0)
    assert require_real(sdk_objects(FakeLlama.future_fixed(tokens=16), Endpoint.CHAT_STREAM)).draft_n == 16


def test_require_real_raises_on_fill_ins_saying_how_many() -> None:
    with pytest.raises(FillInLogprobs) as caught:
        require_real(sdk_objects(FakeLlama.draft(tokens=16), Endpoint.CHAT)[0])
    assert isinstance(caught.value, ValueError) and caught.value.tally.fill_ins == 15
    assert str(caught.value).startswith("15 of 15 tokens after the first carry fill-in logprobs (chat answer, timings.draft_n 16)")


@pytest.mark.parametrize(("answer", "message"), [
    (json.loads(saved(FakeLlama.draft(tokens=16), Endpoint.CHAT, logprobs=None, top_logprobs=None)),
     "cannot judge this chat answer: drafted (timings.draft_n 16), cannot tell: no logprobs"),
    (json.loads(saved(FakeLlama.plain(tokens=16), Endpoint.COMPLETION, n_probs=None)), "cannot judge this completion answer: no logprobs"),
    (events(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM))[:5], "cannot judge this chat_stream answer: truncated"),
    (events(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT_STREAM))[3], "cannot judge this chat_stream answer: truncated"),
])
def test_require_real_raises_cannot_judge_saying_why(answer: Any, message: str) -> None:
    with pytest.raises(CannotJudge, match=re.escape(message)) as caught:
        require_real(answer)
    assert isinstance(caught.value, ValueError) and caught.value.tally is not None and not caught.value.tally.judged


@pytest.mark.parametrize(("answer", "message"), [
    ({"status": "ok"}, "not an answer of /completion"),
    ([], "an empty list"),
    ([json.loads(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT))] * 2, "2 answers, not one"),
    ("text", "a JSON str, not an object"),
    (iter([{"choices": []}]), "collect its events in a list (chunks = list(stream))"),
])
def test_what_is_not_an_answer_raises_not_an_answer(answer: Any, message: str) -> None:
    for gate in (tally, require_real):
        with pytest.raises(NotAnAnswer, match=re.escape(message)) as caught:
            gate(answer)
        assert isinstance(caught.value, CannotJudge | ValueError)


@pytest.mark.real
def test_the_api_reads_nothing_of_the_daemon() -> None:
    script = ("import sys, specwatch.gate.received\n"
              "print(sorted(m for m in sys.modules if m.startswith(('specwatch.daemon', 'prometheus_client', 'apscheduler', "
              "'httpx', 'specwatch.settings'))))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_api_counts_as_classify_does() -> None:
    body = json.loads(saved(FakeLlama(speculative=True, fill_ins={3, 4, 8}, drafts=5, tokens=12), Endpoint.V1_COMPLETION, 12))
    canary = classify(TABLE[Endpoint.V1_COMPLETION].read(body))
    counted = tally(body)
    assert (counted.tokens, counted.fill_ins, counted.draft_n) == (canary.tokens, canary.fill_ins, canary.draft_n) == (12, 3, 5)
    assert math.isclose(canary.fill_in_ratio, counted.fill_ins / counted.judged_tokens)


def test_run_audit_in_process(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(saved(FakeLlama.plain(tokens=16), Endpoint.CHAT))
    out = io.StringIO()
    assert run_audit([str(path), "-"], as_json=False, stdin=io.BytesIO(saved(FakeLlama.draft(tokens=16), Endpoint.COMPLETION)), out=out) == 1
    assert audit_file(str(path)).clean == 1
    assert "<stdin>: 1 answer: 0 clean, 1 with fill-ins" in out.getvalue()


@pytest.mark.real
@pytest.mark.slow
def test_memory_stays_flat_on_a_256_mib_jsonl(tmp_path: Path) -> None:
    """Every shape, streams and SDK dumps included, repeated to 256 MiB: the audit's peak RSS is what it is on 1 MiB."""
    # A reader that held the file would pass 100 MiB here; 1 GiB is bench.audit_throughput's (a quarter of the CPU).
    piece = unit("mix", 48)
    sizes = {}
    for name, size in (("small", 1 << 20), ("large", 1 << 28)):
        path = tmp_path / f"{name}.jsonl"
        times = write_repeated(path, piece, size)
        run = run_measured("specwatch", ["audit", str(path), "--json"], cwd=ROOT, timeout=900)
        path.unlink()
        totals = json.loads(run.stdout)["totals"]
        assert (run.returncode, totals["answers"], totals["fill_in_answers"], totals["not_answers"]) == (1, 8 * times, 4 * times, 0)
        sizes[name] = run.peak_rss
    assert sizes["large"] < 100 << 20, sizes
    assert sizes["large"] - sizes["small"] < 8 << 20, sizes


KEYS = ["choices", "object", "delta", "message", "text", "logprobs", "content", "top_logprobs", "logprob", "prob", "top_probs",
        "completion_probabilities", "stop", "tokens_predicted", "finish_reason", "id", "index", "timings", "draft_n", "role",
        "token_logprobs", "tokens", "error", "placeholder"]
SCALARS = (st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([10**400, 2.5, -0.3, 0.0, 1.0, -1e9])
           | st.sampled_from(["chat.completion", "chat.completion.chunk", "text_completion", "", "a", "[DONE]"]))
ANSWERISH = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=5),
                         max_leaves=30)


@settings(deadline=None, max_examples=400)
@given(st.lists(ANSWERISH, max_size=6))
def test_any_json_is_judged_or_not_an_answer_never_a_crash(records: list[Any]) -> None:
    content = b"".join((b"data: " if i % 2 else b"") + json.dumps(r).encode() + b"\n" for i, r in enumerate(records))
    outcomes = list(read_answers(io.BytesIO(content)))
    assert all(isinstance(o, AnswerTally | NotAnAnswer) for o in outcomes)
    assert all(o.status is not Status.CLEAN or (o.judged and o.reason is None) for o in outcomes if isinstance(o, AnswerTally))
    for value in (records, *records):
        try:
            tally(value)
        except NotAnAnswer:
            pass
