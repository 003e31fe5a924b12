"""Every bad answer specwatch must survive, played by the loopback server on chosen paths; and the soak's chaotic fleet."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from tests.support.loopback import Exchange, FaultServer, head
from tests.support.wire import FakeLlama, Request, error

Seen = Request
"""A request as the fault server received it."""


@dataclass
class Status:
    """An HTTP error in llama-server's error shape (or any body)."""

    code: int
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)

    async def play(self, exchange: Exchange) -> bool:
        body = self.body if self.body is not None else error(self.code, HTTPStatus(self.code).phrase, "fault").body
        exchange.respond(self.code, body, headers=self.headers.items())
        return True


@dataclass
class Redirect:
    location: str
    code: int = 302

    async def play(self, exchange: Exchange) -> bool:
        exchange.respond(self.code, b"", "text/plain", [("Location", self.location)])
        return True


@dataclass
class Raw:
    """A 200 with any body, e.g. an HTML error page from a proxy."""

    body: bytes
    content_type: str = "text/html; charset=utf-8"
    status: int = 200

    async def play(self, exchange: Exchange) -> bool:
        exchange.respond(self.status, self.body, self.content_type)
        return True


@dataclass
class Respond:
    """Whatever `answer(request)` returns as (status, headers, body): for answers built from the request."""

    answer: Callable[[Seen], tuple[int, dict[str, str], bytes]]

    async def play(self, exchange: Exchange) -> bool:
        status, headers, body = self.answer(exchange.request)
        headers = dict(headers)
        content_type = headers.pop("Content-Type", "application/json")
        exchange.respond(status, body, content_type, headers.items())
        return True


@dataclass
class Reset:
    """Headers promising a body, part of it, then a TCP reset."""

    sent: int = 64

    async def play(self, exchange: Exchange) -> bool:
        exchange.write(head(200, [("Content-Type", "application/json"), ("Content-Length", "100000")]) + b"{" + b" " * self.sent)
        await exchange.drain()
        await asyncio.sleep(0.05)
        exchange.reset()
        return False


class CloseAtOnce:
    """Read the request, answer nothing, reset the connection."""

    async def play(self, exchange: Exchange) -> bool:
        exchange.reset()
        return False


@dataclass
class Hang:
    """Never send a status line (slow headers), for `seconds` or until the server stops."""

    seconds: float = 3600.0

    async def play(self, exchange: Exchange) -> bool:
        await asyncio.sleep(self.seconds)
        return False


@dataclass
class Late:
    """The healthy answer, `seconds` late: an endpoint slow to answer, as a large model's is."""

    seconds: float

    async def play(self, exchange: Exchange) -> bool:
        await asyncio.sleep(self.seconds)
        exchange.connection.send(exchange.healthy(), exchange.closing)
        return True


@dataclass
class Held:
    """The healthy answer once `release` is set: a probe in flight for as long as a test needs it to be."""

    release: threading.Event

    async def play(self, exchange: Exchange) -> bool:
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        exchange.connection.send(exchange.healthy(), exchange.closing)
        return True


@dataclass
class Trickle:
    """Prompt headers, then a body one byte at a time: every read is quick, the whole never arrives in time."""

    interval: float = 0.05

    async def play(self, exchange: Exchange) -> bool:
        exchange.write(head(200, [("Content-Type", "application/json"), ("Content-Length", "100000")]) + b"[")
        await exchange.drain()
        for _ in range(100000):
            await asyncio.sleep(self.interval)
            exchange.write(b" ")
            await exchange.drain()
        return False


class Truncated:
    """The healthy answer cut in half, with a Content-Length that matches the cut body."""

    async def play(self, exchange: Exchange) -> bool:
        answer = exchange.healthy()
        body = answer.body
        exchange.respond(answer.status, body[: max(1, len(body) // 2)], answer.content_type)
        return True


@dataclass
class Huge:
    """A JSON body of `size` bytes, declared up front or chunked with no length."""

    size: int = 64 * 1024 * 1024
    declared: bool = True

    async def play(self, exchange: Exchange) -> bool:
        length = ("Content-Length", str(self.size)) if self.declared else ("Transfer-Encoding", "chunked")
        exchange.write(head(200, [("Content-Type", "application/json"), length]))
        block = b"[" + b"0," * 32767 + b"0"
        sent = 0
        while sent < self.size:
            piece = block[: self.size - sent]
            exchange.write(piece if self.declared else f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sent += len(piece)
            await exchange.drain()
        if not self.declared:
            exchange.write(b"0\r\n\r\n")
            await exchange.drain()
        return False


@dataclass
class Mutate:
    """The healthy answer with its JSON (or each stream event) passed through `change`; NaN is written as NaN."""

    change: Callable[[Any], Any]

    async def play(self, exchange: Exchange) -> bool:
        answer = exchange.healthy()
        if answer.streaming:
            events = []
            for line in answer.body.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    events.append("data: " + json.dumps(self.change(json.loads(line[6:]))))
                elif line:
                    events.append(line)
            body = "".join(e + "\n\n" for e in events).encode()
        else:
            body = json.dumps(self.change(json.loads(answer.body))).encode()
        exchange.respond(answer.status, body, answer.content_type)
        return True


@dataclass
class Chaos:
    """A different bad answer at random on each request, healthy about half the time (for the soak)."""

    rng: random.Random
    hang_seconds: float = 2.0

    def _choices(self) -> list[Any]:
        return [
            None, None, None, None, None, None,
            Status(500), Status(503), Status(401), Status(404), Reset(), CloseAtOnce(),
            Raw(b"<html><body>502 Bad Gateway</body></html>"), Truncated(), Hang(self.hang_seconds),
            Mutate(lambda body: float("nan") if isinstance(body, dict) and "timings" not in body else body),
        ]

    async def play(self, exchange: Exchange) -> bool:
        fault = self.rng.choice(self._choices())
        if fault is None:
            answer = exchange.healthy()
            exchange.respond(answer.status, answer.body, answer.content_type)
            return True
        return await fault.play(exchange)


def soak(count: int, seed: int) -> None:
    """Serve `count` chaotic servers until stdin closes; print their ports as one JSON line."""
    rng = random.Random(seed)
    servers = [FaultServer(FakeLlama.draft(tokens=8) if i % 2 else FakeLlama.plain(tokens=8)) for i in range(count)]
    for server in servers:
        server.play(Chaos(random.Random(rng.random()))).start()
    print(json.dumps([s.port for s in servers]), flush=True)
    sys.stdin.read()
    for server in servers:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.support.faults",
                                     description="Run chaotic llama-server look-alikes on loopback (for the soak test).")
    parser.add_argument("--soak", type=int, required=True, help="number of servers")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    soak(options.soak, options.seed)
