"""Stable hash-based assignment of servers to replicas, the same arithmetic as Prometheus' hashmod."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import TypeVar

from ..core.peers import OPT_OUT

T = TypeVar("T")


def hashmod(value: str, modulus: int) -> int:
    """What a Prometheus `action: hashmod` relabel rule yields for `value`: md5, low 8 bytes, big-endian."""
    digest = hashlib.md5(value.encode("utf-8"), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def phase(value: str, salt: str) -> float:
    """A stable fraction in [0, 1) that spreads per-server schedules across an interval."""
    digest = hashlib.md5(f"{salt}\0{value}".encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def select(items: Iterable[T], name_of: Callable[[T], str], index: int, count: int) -> list[T]:
    return [item for item in items if hashmod(name_of(item), count) == index]


def shard_key(name: str, peer_group: str | None) -> str:
    """What places a server in a shard: its configured peer group, so one shard watches and compares the whole group;
    else its name."""
    return peer_group if peer_group and peer_group != OPT_OUT else name
