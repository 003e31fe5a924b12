"""What a model answered to the peer probe in its current process: the latest answer to each question, and the batching
noise measured on it per question."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ..probe.logprobs import Logprobs
from ..probe.peerprobe import QUESTIONS
from ..reasons import Reason

_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class PeerAnswers:
    """A model's answers to the peer probe: cleared when its process changes, counters kept (they are Prometheus')."""

    answers: Mapping[int, Logprobs] = field(default_factory=lambda: _EMPTY)
    """The latest answer to each question, by its index in peerprobe.QUESTIONS."""
    noise: Mapping[int, float] = field(default_factory=lambda: _EMPTY)
    """The spread of the answers it gave one question asked several times at once (0 with one slot), per question: the
    largest any burst of this process measured."""
    burst_at: Mapping[int, float] = field(default_factory=lambda: _EMPTY)
    """Unix time each question was last asked in a burst."""
    asked_at: float | None = None
    """Unix time the last peer probe began."""
    failure: str | None = None
    """Why the last peer probe failed, as "reason: detail"; None after a success."""
    outcomes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Peer probes that succeeded ("success") and failed ("failure"), each copy of a burst counted."""
    failures: Mapping[Reason, int] = field(default_factory=lambda: _EMPTY)

    def due(self) -> list[int]:
        """The questions not answered yet in this process, in order."""
        return [q for q in range(len(QUESTIONS)) if q not in self.answers or q not in self.noise]

    def next_question(self) -> int:
        """The first question not answered yet, else the one answered longest ago (the rotation's next)."""
        due = self.due()
        return due[0] if due else next(iter(self.answers))

    def burst_due(self, question: int, now: float, *, again_after: float) -> bool:
        """Whether `question` is to be asked in a burst: never measured in this process, or measured as no noise at all
        longer ago than `again_after` (a busy server's slots were full then; another time they may not be)."""
        if question not in self.noise:
            return True
        return self.noise[question] == 0.0 and now - self.burst_at.get(question, now) >= again_after

    def answered(self, question: int, answer: Logprobs, noise: float | None, *, copies: int = 1,
                 now: float = 0.0) -> PeerAnswers:
        """After an answer to `question` (and, with `noise`, the spread a burst of `copies` measured at `now`)."""
        answers = {q: a for q, a in self.answers.items() if q != question}
        answers[question] = answer  # last in the mapping: the rotation asks the others first
        noises, at = self.noise, self.burst_at
        if noise is not None:
            noises = MappingProxyType({**self.noise, question: max(noise, self.noise.get(question, 0.0))})
            at = MappingProxyType({**self.burst_at, question: now})
        return replace(self, answers=MappingProxyType(answers), noise=noises, burst_at=at, failure=None,
                       outcomes=_bumped(self.outcomes, "success", copies))

    def failed(self, reason: Reason, detail: str) -> PeerAnswers:
        return replace(self, failure=f"{reason}: {detail}", outcomes=_bumped(self.outcomes, "failure"),
                       failures=_bumped(self.failures, reason))

    def anew(self) -> PeerAnswers:
        """For another process: its answers and noise are its own to give; the counters go on."""
        return PeerAnswers(outcomes=self.outcomes, failures=self.failures)


def _bumped(counts: Mapping, key: object, by: int = 1) -> Mapping:
    return MappingProxyType({**counts, key: counts.get(key, 0) + by})
