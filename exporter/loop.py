"""The event loop every command runs on: uvloop's where it is installed, asyncio's own otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop. uvloop runs connections, timers and callbacks in C: at 1,000 servers, where each poll opens
    a connection (llama-server drops idle ones after 5 s), the loop's own work was a third of the daemon's CPU."""
    try:
        import uvloop
    except ImportError:  # a platform without its wheels (Windows): the same code on asyncio's loop
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run `coroutine` to its end on a new loop, as asyncio.run does."""
    with asyncio.Runner(loop_factory=factory()) as runner:
        return runner.run(coroutine)
