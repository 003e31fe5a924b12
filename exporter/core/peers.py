"""Replicas compared: who is whose peer, what their model files say, and how their answers stand against the group's.

A model file's content (quantization, size, shape) counts at once: another file is another model. How it was deployed
(the llama.cpp build, the file's name) is shown and never counts: a rolling upgrade or a renamed file changes no answer.
Answers to the peer probe count through the sequential test of core/evidence.py. A member's difference is taken to
its floor(n/2)-th nearest member (n members answering): a member of a majority has that many within the noise, one off
it has not; in a pair each side's difference is the gap itself, and a split leaves every member off a majority.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePath
from typing import Generic, TypeVar

from ..probe.llama import META_FIELDS
from ..probe.logprobs import Logprobs
from ..probe.peerprobe import QUESTIONS
from .evidence import MARGIN, Difference, Evidence, difference, score

OPT_OUT = "none"
"""The `peer_group` that takes a server out of every comparison."""
FINGERPRINT, ANSWERS = "fingerprint", "answers"
"""What a disagreement rests on: the model file's content, at once; or the answers, once the test decides."""
REFERENCES = 32
"""A large group's members are compared with its most common answers, this many at most: a group costs its size."""

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
    """One member of a group as a comparison sees it: its fingerprint, its answers to the peer probe's questions (the
    latest of each), and the batching noise measured on it per question."""

    fingerprint: Fingerprint | None = None
    answers: Mapping[int, Logprobs] = field(default_factory=dict)
    noise: Mapping[int, float] = field(default_factory=dict)


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
    evidence: Evidence = field(default_factory=Evidence)
    detail: str = ""
    """What the last comparison found: the disagreement, or the evidence so far."""
    deployment: str = ""
    """How its deployment differs from the group's (build, file name): shown, never counted."""


@dataclass(frozen=True)
class Judgement(Generic[K]):
    """A group compared: each member's standing, and the group's."""

    members: dict[K, Comparison[K]]
    counted: dict[K, set[int]] = field(default_factory=dict)
    """The questions whose answer each member had counted in this comparison: a caller marks those seen, and only those
    (an answer to a question not every member has answered yet waits, fresh, for the comparison that counts it)."""

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


def fresh(peer: Peer, seen: Mapping[int, Logprobs]) -> set[int]:
    """The questions whose answer `peer` holds that a comparison that saw `seen` did not (told by identity: two answers
    alike are still two answers)."""
    return {q for q, a in peer.answers.items() if seen.get(q) is not a}


@dataclass
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


def _distinct(answers: Mapping[K, Logprobs]) -> list[tuple[Logprobs, list[K]]]:
    """The group's answers, alike ones together, the most common first."""
    seen: dict[tuple[object, ...], tuple[Logprobs, list[K]]] = {}
    for k, answer in answers.items():
        key = (answer.texts, answer.values.tobytes(), answer.alternative_values.tobytes())
        held = seen.get(key)
        if held is None:
            seen[key] = (answer, [k])
        else:
            held[1].append(k)
    return sorted(seen.values(), key=lambda held: -len(held[1]))


def _ranked(answers: Mapping[K, Logprobs]) -> dict[K, list[tuple[Difference, list[K]]]]:
    """For each member, the other members by their answer's difference to its own, nearest first (alike answers at no
    distance); a large group's members are held to its REFERENCES most common answers."""
    groups = _distinct(answers)
    references = groups[:REFERENCES]
    found: dict[K, list[tuple[Difference, list[K]]]] = {}
    for mine, members in groups:
        ranked: list[tuple[Difference, list[K]]] = [(Difference(0.0, len(mine)), members)]
        for theirs, others in references:
            if theirs is not mine:
                apart = difference(mine, theirs)
                if not apart.nothing:
                    ranked.append((apart, others))
        ranked.sort(key=lambda entry: entry[0].mean)
        for k in members:
            found[k] = [(apart, [o for o in others if o != k]) for apart, others in ranked]
    return found


def _nth(ranked: list[tuple[Difference, list[K]]], rank: int) -> Difference | None:
    """The difference to the rank-th nearest other member; None with fewer others to compare with."""
    counted = 0
    for apart, others in ranked:
        counted += len(others)
        if counted >= rank:
            return apart
    return None


def _question(peers: Mapping[K, Peer], question: int) -> dict[K, Logprobs] | None:
    """Every member's answer to `question`; None until each member that answers (it is polled and loaded) has answered
    it and had its noise measured: a group is never judged by part of it."""
    answering = {k: p for k, p in peers.items() if p.fingerprint is not None}
    if len(answering) < 2 or any(question not in p.answers or question not in p.noise for p in answering.values()):
        return None
    return {k: p.answers[question] for k, p in answering.items()}


def noise_of(peers: Mapping[K, Peer], nearest: list[float]) -> float:
    """The group's noise on one question: the largest spread a burst measured on any member, on any question (how far
    one server's answers move with its batch), or, in a group of three or more, how far its members typically stand
    from their nearest peer (a minority that differs cannot move that median), whichever is larger."""
    bursts = max((spread for peer in peers.values() for spread in peer.noise.values()), default=0.0)
    within = sorted(nearest)[len(nearest) // 2] if len(nearest) >= 3 else 0.0
    return max(bursts, within)


def compare(
    peers: Mapping[K, Peer], *, before: Mapping[K, Evidence] | None = None,
    fresh: Mapping[K, Collection[int]] | None = None,
) -> Judgement[K]:
    """Every member of one group against the others: the file's content first, then each question's answers.

    `before` is each member's evidence from the last comparison, `fresh` the questions each member answered since
    (None: every answer is fresh). Each fresh answer is counted once, however often the group is compared meanwhile.
    """
    found, compared = _fields(peers, CONTENT_FIELDS)
    shown, _ = _fields(peers, DEPLOYMENT_FIELDS)
    evidence = {k: (before or {}).get(k, Evidence()) for k in peers}
    said: dict[K, str] = {}
    counted: dict[K, set[int]] = {}
    for question in range(len(QUESTIONS)):
        answers = _question(peers, question)
        if answers is None:
            continue
        compared.update(answers)
        ranked = _ranked(answers)
        nearest = [first.mean for first in (_nth(r, 1) for r in ranked.values()) if first is not None]
        noise = noise_of({k: peers[k] for k in answers}, nearest)
        rank = len(answers) // 2
        for k in answers:
            if fresh is not None and question not in fresh.get(k, ()):
                continue
            counted.setdefault(k, set()).add(question)
            apart = _nth(ranked[k], rank)
            if apart is None:
                continue
            evidence[k] = evidence[k].after(score(apart, noise))
            parted = f", parting at token {apart.parted}" if apart.parted is not None else ""
            said[k] = (f"question {question}: {apart.mean:.3f} nats from its nearest peers{parted}, "
                       f"{score(apart, noise):.1f} times the group's noise ({max(noise, MARGIN):.3f})")
    differ = {k for k in compared if k in found or evidence[k].decided}
    agree = compared - differ
    results: dict[K, Comparison[K]] = {}
    for k in peers:
        deployment = shown[k].detail if k in shown else ""
        if k in found:
            results[k] = Comparison(False, FINGERPRINT, _sorted(found[k].against), evidence[k], found[k].detail, deployment)
        elif k not in compared:
            results[k] = Comparison(None, deployment=deployment)
        elif k in differ:
            # Held against the members that agree; in a group without a majority, against every other one.
            against = agree or (compared - {k})
            results[k] = Comparison(False, ANSWERS, _sorted(against), evidence[k], said.get(k, ""), deployment)
        else:
            results[k] = Comparison(True, evidence=evidence[k], detail=said.get(k, ""), deployment=deployment)
    return Judgement(results, counted)


def _sorted(members: Collection[K]) -> tuple[K, ...]:
    return tuple(sorted(members, key=str))
