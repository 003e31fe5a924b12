"""How far two answers to one question are apart, the noise that distance has between replicas of one model, and the
sequential test that turns a replica's differences, answer after answer, into evidence.

The difference of two answers is the mean absolute difference of the values they share: the logprob of each token
both generated alike, and, where their texts part, the change in log-odds between the two chosen tokens (each answer
gives the other's token its value among its alternatives). A near-tie that batching flipped moves that log-odds by
little; a replica that is sure of another token moves it by much. Nothing after the parting is compared: the
contexts differ from there.

The noise is measured on the group itself: a member asked one question several times at once (its slots then decode
in one batch) answers it as it does under load, and the spread of those answers is the batching noise of its model,
build and hardware. A member's score is its difference over the group's noise; the test is a CUSUM of scores: each
answer adds its score, capped so that one answer never decides, less an allowance, so that answers within the noise
wear the sum back down. It decides once the sum reaches the threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..probe.logprobs import Logprobs

ALLOWANCE = 2.0
"""What each answer takes off the sum: an answer must differ by more than twice the noise to add to it."""
CAP = 8.0
"""The most one answer adds (its score, capped): a gross difference decides in two answers, never in one."""
THRESHOLD = 12.0
"""The sum at which the test decides that a replica differs."""
MARGIN = 0.03
"""The least noise (in nats per value compared) a group is given, when its bursts measured less: a guard for a group
whose servers' slots were full at every burst, or that speculates (a drafting server verifies in batches) with one slot.
On Gemma 3 270M the batching noise measured 0.015 to 0.066; with a margin of half the largest, a pool whose bursts
caught nothing reported no healthy replica, and changes of 0.03 nats or more to an eval's number were still reported
as fast (bench/README.md, Replicas of a real model)."""


@dataclass(frozen=True, slots=True)
class Difference:
    """Two answers to one question compared."""

    mean: float
    """The mean absolute difference of the values compared, in nats."""
    values: int
    """How many values were compared: the shared tokens, and the parting's log-odds."""
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
    for index in range(min(len(a), len(b))):
        mine, theirs = a.texts[index], b.texts[index]
        if mine == theirs:
            if a.real(index) and b.real(index):
                moved = abs(a.values[index] - b.values[index])
            else:
                continue  # a fill-in's value is no measurement
        else:
            # Each side's log-odds of its own token over the other's: at temperature 0 both are >= 0, and what the
            # pair moved is their sum. A token an answer does not list is at most as likely as its lowest alternative.
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


def _odds(answer: Logprobs, index: int, chosen: str, other: str) -> float | None:
    if not answer.real(index):
        return None
    value = answer.values[index]
    given = answer.value_of(index, other)
    if given is None:
        given = answer.lowest(index)
    return None if given is None else value - given


def spread(answers: list[Logprobs]) -> float:
    """The largest difference between any two of one member's answers to one question: its batching noise there."""
    return max((difference(x, y).mean for i, x in enumerate(answers) for y in answers[i + 1:]), default=0.0)


def score(found: Difference, noise: float) -> float:
    """A difference in units of the group's noise on that question (never below the margin)."""
    return found.mean / max(noise, MARGIN)


@dataclass(frozen=True, slots=True)
class Evidence:
    """A member's evidence that it answers unlike its group: the CUSUM of its scores, answer after answer."""

    total: float = 0.0
    answers: int = 0
    """The answers counted since its process began."""
    last: float | None = None
    """The score of the last answer counted."""
    decided: bool = False
    """The replica differs: the sum reached the threshold, and has not worn down to nothing since (an answer or two
    within the noise do not undo a decision; THRESHOLD / ALLOWANCE of them in a row do)."""

    def after(self, answer_score: float) -> Evidence:
        """This evidence with one more answer's score counted (kept within 0 and the threshold)."""
        if math.isnan(answer_score):
            return self
        total = min(THRESHOLD, max(0.0, self.total + min(answer_score, CAP) - ALLOWANCE))
        decided = total >= THRESHOLD or (self.decided and total > 0.0)
        return Evidence(total, self.answers + 1, answer_score, decided)

    @property
    def share(self) -> float:
        """How far towards the threshold, from 0 to 1."""
        return self.total / THRESHOLD
