"""One answer's logprobs kept for comparing replicas, compactly: each token's text, its value, its alternatives."""

from __future__ import annotations

import math
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

NO_VALUE = math.nan
"""The value of a fill-in: no measurement."""


class TokenLike(Protocol):
    """One answer token as the probe reads it (readers.Token)."""

    @property
    def logprob(self) -> float | None: ...
    @property
    def text(self) -> str | None: ...
    @property
    def top(self) -> tuple[Any, ...]: ...
    def fill_in(self, index: int) -> bool: ...


@dataclass(frozen=True, slots=True, eq=False)
class Logprobs:
    """What an answer brings to a comparison of replicas, in flat arrays: a thousand replicas keep one each per question."""

    texts: tuple[str, ...]
    """Each token's text (interned: replicas share them); "" where the answer does not spell it."""
    values: array[float]
    """Each token's logprob; NaN for a fill-in, whose value is no measurement."""
    starts: array[int]
    """Where each token's alternatives begin in `alternative_texts`; one more entry marks the end of the last."""
    alternative_texts: tuple[str, ...]
    alternative_values: array[float]

    def __len__(self) -> int:
        return len(self.texts)

    def real(self, index: int) -> bool:
        return not math.isnan(self.values[index])

    def value_of(self, index: int, text: str) -> float | None:
        """The logprob the answer gives `text` at `index` among its alternatives; None when it does not list it."""
        for at in range(self.starts[index], self.starts[index + 1]):
            if self.alternative_texts[at] == text:
                return self.alternative_values[at]
        return None

    def lowest(self, index: int) -> float | None:
        """The lowest alternative listed at `index`: a token left out is at most this likely."""
        listed = self.alternative_values[self.starts[index]:self.starts[index + 1]]
        return min(listed) if listed else None

    def same(self, other: Logprobs) -> bool:
        """Whether two answers are alike in every token, value and alternative."""
        return (self.texts == other.texts and self.values.tobytes() == other.values.tobytes()
                and self.alternative_texts == other.alternative_texts
                and self.alternative_values.tobytes() == other.alternative_values.tobytes())


def logprobs_of(tokens: Sequence[TokenLike]) -> Logprobs:
    """An answer's tokens as a comparison reads them: a fill-in (the classifier's rule) keeps its text, not its value."""
    texts: list[str] = []
    values = array("d")
    starts = array("I", [0])
    alternative_texts: list[str] = []
    alternative_values = array("d")
    for index, token in enumerate(tokens):
        real = not token.fill_in(index) and token.logprob is not None
        texts.append(sys.intern(token.text or ""))
        values.append(token.logprob if real and token.logprob is not None else NO_VALUE)
        if real:
            top = token.top
            for at in range(0, len(top), 2):
                alternative_texts.append(sys.intern(top[at]))
                alternative_values.append(top[at + 1])
        starts.append(len(alternative_texts))
    return Logprobs(tuple(texts), values, starts, tuple(alternative_texts), alternative_values)
