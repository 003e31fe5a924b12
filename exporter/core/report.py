"""Verdicts as reports for machines and people: per model and per endpoint, from the state the runner recorded; and the
/api/v1/verdicts document a daemon writes and a gate reads."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

import pydantic

from ..probe.canary import Tally
from .peers import Standing
from .state import ModelState
from .verdict import Freshness, Verdict


@dataclass
class EndpointReport:
    endpoint: str
    tokens: int | None = None
    """Every token of the canary's answer."""
    judged_tokens: int | None = None
    """The tokens after the first, the ones that can be fill-ins: the denominator of `fill_in_ratio`."""
    fill_ins: int | None = None
    fill_in_ratio: float | None = None
    mean_logprob: float | None = None
    draft_n: int | None = None
    error: str | None = None
    reason: str | None = None
    """The closed-set reason of the last canary's failure (see the README), with `error` its detail."""


@dataclass
class ModelReport:
    """The verdict on one model: a server's only one, or one of a router's."""

    model: str
    status: str
    verdict: str = Verdict.UNCHECKED.value
    summary: str = ""
    speculation_slots: bool | None = None
    speculation_props: bool | None = None
    speculation_types: str | None = None
    """`speculative.types` as /props reports it (see Props.speculation_types)."""
    build: str | None = None
    endpoints: list[EndpointReport] = field(default_factory=list)


def endpoint_state(entry: EndpointReport) -> tuple[str, str]:
    """(kind, words) for people: "fill_ins", "drafted" (drafted and the logprobs are real: a fixed build), "quiet" (did
    not draft), "failed" or "pending". A fleet on a fixed build shows drafted, not merely quiet."""
    if entry.fill_ins:
        return "fill_ins", f"fill-ins {entry.fill_ins}/{entry.judged_tokens}"
    if entry.error:
        return "failed", f"failed ({entry.reason or 'error'})"
    if entry.tokens is None:
        return "pending", "no canary yet"
    if entry.draft_n:
        return "drafted", f"drafted {entry.draft_n}, logprobs real"
    return "quiet", "did not draft, logprobs real"


def endpoint_report(endpoint: str, tally: Tally | None, error: str | None, reason: str | None = None) -> EndpointReport:
    entry = EndpointReport(endpoint=endpoint, error=error, reason=reason)
    if tally is not None:
        entry.tokens, entry.judged_tokens, entry.fill_ins = tally.tokens, tally.judged_tokens, tally.fill_ins
        entry.draft_n = tally.draft_n
        entry.fill_in_ratio = round(tally.fill_in_ratio, 4)
        entry.mean_logprob = None if tally.mean_logprob is None else round(tally.mean_logprob, 4)
    return entry


def model_report(key: str, model: ModelState) -> ModelReport:
    """What the state says of one model; its endpoints only once a poll found it loaded and answering."""
    poll = model.poll
    decision = model.decision
    report = ModelReport(model=key or (poll.props.model if poll is not None else ""), status=model.status,
                         verdict=decision.verdict.value, summary=decision.summary)
    if poll is not None:
        report.speculation_props = poll.props.speculative
        report.speculation_types = poll.props.speculation_types
        report.speculation_slots = poll.slots.speculative if poll.slots is not None else None
        report.build = poll.props.build
        reasons = {e.value: c.failure_reason.value for e, c in model.canaries.items() if c.failure_reason is not None}
        report.endpoints = [endpoint_report(e.endpoint, e.tally, e.failure, reasons.get(e.endpoint))
                            for e in model.evidence().endpoints if e.tally is not None or e.failure is not None]
    return report


VERDICTS_PATH = "/api/v1/verdicts"


@dataclass(kw_only=True)
class EndpointEntry(EndpointReport):
    """One endpoint of a model in the verdicts document."""

    age_seconds: float | None
    """Since this endpoint's last successful canary; None without one."""


@dataclass(kw_only=True)
class PeersEntry:
    """How a model stands with its peer group (specwatch.core.peers): the second judgement, beside the fill-in verdict."""

    group: str
    agreement: bool | None
    """False once it differs (its file's content at once, its answers once the test decides); None with nothing to
    compare it with yet, no answer counted yet, or while it does not answer the rounds its group answers."""
    kind: str | None = None
    """"fingerprint" or "answers" when it differs."""
    held_against: list[str] = field(default_factory=list)
    """The replicas it is held against, named as `member_name` names them."""
    evidence: float | None = None
    """How far the test has come towards deciding that its answers differ, from 0 to 1 (1: decided)."""
    group_agreement: bool | None = None
    """The group's judgement: False when any member differs (the group serves more than one model)."""
    split: bool = False
    """The group has no majority: every member compared differs, so none is the reference (a pair that differs)."""
    detail: str = ""
    deployment: str = ""
    """How its deployment (build, file name) differs from the group's: shown, never counted."""
    noisy: bool = False
    """Its own noise stands far over its group's (core.evidence.NOISY): a server to look at, whatever its agreement."""
    missed_rounds: int = 0
    """Peer-probe rounds in a row its group answered and it did not: from core.evidence.MISSED on, its agreement is
    unknown and a gate refuses to call it agreeing."""


def peers_entry(standing: Standing) -> PeersEntry:
    """A standing as the verdicts document, the landing page and the gates show it."""
    comparison = standing.comparison
    differs = comparison.agreement is False
    return PeersEntry(
        group=standing.group, agreement=comparison.agreement, kind=comparison.kind if differs else None,
        held_against=list(comparison.held_against) if differs else [],
        evidence=None if comparison.agreement is None else round(comparison.evidence.share, 3),
        group_agreement=standing.group_agreement, split=standing.split, detail=comparison.detail,
        deployment=comparison.deployment, noisy=comparison.noisy, missed_rounds=comparison.evidence.missed,
    )


@dataclass(kw_only=True)
class ModelEntry(ModelReport):
    """One model of a server in the verdicts document: its report, and how fresh the daemon holds it."""

    verdict: Verdict
    endpoints: list[EndpointEntry] = field(default_factory=list)
    key: str
    """The router's name for the model; "" for a server's only one."""
    age_seconds: float | None
    poll_age_seconds: float | None
    max_age_seconds: float
    max_poll_age_seconds: float
    fresh: bool
    peers: PeersEntry | None = None
    """Its standing with its peer group; None for a group of one or a server taken out of comparisons."""

    def freshness(self) -> Freshness:
        return Freshness(self.fresh, self.age_seconds, self.max_age_seconds, self.poll_age_seconds, self.max_poll_age_seconds)


@dataclass(kw_only=True)
class ServerEntry:
    server: str
    url: str
    labels: dict[str, str]
    router: bool
    up: bool | None
    """Whether the last poll succeeded; None before the first."""
    models: list[ModelEntry]


@dataclass(kw_only=True)
class VerdictsDocument:
    """What GET /api/v1/verdicts answers (`dataclasses.asdict` of it, keys in this order) and `check --exporter` reads."""

    api: Literal["v1"] = "v1"
    specwatch: str
    generated_at: float
    poll_interval_seconds: float
    canary_interval_seconds: float
    verdicts: list[str]
    servers: list[ServerEntry]


@functools.cache
def _verdicts_reader() -> pydantic.TypeAdapter[VerdictsDocument]:
    return pydantic.TypeAdapter(VerdictsDocument)


def read_verdicts(document: object) -> VerdictsDocument:
    """The document a daemon answered, checked; keys it does not know are ignored. ValueError says where it is wrong."""
    try:
        return _verdicts_reader().validate_python(document)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{where}: {first['msg']}" if where else first["msg"]) from None
