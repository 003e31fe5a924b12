"""Garbage collection for a long-running daemon whose probes make many short-lived objects and few cycles."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Allocations between young-generation collections (Python's default is 700). A 48-token canary answer alone is
about 500 containers, so the default collected several times per canary, and every tenth collection of the older
generations walked the whole fleet's state: a quarter of a canary's CPU. Garbage is freed by reference counts; the
collector only finds cycles, which the daemon rarely makes."""


def tune() -> None:
    """Once start-up is done: what it made (modules, settings) is set aside from collections, which run less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
