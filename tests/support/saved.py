"""Answers as an eval saves them: the wire model's bodies and transcripts, and the OpenAI SDK's dumps of them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE
from tests.support.wire import FakeLlama, Request


def body_for(endpoint: Endpoint, tokens: int, **changes: Any) -> dict[str, Any]:
    """The canary's request for `endpoint`, with `changes` (a None value drops the key)."""
    body = {**TABLE[endpoint].body(tokens), **changes}
    return {key: value for key, value in body.items() if value is not None}


def saved(fake: FakeLlama, endpoint: Endpoint, tokens: int = 16, **changes: Any) -> bytes:
    """What the server sent: the JSON body, or the whole transcript (`data:` lines, blank lines, `[DONE]`)."""
    spec = TABLE[endpoint]
    body = body_for(endpoint, tokens, **changes)
    return fake.answer(Request("POST", spec.path, body=json.dumps(body).encode())).body


def events(transcript: bytes) -> list[dict[str, Any]]:
    """A transcript's events, `[DONE]` left out."""
    return [json.loads(line[5:]) for line in transcript.splitlines() if line.startswith(b"data:") and b"[DONE]" not in line]


def sdk_objects(fake: FakeLlama, endpoint: Endpoint, tokens: int = 16, **changes: Any) -> list[Any]:
    """The OpenAI SDK's objects for the answer: one ChatCompletion or Completion, or each chunk of the stream."""
    # The SDK builds its objects with construct_type, unvalidated (a Completion chunk's finish_reason of null would fail
    # validation): the same here, so the dumps are the ones a harness gets.
    from openai._models import construct_type
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    spec = TABLE[endpoint]
    kind = {"/v1/chat/completions": ChatCompletionChunk if spec.streaming else ChatCompletion,
            "/v1/completions": Completion}[spec.path]
    answer = saved(fake, endpoint, tokens, **changes)
    parsed = events(answer) if spec.streaming else [json.loads(answer)]
    return [construct_type(type_=kind, value=value) for value in parsed]


def sdk_dump(fake: FakeLlama, endpoint: Endpoint, tokens: int = 16, **changes: Any) -> bytes:
    """`model_dump_json()` of each SDK object, one per line, as a harness logging its answers writes them."""
    return b"".join(obj.model_dump_json().encode() + b"\n" for obj in sdk_objects(fake, endpoint, tokens, **changes))


def unit(mix: str, tokens: int) -> bytes:
    """Lines to repeat into a large file: one whole chat answer (`chat`), or one of each shape a harness saves (`mix`:
    four whole answers, three transcripts, one stream's SDK dumps; half of them from a draft server)."""
    plain, draft = FakeLlama.plain(tokens=tokens), FakeLlama.draft(tokens=tokens)

    def line(answer: bytes) -> bytes:
        return answer.replace(b"\n", b"") + b"\n"

    if mix == "chat":
        return line(saved(plain, Endpoint.CHAT, tokens))
    return b"".join([
        line(saved(plain, Endpoint.CHAT, tokens)), line(saved(draft, Endpoint.COMPLETION, tokens)),
        line(saved(plain, Endpoint.COMPLETION_POST_SAMPLING, tokens)), line(saved(draft, Endpoint.V1_COMPLETION, tokens)),
        saved(plain, Endpoint.CHAT_STREAM, tokens), saved(draft, Endpoint.V1_COMPLETION_STREAM, tokens),
        saved(plain, Endpoint.COMPLETION_STREAM, tokens), sdk_dump(draft, Endpoint.CHAT_STREAM, tokens),
    ])


def write_repeated(path: Path, piece: bytes, size: int) -> int:
    """`piece` over and over until the file holds at least `size` bytes; returns how many times."""
    times = -(-size // len(piece))
    block = piece * max(1, (8 << 20) // len(piece))
    per_block = len(block) // len(piece)
    with path.open("wb") as out:
        written = 0
        while written + per_block <= times:
            out.write(block)
            written += per_block
        out.write(piece * (times - written))
    return times
