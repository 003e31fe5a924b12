"""One canary answer's logprobs, kept for comparing replicas: every token's text, the values of its real tokens only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class TokenLike(Protocol):
    """One answer token as the probe reads it (readers.Token)."""

    @property
    def logprob(self) -> float | None: ...
    @property
    def text(self) -> str | None: ...
    @property
    def top(self) -> tuple[Any, ...]: ...
    def fill_in(self, index: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class Logprobs:
    """What one canary answer brings to a comparison of replicas."""

    tokens: tuple[str | None, ...]
    values: tuple[float | None, ...]
    """Each token's logprob; None for a fill-in, whose value is no measurement."""
    alternatives: tuple[tuple[Any, ...], ...]
    """Each real token's alternatives, flat as (text, logprob, text, logprob, ...); () for a fill-in."""
    digest: int = field(default=0, compare=False)
    """The hash of its values and alternatives, taken once: a large group is sorted into alike answers by it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", hash((self.values, self.alternatives)))


def logprobs_of(tokens: Sequence[TokenLike]) -> Logprobs:
    """What an answer's tokens bring to a comparison: a fill-in (the classifier's rule) keeps its text, not its value."""
    real = [not t.fill_in(i) and t.logprob is not None for i, t in enumerate(tokens)]
    return Logprobs(
        tokens=tuple(t.text for t in tokens),
        values=tuple(t.logprob if r else None for t, r in zip(tokens, real, strict=True)),
        alternatives=tuple(t.top if r else () for t, r in zip(tokens, real, strict=True)),
    )
