"""Waiting in tests for something to come true: one way, polled, failing with what was awaited and why it never came."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

T = TypeVar("T")


class Watched(Protocol):
    """A child process whose death ends the wait at once, with its log (tests.support.process.Process)."""

    name: str

    def exited(self) -> int | None: ...
    def log_tail(self, lines: int = ...) -> str: ...


def wait_until(what: str, check: Callable[[], T], *, timeout: float, interval: float = 0.05,
               processes: Sequence[Watched] = (), alive: subprocess.Popen | None = None) -> T:
    """The first truthy result of `check`, polled every `interval` until `timeout`.

    Fails early, with their logs, when one of `processes` (or the `alive` child) exits meanwhile.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        for process in processes:
            code = process.exited()
            if code is not None:
                raise AssertionError(f"{process.name} exited with {code} while waiting for {what}:\n{process.log_tail()}")
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"process exited with {alive.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            logs = "".join(f"\n--- {p.name}:\n{p.log_tail(15)}" for p in processes)
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}{logs}")
        time.sleep(interval)


async def wait_until_async(what: str, check: Callable[[], T], *, timeout: float, interval: float = 0.05) -> T:
    """wait_until for a test on an event loop: the loop goes on while it waits."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)
