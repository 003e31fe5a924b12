"""Which endpoint's answer, or which stream's event, a saved JSON value is: by its content, whatever the file is called."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..endpoints import Endpoint
from ..probe.canary import CHUNKS, TABLE
from ..probe.readers import Chunk, Reading, StreamReading, completion_chunk, stream_reader


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
_POST_SAMPLING_CHUNK = completion_chunk(post_sampling=True)
SHAPES: Mapping[str, Shape] = MappingProxyType({
    **{e.value: Shape(e.value, spec.path, spec.read, CHUNKS.get(e)) for e, spec in TABLE.items()},
    COMPLETION_POST_SAMPLING_STREAM: Shape(COMPLETION_POST_SAMPLING_STREAM, "/completion", stream_reader(_POST_SAMPLING_CHUNK),
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
