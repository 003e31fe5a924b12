"""One process at a time: an exclusive flock on a file, which the kernel releases should its holder die."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: Path, timeout: float | None = None) -> Iterator[None]:
    """`path` locked against every other process (its directory made if need be); waits for it, or fails after
    `timeout` seconds naming the lock, so a stuck holder is an error that says where, never a hang."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    raise AssertionError(f"another test run held {path} for {timeout:g}s") from None
                time.sleep(1)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
