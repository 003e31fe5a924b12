"""A llama-server's bytes decoded one way, live and saved alike: strict JSON, and server-sent events framed from lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from ...reasons import ProbeFailure, Reason

FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":", b"error:")
"""How a line of a server-sent event starts: the spec's fields, a comment, or the `error:` line llama-server once sent."""
DONE = b"[DONE]"


class NotJSON(ProbeFailure):
    """Bytes strict JSON refuses: INVALID_JSON to a probe; `why` is the parser's own words, for a saved file's line."""

    def __init__(self, body: bytes, err: Exception) -> None:
        snippet = body[:60].decode("utf-8", "replace")
        super().__init__(Reason.INVALID_JSON, f"not JSON ({err.__class__.__name__}): {snippet!r}")
        self.why = str(err)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(body: bytes) -> Any:
    """Strict JSON: NaN and Infinity, which Python would accept, are refused (NotJSON)."""
    # orjson reads a 48-token canary answer three to five times faster than the json module. It refuses some things
    # json reads (lone surrogates, UTF-16): those go to the json module, so what is accepted is the same. An integer
    # beyond 64 bits comes back as a float, which every reader of an integer field refuses as it would the int.
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise NotJSON(body, err) from None


@dataclass(slots=True)  # not frozen: one is made per event of every canary, and frozen ones take 3x as long
class Event:
    """One event's data: its `data:` lines joined with line feeds; `line` is the number of the first, `lines` how many."""

    data: bytes
    line: int = 0
    lines: int = 1

    @property
    def done(self) -> bool:
        """Whether this is the `[DONE]` that ends an OpenAI-style stream."""
        return self.data.strip() == DONE


@dataclass(frozen=True, slots=True)
class StreamError:
    """An `error:` line: a failure mid-stream, as llama-server reported one before it sent `data: {"error": ...}`."""

    text: str
    line: int = 0


@dataclass(frozen=True, slots=True)
class TooLarge:
    """An event whose data passed the decoder's cap: its lines were counted, never held."""

    cap: int
    line: int = 0


Item = Event | StreamError | TooLarge


class Decoder:
    """Server-sent events from a stream's lines, framed as the spec says, with the data of one event capped."""

    # An event's `data:` lines are joined with line feeds, and it ends at a blank line, or where the stream ends (a saved
    # transcript may end without one); `event:`, `id:`, `retry:`, comments and unknown fields are read past. A line is
    # read without surrounding whitespace, so CRLF line ends and an indented transcript read the same.
    __slots__ = ("_data", "_line", "_over", "_size", "max_bytes")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._data: list[bytes] = []
        self._size = 0
        self._line = 0
        self._over = False

    def feed(self, line: bytes, number: int = 0) -> tuple[Item, ...]:
        """What line `number` completes: mostly nothing; at a blank line, its event; at an `error:` line, that error."""
        if not line.startswith(b"data:"):  # most lines are: they take the short way
            line = line.strip()
            if not line:
                return self._dispatch()
            if line.startswith(b"error:"):
                # An error line ends the event it cuts short: that event comes first, so what a stream held keeps its order.
                return (*self._dispatch(), StreamError(line[6:].strip().decode("utf-8", "replace"), number))
            if not line.startswith(b"data:"):
                return ()
        value = (line[6:] if line.startswith(b"data: ") else line[5:]).rstrip()
        data = self._data
        if not data and not self._over:
            self._line = number
        self._size += len(value) + 1
        if self._size > self.max_bytes:
            data.clear()
            self._over = True
        elif not self._over:
            data.append(value)
        return ()

    def end(self) -> tuple[Item, ...]:
        """The event the stream ended inside (a saved transcript's last without its blank line, or one cut short)."""
        return self._dispatch()

    def _dispatch(self) -> tuple[Item, ...]:
        parts = self._data
        if self._over:
            item: Item = TooLarge(self.max_bytes, self._line)
            self._over = False
        elif not parts:
            return ()
        else:
            item = Event(parts[0] if len(parts) == 1 else b"\n".join(parts), self._line, len(parts))
            parts.clear()
        self._size = 0
        return (item,)
