"""What a model answered to the peer probe in its current process: its latest rounds' answers, and its own noise."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..probe.logprobs import Logprobs
from ..reasons import Reason

_EMPTY: Mapping = MappingProxyType({})
KEEP = 4
"""Rounds whose answers a member keeps: its group counts a round once the next one is over, so two would do; the rest
are slack for a comparison that runs late."""
NOISE_SAMPLES = 16
"""The member's own noise is the mean of its last this many measurements: learnt continuously, under its real load (a
median would say none where copies mostly decode alike and part now and then, as on a server whose other slots are busy)."""


@dataclass(frozen=True)
class PeerAnswers:
    """A model's answers to the peer probe: cleared when its process changes, counters kept (they are Prometheus')."""

    answers: Mapping[int, Logprobs] = field(default_factory=lambda: _EMPTY)
    """Its answer to each of its last KEEP rounds, by round."""
    spreads: tuple[float, ...] = ()
    """How far the copies of one round's prompt asked at once parted, for its last NOISE_SAMPLES rounds that asked
    copies (none for a server of one slot, which never batches)."""
    asked_at: float | None = None
    """Unix time the last peer probe began."""
    asked_round: int | None = None
    """The round the last peer probe asked."""
    turn: int | None = None
    """The last round whose probe ended, answered or failed: its group need not wait for it there."""
    failure: str | None = None
    """Why the last peer probe failed, as "reason: detail"; None after a success."""
    outcomes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Peer probes that succeeded ("success") and failed ("failure"), each copy counted."""
    failures: Mapping[Reason, int] = field(default_factory=lambda: _EMPTY)

    @property
    def noise(self) -> float | None:
        """Its own noise: the mean spread of its recent copies; None until measured."""
        return statistics.fmean(self.spreads) if self.spreads else None

    def answered(self, question: int, answer: Logprobs, spread: float | None, *, copies: int = 1) -> PeerAnswers:
        """After an answer to round `question` (with `spread`, how far its copies parted)."""
        answers = {q: a for q, a in self.answers.items() if q != question}
        answers[question] = answer
        kept = dict(sorted(answers.items())[-KEEP:])
        spreads = self.spreads if spread is None else (*self.spreads, spread)[-NOISE_SAMPLES:]
        return replace(self, answers=MappingProxyType(kept), spreads=spreads, failure=None, turn=question,
                       outcomes=_bumped(self.outcomes, "success", copies))

    def failed(self, question: int, reason: Reason, detail: str) -> PeerAnswers:
        """After a probe of round `question` that failed."""
        return replace(self, failure=f"{reason}: {detail}", outcomes=_bumped(self.outcomes, "failure"),
                       failures=_bumped(self.failures, reason), turn=question)

    def anew(self) -> PeerAnswers:
        """For another process: its answers and noise are its own to give; the counters go on."""
        return PeerAnswers(outcomes=self.outcomes, failures=self.failures)


def _bumped(counts: Mapping, key: object, by: int = 1) -> Mapping:
    return MappingProxyType({**counts, key: counts.get(key, 0) + by})
