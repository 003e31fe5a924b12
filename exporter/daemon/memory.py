"""Memory for a long-running daemon whose probes make many short-lived objects and few cycles, and big /metrics bodies."""

from __future__ import annotations

import ctypes
import gc

YOUNG_THRESHOLD = 20_000
"""Allocations between young-generation collections (Python's default is 700). A 48-token canary answer alone is
about 500 containers, so the default collected several times per canary, and every tenth collection of the older
generations walked the whole fleet's state: a quarter of a canary's CPU. Garbage is freed by reference counts; the
collector only finds cycles, which the daemon rarely makes."""


MMAP_THRESHOLD = 256 * 1024
"""Blocks this big or bigger get memory of their own from the kernel, given back when freed. glibc starts at 128 KiB,
but raises the threshold to the largest block freed (up to 32 MB): after the first /metrics body (8 MB at 1,000
servers) every body came from the heap, whose freed space glibc keeps. Fixed, the daemon's RSS at 1,000 simulated
servers scraped every 7.5 s stayed at 120-122 MB instead of 130-156 MB (bench/README.md, memory)."""
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def _fix_mmap_threshold() -> None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return  # no C library that has it (not glibc): its allocator keeps its own policy
    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def tune() -> None:
    """Once start-up is done: what it made (modules, settings) is set aside from collections, which run less often;
    big blocks are given back to the kernel when freed."""
    _fix_mmap_threshold()
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
