"""Replicas compared: who is whose peer, what their model files say, and how their answers stand against the group's.

A model file's content (quantization, size, shape) counts at once: another file is another model. How it was deployed
(the llama.cpp build, the file's name) is shown and never counts: a rolling upgrade or a renamed file changes no answer.

Answers count round by round, every member having been asked one prompt. A member's distance to its group on a round is
the lower median of its differences to up to SAMPLE other members (a member of a majority is near half of them at
least, one off it is not). Its noise there is the larger of the distance its other members typically stand at on that
round (their lower median, never its own) and its own noise (how far copies of one prompt asked at once parted, under
its load), either at most NOISY times its group's noise (the other members' own, at least FLOOR). The score, distance
over noise, counts through the sequential test of core/evidence.py. A group with a reference file is held to it
instead: each member's difference to the reference's answer, which names the odd member of a pair and catches a group
that is all wrong alike. Any group size costs each member SAMPLE differences a round.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import PurePath
from typing import Generic, TypeVar

from ..probe.llama import META_FIELDS
from ..probe.logprobs import Logprobs
from ..probe.peerprobe import prompt
from .evidence import FLOOR, NOISY, SHIPPED, UNIFORM_FLOOR, Cusum, Difference, Shape, difference

OPT_OUT = "none"
"""The `peer_group` that takes a server out of every comparison."""
FINGERPRINT, ANSWERS = "fingerprint", "answers"
"""What a disagreement rests on: the model file's content, at once; or the answers, once the test decides."""
SAMPLE = 16
"""The other members each member is held against on one round, drawn anew each round: a group of 1,000 costs 16,000
differences a round, not a million."""

K = TypeVar("K", bound=Hashable)


def group_of(configured: str | None, reported: str, *, whole_server: bool = True) -> str | None:
    """The peer group of one watched model, None for none: the configured one (a router's models each get their own
    within it), else the model name the server reports; a model file's path (a server started without an alias
    reports it) counts by its file name without .gguf, so servers of one file meet wherever it lies."""
    if configured == OPT_OUT:
        return None
    if configured:
        return configured if whole_server or not reported else f"{configured}/{reported}"
    if reported.endswith(".gguf"):
        reported = PurePath(reported).name.removesuffix(".gguf")
    return reported or None


def member_name(server: str, model: str) -> str:
    """How a comparison names a watched model: its server, and a router's model id after a slash."""
    return f"{server}/{model}" if model else server


@dataclass(frozen=True)
class Fingerprint:
    """What a server says of its model file without generating a token: "" where it does not say."""

    build: str = ""
    file: str = ""
    """The base name of /props' model_path."""
    ftype: str = ""
    size: str = ""
    n_params: str = ""
    n_vocab: str = ""
    n_ctx_train: str = ""
    n_embd: str = ""


FINGERPRINT_FIELDS = tuple(f.name for f in fields(Fingerprint))
DEPLOYMENT_FIELDS = ("build", "file")
"""How a file was deployed: shown, never a disagreement."""
CONTENT_FIELDS = FINGERPRINT_FIELDS[2:]
"""What the file holds (what /v1/models' meta gives): another value is another model, at once."""
assert CONTENT_FIELDS == META_FIELDS, "the fingerprint's content is what /v1/models' meta gives"


@dataclass(frozen=True)
class Peer:
    """One member of a group as a comparison sees it: its fingerprint, its answers by round, and its own noise."""

    fingerprint: Fingerprint | None = None
    answers: Mapping[int, Logprobs] = field(default_factory=dict)
    noise: float | None = None
    """How far copies of one prompt asked at once part on it, typically (PeerAnswers.noise); None until measured."""
    turn: int | None = None
    """The last round whose probe ended on it, answered or failed (PeerAnswers.turn)."""


@dataclass(frozen=True)
class Comparison(Generic[K]):
    """One member's standing in its group after a comparison."""

    agreement: bool | None
    """False once it differs (its file's content at once, its answers once the test decides); None with nothing to
    compare it with."""
    kind: str | None = None
    """FINGERPRINT or ANSWERS when it disagrees."""
    held_against: tuple[K, ...] = ()
    """The members it is held against: those nearest it, or every other one in a group without a majority."""
    evidence: Cusum = field(default_factory=Cusum)
    detail: str = ""
    """What the last comparison found: the disagreement, the evidence so far, or why it stands unknown."""
    deployment: str = ""
    """How its deployment differs from the group's (build, file name): shown, never counted."""
    noisy: bool = False
    """Its own noise stands NOISY times or more over its group's: reported, and never raising the bar it is held to."""
    floor: float | None = None
    """The least noise its last counted round was scored at: FLOOR, or a group's uniform floor while one build
    answered; None before a round of its was counted."""


@dataclass(frozen=True)
class Judgement(Generic[K]):
    """A group compared: each member's standing, and the group's."""

    members: dict[K, Comparison[K]]

    @property
    def agreement(self) -> bool | None:
        """False when any member differs: the group serves more than one model; None with nothing compared."""
        said = [c.agreement for c in self.members.values() if c.agreement is not None]
        return None if not said else all(said)

    @property
    def split(self) -> bool:
        """Every member compared differs: no majority to hold them against (a pair that differs, a split group)."""
        said = [c.agreement for c in self.members.values() if c.agreement is not None]
        return len(said) >= 2 and not any(said)


@dataclass(frozen=True)
class Standing:
    """A watched model's place in its group after the last comparison: its own standing, and the group's."""

    group: str
    comparison: Comparison[str]
    group_agreement: bool | None = None
    """The group's judgement (Judgement.agreement): said once for the whole group, however many members differ."""
    split: bool = False
    """No majority: every member compared differs (Judgement.split)."""


@dataclass(frozen=True)
class Scored:
    """One member's answer to one round against its group's."""

    score: float
    """Its distance over its noise."""
    distance: float
    noise: float
    parted: int | None = None
    """Where its text parts from the answer it was nearest, if it does."""
    noisy: bool = False


@dataclass(frozen=True)
class _Found(Generic[K]):
    against: set[K]
    detail: str


def _majority(values: Mapping[K, str]) -> str | None:
    value, count = Counter(values.values()).most_common(1)[0]
    return value if count * 2 > len(values) else None


def _fields(peers: Mapping[K, Peer], names: tuple[str, ...]) -> tuple[dict[K, _Found[K]], set[K]]:
    """The members whose value of any of `names` is off the group's strict majority (every side without one)."""
    found: dict[K, _Found[K]] = {}
    compared: set[K] = set()
    for name in names:
        values = {k: getattr(p.fingerprint, name) for k, p in peers.items()
                  if p.fingerprint is not None and getattr(p.fingerprint, name) != ""}
        if len(values) < 2:
            continue
        compared.update(values)
        if len(set(values.values())) < 2:
            continue
        reference = _majority(values)
        others = "the group's " + (repr(reference) if reference is not None else "others")
        for k, value in values.items():
            if value != reference and k not in found:
                against = {o for o, v in values.items() if (v == reference if reference is not None else v != value)}
                found[k] = _Found(against, f"{name} {value!r}, {others}")
    return found, compared


def _lower_median(values: list[float]) -> float:
    """The middle value, the lower of the two middle ones for an even count: a minority above it cannot move it."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


class _LeaveOneOut(Generic[K]):
    """The lower median of a value over the members, each member's own left out."""

    def __init__(self, values: Mapping[K, float]) -> None:
        self._sorted = sorted(values.values())
        self._values = values

    def without(self, k: K) -> float | None:
        count = len(self._sorted) - (k in self._values)
        if count <= 0:
            return None
        index = (count - 1) // 2
        if k not in self._values:
            return self._sorted[index]
        at = bisect.bisect_left(self._sorted, self._values[k])
        return self._sorted[index] if index < at else self._sorted[index + 1]


def score_round(answers: Mapping[K, Logprobs], noise: Mapping[K, float | None], *, seed: int,
                reference: Logprobs | None = None, floor: float = FLOOR) -> dict[K, Scored]:
    """Each member's score on one round (see the module's docstring); a member with nothing to compare is left out."""
    keys = sorted(answers, key=str)
    if len(keys) < 2 and reference is None:
        return {}
    distinct: dict[tuple[object, ...], int] = {}
    shapes: list[Logprobs] = []
    index_of: dict[K, int] = {}
    for k in keys:
        answer = answers[k]
        shape = (answer.texts, answer.values.tobytes(), answer.alternative_values.tobytes())
        if shape not in distinct:
            distinct[shape] = len(shapes)
            shapes.append(answer)
        index_of[k] = distinct[shape]
    cache: dict[tuple[int, int], Difference] = {}

    def apart(a: int, b: int) -> Difference:
        pair = (a, b) if a <= b else (b, a)
        found = cache.get(pair)
        if found is None:
            found = Difference(0.0, len(shapes[a])) if a == b else difference(shapes[pair[0]], shapes[pair[1]])
            cache[pair] = found
        return found

    distance: dict[K, float] = {}
    parted: dict[K, int | None] = {}
    if reference is not None:
        for k in keys:
            found = difference(answers[k], reference)
            if not found.nothing:
                distance[k], parted[k] = found.mean, found.parted
    else:
        draw = random.Random(seed)
        for i, k in enumerate(keys):
            others = len(keys) - 1
            picks = range(others) if others <= SAMPLE else draw.sample(range(others), SAMPLE)
            found_near = [apart(index_of[k], index_of[keys[j + (j >= i)]]) for j in picks]
            known = sorted((d for d in found_near if not d.nothing), key=lambda d: d.mean)
            if known:
                middle = known[(len(known) - 1) // 2]
                distance[k], parted[k] = middle.mean, middle.parted
    typical = _LeaveOneOut({k: d for k, d in distance.items()}) if reference is None and len(distance) >= 3 else None
    own = {k: n for k, n in noise.items() if n is not None and k in answers}
    theirs = _LeaveOneOut(own)
    scored: dict[K, Scored] = {}
    for k, d in distance.items():
        group = max(floor, theirs.without(k) or 0.0)
        mine = own.get(k, 0.0)
        within = (typical.without(k) if typical is not None else None) or 0.0
        # Neither what a round's members typically stand apart nor a member's own noise counts beyond NOISY times the
        # group's batching noise: a group split in halves, or a noisy bad member, must not lift the bar out of reach.
        scale = max(group, min(max(within, mine), NOISY * group))
        scored[k] = Scored(d / scale, d, scale, parted.get(k), mine >= NOISY * group)
    return scored


class Comparing(Generic[K]):
    """One group's test across rounds, the daemon's and check's alike: each round counted once, each member's evidence."""

    def __init__(self, reference: Reference | None = None, *, salt: int | None = None, floor: float = FLOOR,
                 uniform: bool = False, uniform_floor: float = UNIFORM_FLOOR, shape: Shape = SHIPPED) -> None:
        self.reference = reference
        self.floor = floor
        """The least noise a member is scored against (core.evidence.FLOOR unless a bench tries another)."""
        self.uniform = uniform
        """The group is declared deployed alike (peer_uniform, check --uniform)."""
        self.uniform_floor = uniform_floor
        """Its floor then, while every member answering reports one build (core.evidence.UNIFORM_FLOOR unless a bench
        tries another)."""
        self.shape = shape
        """The sequential test's constants (core.evidence.SHIPPED unless a bench tries another)."""
        self.salt = salt
        """The draw of prompts its rounds asked (peerprobe.prompt): this process's unless told."""
        self.evidence: dict[K, Cusum] = {}
        self.through: int | None = None
        """The last round counted."""
        self._fresh = Cusum(shape=shape)
        self._said: dict[K, str] = {}
        self._noisy: dict[K, bool] = {}
        self._floors: dict[K, float] = {}

    def forget(self, member: K) -> None:
        """A member left, or its process changed: its evidence is its old process's."""
        self.evidence.pop(member, None)
        self._said.pop(member, None)
        self._noisy.pop(member, None)
        self._floors.pop(member, None)

    def count(self, peers: Mapping[K, Peer], before: int) -> int:
        """Count, in order, every round some member answered and none counted yet that is over: every member answering
        has had its turn at it, or it is before `before` (the late ones missed it); how many."""
        rounds = sorted({q for p in peers.values() for q in p.answers if self.through is None or q > self.through})
        answering = [p for p in peers.values() if p.fingerprint is not None]
        counted = 0
        for question in rounds:
            if question >= before and not all(p.turn is not None and p.turn >= question for p in answering):
                break  # a member has yet to have its turn: the rounds after it wait too
            self._count(peers, question)
            self.through = question
            counted += 1
        return counted

    def _count(self, peers: Mapping[K, Peer], question: int) -> None:
        answering = {k: p for k, p in peers.items() if p.fingerprint is not None}
        answers = {k: p.answers[question] for k, p in answering.items() if question in p.answers}
        reference = None
        if self.reference is not None:
            reference = self.reference.answers.get(asked(question, self.reference, salt=self.salt))
        if self.reference is not None and reference is None:
            return  # a round the reference did not record says nothing against it
        if not answers:
            return
        floor = self.floor_among(answering.values())
        scored = score_round(answers, {k: p.noise for k, p in answering.items()}, seed=question, reference=reference,
                             floor=floor)
        against = "the reference" if reference is not None else "its group"
        for k in answering:
            before = self.evidence.get(k, self._fresh)
            found = scored.get(k)
            if found is None:
                # Another answered and it did not, or its answer had nothing to compare (all fill-ins, no tokens):
                # missed. One that answered alone, with no peer to be held to, is merely not scored.
                if k not in answers or scored:
                    self.evidence[k] = before.missing()
                continue
            self.evidence[k] = before.after(found.score)
            self._noisy[k] = found.noisy
            self._floors[k] = floor
            parting = f", parting at token {found.parted}" if found.parted is not None else ""
            self._said[k] = (f"round {question}: {found.distance:.3f} nats from {against}{parting}, "
                             f"{found.score:.1f} times the noise ({found.noise:.3f})")

    def floor_among(self, answering: Collection[Peer]) -> float:
        """The floor a round is scored at: the uniform one where the group is declared deployed alike, is held to no
        reference file (whose deployment nobody declared) and every member reports one build; FLOOR's otherwise, a
        rolling upgrade's builds answering as far apart as any deployments do."""
        if not self.uniform or self.reference is not None:
            return self.floor
        builds = {p.fingerprint.build for p in answering if p.fingerprint is not None}
        return self.uniform_floor if len(builds) == 1 and "" not in builds else self.floor

    def judge(self, peers: Mapping[K, Peer]) -> Judgement[K]:
        """Each member's standing now: the file's content first, then the evidence its answers gave."""
        found, compared = _fields(peers, CONTENT_FIELDS)
        shown, _ = _fields(peers, DEPLOYMENT_FIELDS)
        answering = {k for k, p in peers.items() if p.fingerprint is not None}
        if len(answering) >= 2 or (answering and self.reference is not None):
            compared |= answering
        differ = {k for k in compared if k in found or self.evidence.get(k, self._fresh).decided}
        agree = compared - differ
        results: dict[K, Comparison[K]] = {}
        for k in peers:
            deployment = shown[k].detail if k in shown else ""
            evidence = self.evidence.get(k, self._fresh)
            noisy = self._noisy.get(k, False)
            floor = self._floors.get(k)
            said = self._said.get(k, "")
            if k in found:
                results[k] = Comparison(False, FINGERPRINT, _sorted(found[k].against), evidence, found[k].detail,
                                        deployment, noisy)
            elif k not in compared:
                results[k] = Comparison(None, deployment=deployment)
            elif k in differ:
                # Held against the members that agree; in a group without a majority, against every other one.
                against = agree or (compared - {k})
                results[k] = Comparison(False, ANSWERS, _sorted(against), evidence, said, deployment, noisy, floor)
            elif evidence.answers == 0:
                results[k] = Comparison(None, evidence=evidence, detail="no answer counted yet", deployment=deployment)
            elif evidence.lapsed:
                results[k] = Comparison(None, evidence=evidence, deployment=deployment, noisy=noisy, floor=floor,
                                        detail=f"unknown: it did not answer the last {evidence.missed} rounds its "
                                               f"group answered")
            else:
                results[k] = Comparison(True, evidence=evidence, detail=said, deployment=deployment, noisy=noisy,
                                        floor=floor)
        return Judgement(results)


@dataclass(frozen=True)
class Reference:
    """A trusted server's answers to the peer probe's pool prompts (a reference file read): a group is held to them."""

    answers: Mapping[int, Logprobs]
    """Its answer to each pool prompt it recorded, by the prompt's index."""

    @cached_property
    def prompts(self) -> tuple[int, ...]:
        """The pool prompts it recorded: a group held to it is asked only those."""
        return tuple(sorted(self.answers))


def asked(question: int, reference: Reference | None, *, salt: int | None = None) -> int:
    """The pool prompt round `question` asks a group: one its reference recorded, if it is held to one."""
    return prompt(question, salt=salt, among=reference.prompts if reference is not None else None)


def _sorted(members: Collection[K]) -> tuple[K, ...]:
    return tuple(sorted(members, key=str))
