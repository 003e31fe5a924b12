"""How far two answers to one question are apart, how far a member stands from its group on one question, and the
sequential test that turns a member's standing, answer after answer, into evidence.

The difference of two answers is the mean, over the tokens they share and the one where their texts part, of how far
each moved: the mean absolute difference of the logprobs of the alternatives both list there (the chosen token among
them: a changed model moves its runners-up too, where the chosen token's own logprob may sit near 0 in both). Where the
texts part the context is still the same, so that token counts alike, each side's chosen token counted as at most the
other's lowest alternative where the other does not list it; the two chosen tokens' log-odds count only where a side is
a fill-in or the two list nothing in common. A near-tie that batching flipped moves its two tokens by little; a replica
sure of another token moves them by much. Nothing after the parting is compared: the contexts differ from there.

A member's score on one question is its distance to the group over the noise that distance has there (core/peers.py
says how both are measured); the test is a CUSUM of scores: each answer adds its score, capped, less an allowance, so
that answers within the noise wear the sum back down. It decides once the sum reaches the threshold, or once GROSS_ROUNDS
of the last GROSS_WINDOW answers were gross: a member that differs much on some prompts and not on others is decided
too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..probe.logprobs import Logprobs

FLOOR = 0.10
"""The least noise (nats per token compared) a member's score is taken against, whatever its group measured: replicas
of one model that differ in how they were deployed (another build, a q8_0 KV cache, another thread count) answer a
little apart without batching at all. The smallest step of 0.01 at which the resampled null of a tuning recording
opened at most 0.1 false tickets a group a month, bounds included, in groups of 2, 4 and 16, at the shipped shape
below (0.09 opened up to 0.73; bench/README.md)."""
UNIFORM_FLOOR = 0.07
"""The floor of a group declared deployed alike (peer_uniform: one build, backend, KV cache type and set of numeric
flags; slots, threads and load may differ), while every member reports one build: batching is then the noise between
healthy replicas, and what FLOOR leaves room for (a q8_0 KV cache, another build) is itself a difference. The smallest
step of 0.01 at which the resampled null of such groups in the tuning recording opened at most 0.1 false tickets a
group a month, bounds included, in groups of 2, 4 and 16, at the shipped shape (0.06 opened more; bench/README.md)."""
ALLOWANCE = 1.15
"""What each answer takes off the sum: an answer must stand more than 1.15 times the noise off its group to add to it.
A q8_0 KV cache's answers stand about 0.9 times the floor off a plain replica's, a weight change worth 0.03 nats to an
eval's about 1.3 times (bench/README.md: the shape was chosen on the tuning recording)."""
CAP = 1.55
"""The most one answer adds (its score, capped): a fifth of the threshold over the allowance, so no fewer than five
answers decide by their sum, and a healthy member's rare far answer (a near-tie parted at the first token) adds
little more than a changed member's typical one."""
THRESHOLD = 2.0
"""The sum at which the test decides that a member differs."""
GROSS = 8.0
"""A score this large is gross: far beyond any noise its group showed on that question."""
GROSS_ROUNDS, GROSS_WINDOW = 3, 24
"""GROSS_ROUNDS gross answers among a member's last GROSS_WINDOW decide, whatever the answers between them added: a
gross difference decides in three answers."""
NOISY = 4.0
"""A member whose own noise stands this many times over its group's is reported as noisy, and is held to its group's
noise times this at most: a member noisy beyond that (a bad member among them) cannot raise the bar it is held to."""
MISSED = 3
"""Questions its group answered and a member did not, in a row, after which its standing is unknown, never "agrees"."""


@dataclass(frozen=True, slots=True)
class Difference:
    """Two answers to one question compared."""

    mean: float
    """The mean of how far each token compared moved, in nats."""
    values: int
    """How many tokens were compared: the shared ones, and the parting."""
    parted: int | None = None
    """The token where their texts part; None where they do not (over the shorter answer)."""
    largest: float = 0.0
    at: int = 0
    """The largest single difference, and its token."""

    @property
    def nothing(self) -> bool:
        """Nothing could be compared (no real value in common): the answers say nothing of each other."""
        return self.values == 0


def difference(a: Logprobs, b: Logprobs) -> Difference:
    """How far `a` and `b`, two answers to one question, are apart."""
    total, count, largest, at = 0.0, 0, 0.0, 0
    texts_a, texts_b, values_a, values_b = a.texts, b.texts, a.values, b.values
    for index in range(min(len(texts_a), len(texts_b))):
        mine, theirs = texts_a[index], texts_b[index]
        x, y = values_a[index], values_b[index]
        if mine == theirs:
            if x != x or y != y:
                continue  # a fill-in's value (NaN) is no measurement
            moved = _alternatives_moved(a, b, index, abs(x - y))
        else:
            # The context is still the same here: the two answers give one next token's distribution, compared as on
            # any token. Only where a side is a fill-in, or they list nothing in common, does the pair's log-odds
            # count: each side's of its own token over the other's (>= 0 at temperature 0), summed.
            moved = _parting_moved(a, b, index) if x == x and y == y else None
            if moved is None:
                sides = [_odds(a, index, mine, theirs), _odds(b, index, theirs, mine)]
                known = [side for side in sides if side is not None]
                if not known:
                    return Difference(total / count if count else 0.0, count, index, largest, at)
                moved = max(0.0, sum(known))
        total += moved
        count += 1
        if moved > largest:
            largest, at = moved, index
        if mine != theirs:
            return Difference(total / count, count, index, largest, at)
    return Difference(total / count if count else 0.0, count, None, largest, at)


def _alternatives_moved(a: Logprobs, b: Logprobs, index: int, chosen: float) -> float:
    """The mean absolute difference of the values both answers give the alternatives both list at `index` (the chosen
    token among them); `chosen`, the chosen token's own, where they list none in common."""
    start_a, end_a, start_b, end_b = a.starts[index], a.starts[index + 1], b.starts[index], b.starts[index + 1]
    if start_a == end_a or start_b == end_b:
        return chosen
    texts_a, texts_b = a.alternative_texts[start_a:end_a], b.alternative_texts[start_b:end_b]
    values_a, values_b = a.alternative_values[start_a:end_a], b.alternative_values[start_b:end_b]
    if texts_a == texts_b:  # the usual case, the same runners-up in the same order: no lookup
        if values_a == values_b:
            return 0.0
        return sum([abs(x - y) for x, y in zip(values_a, values_b, strict=True)]) / len(texts_a)
    total, count = _common_moved(a, b, index)
    return total / count if count else chosen


def _common_moved(a: Logprobs, b: Logprobs, index: int) -> tuple[float, int]:
    """The summed absolute difference of the values both answers give the alternatives both list at `index`, and how
    many those are."""
    total, count = 0.0, 0
    for at in range(a.starts[index], a.starts[index + 1]):
        other = b.value_of(index, a.alternative_texts[at])
        if other is not None:
            total += abs(a.alternative_values[at] - other)
            count += 1
    return total, count


def _parting_moved(a: Logprobs, b: Logprobs, index: int) -> float | None:
    """Where the texts part: the mean absolute difference of the values both give the alternatives both list, each
    side's chosen token counted too where the other does not list it (at most as likely as the other's lowest
    alternative: a lower bound of its move, so that two answers sure of different tokens stand far apart); None where
    they list nothing in common."""
    total, count = _common_moved(a, b, index)
    if not count:
        return None
    for side, other in ((a, b), (b, a)):
        if other.value_of(index, side.texts[index]) is None:
            lowest = other.lowest(index)
            if lowest is not None:
                total += max(0.0, side.values[index] - lowest)
                count += 1
    return total / count


def _odds(answer: Logprobs, index: int, chosen: str, other: str) -> float | None:
    if not answer.real(index):
        return None
    value = answer.values[index]
    given = answer.value_of(index, other)
    if given is None:
        given = answer.lowest(index)
    return None if given is None else value - given


def spread(answers: list[Logprobs]) -> float:
    """The largest difference between any two of one member's answers to one question: its noise there."""
    return max((difference(x, y).mean for i, x in enumerate(answers) for y in answers[i + 1:]), default=0.0)


@dataclass(frozen=True, slots=True)
class Shape:
    """The sequential test's constants: what each answer takes off the sum, the most it adds, and where it decides."""

    allowance: float = ALLOWANCE
    cap: float = CAP
    threshold: float = THRESHOLD


SHIPPED = Shape()
"""The shape every comparison uses (a bench tries others on a tuning recording)."""


@dataclass(frozen=True, slots=True)
class Cusum:
    """A member's evidence that it answers unlike its group: the CUSUM of its scores, answer after answer."""

    total: float = 0.0
    answers: int = 0
    """The answers counted since its process began."""
    last: float | None = None
    """The score of the last answer counted."""
    gross: tuple[bool, ...] = ()
    """Whether each of its last GROSS_WINDOW answers was gross, the latest last."""
    missed: int = 0
    """Questions in a row its group answered and it did not (or answered with nothing to compare)."""
    decided: bool = False
    """The member differs: the sum reached the threshold (or GROSS_ROUNDS of its last answers were gross), and has not
    worn down to nothing since (an answer or two within the noise do not undo a decision; threshold / allowance of them
    in a row do)."""
    shape: Shape = SHIPPED

    def after(self, score: float) -> Cusum:
        """This evidence with one more answer's score counted (kept within 0 and the threshold)."""
        if math.isnan(score):
            return self.missing()
        shape = self.shape
        total = min(shape.threshold, max(0.0, self.total + min(score, shape.cap) - shape.allowance))
        gross = (*self.gross, score >= GROSS)[-GROSS_WINDOW:]
        if score >= GROSS and sum(gross) >= GROSS_ROUNDS:
            total = shape.threshold  # then worn down as any decision is: a gross answer long ago does not hold it
        decided = total >= shape.threshold or (self.decided and total > 0.0)
        return Cusum(total, self.answers + 1, score, gross, 0, decided, shape)

    def missing(self) -> Cusum:
        """This evidence after a question its group answered and it did not."""
        return Cusum(self.total, self.answers, self.last, self.gross, self.missed + 1, self.decided, self.shape)

    @property
    def lapsed(self) -> bool:
        """It stopped answering: MISSED questions in a row went without it."""
        return self.missed >= MISSED

    @property
    def share(self) -> float:
        """How far towards the threshold, from 0 to 1."""
        return self.total / self.shape.threshold
