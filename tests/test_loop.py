"""The event loop every command runs on, and the suite with it: uvloop's where it is installed, asyncio's otherwise."""

from __future__ import annotations

import asyncio
import sys

import pytest

from specwatch import loop


async def _kind() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_a_command_runs_on_uvloop() -> None:
    # uvloop is a dependency on this platform: a daemon on asyncio's loop would pay a third more CPU per server.
    assert loop.run(_kind()).startswith("uvloop")


def test_without_uvloop_a_command_runs_on_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what a platform without its wheels sees: ImportError
    assert loop.factory() is asyncio.new_event_loop
    with asyncio.Runner(loop_factory=loop.factory()) as runner:
        assert runner.run(_kind()).startswith("asyncio")


async def test_the_suite_runs_on_the_loop_a_command_does() -> None:
    made = loop.factory()()
    try:
        assert await _kind() == type(made).__module__
    finally:
        made.close()
