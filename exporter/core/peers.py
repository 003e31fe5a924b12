"""Replicas compared: who is whose peer, what a model file and a canary answer show of it, and the group's majority."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePath
from typing import Any, Generic, TypeVar

from ..probe.llama import META_FIELDS
from ..probe.logprobs import Logprobs
from ..settings.schema import DEFAULT_CONFIRMATIONS, DEFAULT_TOLERANCE

OPT_OUT = "none"
"""The `peer_group` that takes a server out of every comparison."""
FINGERPRINT, TOKENS, LOGPROBS = "fingerprint", "tokens", "logprobs"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)


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
assert FINGERPRINT_FIELDS[2:] == META_FIELDS, "the fingerprint holds what /v1/models' meta gives, after build and file"


@dataclass(frozen=True)
class Peer:
    """One member of a group as a comparison sees it: its fingerprint and its last canary answer per endpoint."""

    fingerprint: Fingerprint | None = None
    answers: Mapping[str, Logprobs] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison(Generic[K]):
    """One member's standing in its group after a comparison."""

    agreement: bool | None
    """This comparison's judgement; None when there was nothing to compare it with."""
    kind: str | None = None
    """FINGERPRINT, TOKENS or LOGPROBS when it disagrees."""
    held_against: tuple[K, ...] = ()
    """The members it is held against: the majority, or every other side when there is none."""
    largest_difference: float | None = None
    """The largest logprob difference to the group's median, over real tokens and their alternatives."""
    streak: int = 0
    """Fresh answers in a row that disagreed."""
    confirmed: bool = False
    """The disagreement counts: a fingerprint at once, answers after enough fresh ones in a row."""
    detail: str = ""

    @property
    def counted(self) -> bool | None:
        """What metrics, documents and alerts show: a disagreement counts only once confirmed."""
        if self.agreement is None:
            return None
        return self.agreement or not self.confirmed


@dataclass(frozen=True)
class Standing:
    """A watched model's place in its group: the group and the last comparison."""

    group: str
    comparison: Comparison[str]


def fresh(peer: Peer, seen: Mapping[str, Logprobs]) -> set[str]:
    """The endpoints whose answer `peer` holds that a comparison that saw `seen` did not (told by identity: two answers
    alike are still two answers)."""
    return {e for e, a in peer.answers.items() if seen.get(e) is not a}


@dataclass
class _Finding(Generic[K]):
    kind: str
    against: set[K]
    detail: str
    endpoint: str | None = None
    """The endpoint whose answers differ; None for the fingerprint."""


Findings = dict[K, list[_Finding[K]]]
KINDS = (FINGERPRINT, TOKENS, LOGPROBS)


def _majority(values: Mapping[K, V]) -> V | None:
    """The value more than half the members hold, None when none does."""
    value, count = Counter(values.values()).most_common(1)[0]
    return value if count * 2 > len(values) else None


def _split(values: Mapping[K, V]) -> dict[K, set[K]]:
    """Each member off the majority, with the members it is held against; without a majority, every side against
    all the others (two members that differ name each other)."""
    if len(set(values.values())) < 2:
        return {}
    reference = _majority(values)
    if reference is not None:
        holders = {k for k, v in values.items() if v == reference}
        return {k: holders for k, v in values.items() if v != reference}
    return {k: {o for o, w in values.items() if w != v} for k, v in values.items()}


def _fingerprints(peers: Mapping[K, Peer], found: Findings[K], compared: set[K]) -> None:
    known = {k: p.fingerprint for k, p in peers.items() if p.fingerprint is not None}
    if len(known) > 1 and len(set(known.values())) == 1:  # alike, the common case: one look
        if any(getattr(next(iter(known.values())), name) for name in FINGERPRINT_FIELDS):
            compared.update(known)
        return
    for name in FINGERPRINT_FIELDS:
        values = {k: getattr(p.fingerprint, name) for k, p in peers.items()
                  if p.fingerprint is not None and getattr(p.fingerprint, name) != ""}
        if len(values) < 2:
            continue
        compared.update(values)
        reference = _majority(values)
        for k, against in _split(values).items():
            if not found.get(k):
                others = "the group's " + (repr(reference) if reference is not None else "others")
                found.setdefault(k, []).append(_Finding(FINGERPRINT, against, f"{name} {values[k]!r}, {others}"))


def _answers(endpoint: str, answers: Mapping[K, Logprobs], tolerance: float, found: Findings[K],
             compared: set[K], differences: dict[K, float]) -> None:
    # Canaries differ in length (a speculating server is asked more tokens): the shortest answer sets the prefix.
    length = min(len(a.tokens) for a in answers.values())
    if length == 0:
        return
    compared.update(answers)
    keys = {k: a.tokens[:length] for k, a in answers.items()}
    reference = _majority(keys)
    for k, against in _split(keys).items():
        mine, theirs = keys[k], reference if reference is not None else keys[next(iter(against))]
        at = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
        found.setdefault(k, []).append(
            _Finding(TOKENS, against, f"{endpoint}: token {at} is {mine[at]!r}, {theirs[at]!r} elsewhere", endpoint))
    same = [k for k, key in keys.items() if key == reference]
    if len(same) < 2:
        return
    # Replicas alike answer alike: each distinct answer (told by the digest taken once per answer) is compared once,
    # weighted by the members that gave it, so a group costs its distinct answers, not its size.
    distinct: dict[int, list[K]] = {}
    contents: list[tuple[tuple[float | None, ...], tuple[tuple[Any, ...], ...]]] = []
    for k in same:
        answer = answers[k]
        whole = len(answer.values) == length
        digest = answer.digest if whole else hash((answer.values[:length], answer.alternatives[:length]))
        members = distinct.get(digest)
        if members is None:
            members = distinct[digest] = []
            contents.append((answer.values, answer.alternatives))
        members.append(k)
    worst: dict[int, _Worst] = {}
    if len(distinct) > 1:
        weights = [len(members) for members in distinct.values()]
        for at in range(length):
            _values([(i, c[0][at], weights[i]) for i, c in enumerate(contents)], at, None, worst)
            by_text: dict[str, list[tuple[int, float | None, int]]] = {}
            for i, (_, alternatives) in enumerate(contents):
                flat = alternatives[at]
                for j in range(0, len(flat), 2):
                    by_text.setdefault(flat[j], []).append((i, flat[j + 1], weights[i]))
            for alternative, values in by_text.items():
                _values(values, at, alternative, worst)
    for index, members in enumerate(distinct.values()):
        difference, at, named, value, middle = worst.get(index, (0.0, 0, None, 0.0, 0.0))
        for k in members:
            differences[k] = max(differences.get(k, 0.0), difference)
            if difference > tolerance:
                what = f"token {at}" + (f"'s alternative {named!r}" if named is not None else "")
                found.setdefault(k, []).append(_Finding(
                    LOGPROBS, set(same) - {k}, f"{endpoint}: {what} logprob {value:.3f}, the group's median {middle:.3f}",
                    endpoint))


_Worst = tuple[float, int, "str | None", float, float]
"""(difference, token position, the alternative's text or None for the token itself, its value, the median)."""


def _median(values: list[tuple[float, int]]) -> float:
    """The median of values each held `weight` times."""
    ordered = sorted(values)
    total = sum(weight for _, weight in ordered)
    low, high = (total - 1) // 2, total // 2
    found: list[float] = []
    seen = 0
    for value, weight in ordered:
        while len(found) < 2 and seen + weight > (low if not found else high):
            found.append(value)
        seen += weight
        if len(found) == 2:
            break
    return (found[0] + found[1]) / 2


def _values(values: list[tuple[int, float | None, int]], at: int, text: str | None, worst: dict[int, _Worst]) -> None:
    real = [(i, v, w) for i, v, w in values if v is not None]
    if len(real) < 2 or min(v for _, v, _ in real) == max(v for _, v, _ in real):
        return  # alike here: nothing differs
    middle = _median([(v, w) for _, v, w in real])
    for i, v, _ in real:
        difference = abs(v - middle)
        if difference > worst.get(i, (-1.0,))[0]:
            worst[i] = (difference, at, text, v, middle)


def compare(
    peers: Mapping[K, Peer], *, tolerance: float = DEFAULT_TOLERANCE, confirmations: int = DEFAULT_CONFIRMATIONS,
    streaks: Mapping[K, int] | None = None, fresh: Mapping[K, Collection[str]] | None = None,
) -> dict[K, Comparison[K]]:
    """Every member of one group against the group's majority: the fingerprint first, then each endpoint's answers.

    `streaks` are the members' streaks from the last comparison, `fresh` each member's endpoints with an answer newer
    than it (None: every answer is fresh). A streak grows only when a fresh answer disagrees, so one noisy answer is
    counted once however often its group is compared before that endpoint is asked again; one that agrees ends it.
    """
    found: Findings[K] = {}
    compared: set[K] = set()
    differences: dict[K, float] = {}
    _fingerprints(peers, found, compared)
    endpoints = {e for p in peers.values() for e in p.answers}
    for endpoint in sorted(endpoints):
        answers = {k: p.answers[endpoint] for k, p in peers.items() if endpoint in p.answers}
        if len(answers) >= 2:
            _answers(endpoint, answers, tolerance, found, compared, differences)
    results: dict[K, Comparison[K]] = {}
    for k in peers:
        difference = differences.get(k)
        findings = found.get(k)
        if k not in compared:
            results[k] = Comparison(None)
        elif not findings:
            results[k] = Comparison(True, largest_difference=difference)
        else:
            finding = min(findings, key=lambda f: KINDS.index(f.kind))
            before = (streaks or {}).get(k, 0)
            new = fresh is None or any(f.endpoint in fresh.get(k, ()) for f in findings)
            streak = before + 1 if new else before
            confirmed = finding.kind == FINGERPRINT or streak >= confirmations
            results[k] = Comparison(False, finding.kind, tuple(sorted(finding.against, key=str)), difference,
                                    streak, confirmed, finding.detail)
    return results
