"""State to samples: which series each server, router model and endpoint has, and their values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ...core.peers import FINGERPRINT_FIELDS
from ...core.state import CanaryState, ModelState, ServerState
from ...core.verdict import Verdict
from ...version import __version__
from ..discovery import SourceStatus
from .catalog import EXPORTER, Family

Extra = tuple[tuple[str, str], ...]
"""Labels of a sample beyond its server's, in the order they are written."""
NONE: Extra = ()
OUTCOMES = ("success", "failure")
_OUTCOMES: dict[str, Extra] = {outcome: (("outcome", outcome),) for outcome in OUTCOMES}
_VERDICTS: dict[Verdict, Extra] = {state: (("verdict", state.value),) for state in Verdict}


class Sink(Protocol):
    """Where samples go: lines of text, or prometheus_client families."""

    def add(self, family: str, extra: Extra, value: float) -> None: ...


@dataclass(frozen=True)
class ExporterStatus:
    poll_interval: float
    canary_interval: float
    reload_successful: bool = True
    last_reload_success_timestamp: float | None = None
    configured_servers: int | None = None
    """Servers in the config, static and discovered, before sharding; None: the ones watched."""
    discovery: tuple[SourceStatus, ...] = ()
    exposition_errors: int = 0
    """Renders of /metrics that failed so far (the Exposition counts them)."""


# Durations to a tenth of a millisecond and times to the millisecond: the digits beyond are noise, and these values
# change at every poll or canary, so their length is what every scrape formats and compresses.
def _duration(seconds: float) -> float:
    return round(seconds, 4)


def _timestamp(seconds: float) -> float:
    return round(seconds, 3)


def _model(key: str) -> Extra:
    """The model label of a model's series: absent for a server watched without a `model:`."""
    return (("model", key),) if key else NONE


def poll_samples(out: Sink, server: ServerState) -> None:
    """What every poll changes: its outcome, timing and counters."""
    if server.poll_success is not None:
        out.add("specwatch_up", NONE, 1 if server.poll_success else 0)
        out.add("specwatch_poll_duration_seconds", NONE, _duration(server.poll_duration_seconds or 0.0))
    if server.last_poll_success_timestamp is not None:
        out.add("specwatch_last_poll_success_timestamp_seconds", NONE, _timestamp(server.last_poll_success_timestamp))
    for outcome in OUTCOMES:
        out.add("specwatch_polls", _OUTCOMES[outcome], server.poll_outcomes.get(outcome, 0))
    for reason, count in sorted(server.poll_failures.items()):
        out.add("specwatch_poll_failures", (("reason", reason.value),), count)


def answer_samples(out: Sink, server: ServerState) -> None:
    """What the poll's answers say: loaded models, speculation per /slots and /props, slots, build and model."""
    for key, model in server.models.items():
        extra = _model(key)
        if server.router or model.status == "sleeping":
            out.add("specwatch_model_loaded", extra, int(model.loaded))
        poll = model.poll
        if poll is None:
            continue
        props_on = poll.props.speculative
        slots_on = poll.slots.speculative if poll.slots is not None else None
        if slots_on is not None:
            out.add("specwatch_speculation_enabled", (*extra, ("source", "slots")), int(slots_on))
        if props_on is not None:
            out.add("specwatch_speculation_enabled", (*extra, ("source", "props")), int(props_on))
        if slots_on is not None and props_on is not None:
            out.add("specwatch_speculation_contradiction", extra, int(slots_on and not props_on))
        slots = poll.props.total_slots if poll.props.total_slots is not None else (poll.slots.count if poll.slots else None)
        if slots is not None:
            out.add("specwatch_slots", extra, slots)
        # A model's series name it already; a server's one model is named by what it reports.
        out.add("specwatch_server_info", (("build", poll.props.build), *(extra or (("model", poll.props.model),))), 1)


def canary_samples(out: Sink, server: ServerState) -> None:
    """Each model's canaries: per endpoint, the last one's tally and timing; per model, the counters."""
    for key, model in server.models.items():
        _model_canaries(out, model, _model(key))


def _model_canaries(out: Sink, model: ModelState, extra: Extra) -> None:
    for endpoint, canary in sorted(model.canaries.items()):
        _endpoint(out, (("endpoint", endpoint.value), *extra), canary)
    # Every configured endpoint, canaried or not: a page names those still waiting instead of leaving them out.
    for endpoint in sorted(model.endpoints):
        canary = model.canaries.get(endpoint)
        checked = canary is not None and canary.tally is not None
        out.add("specwatch_canary_checked", (("endpoint", endpoint.value), *extra), int(checked))
    for outcome in OUTCOMES:
        out.add("specwatch_canaries", (*extra, ("outcome", outcome)), model.canary_outcomes.get(outcome, 0))
    for (endpoint, reason), count in sorted(model.canary_failures.items()):
        out.add("specwatch_canary_failures", (("endpoint", endpoint.value), *extra, ("reason", reason.value)), count)
    out.add("specwatch_canary_requested_tokens", extra, model.canary_tokens.get("requested", 0))
    out.add("specwatch_canary_generated_tokens", extra, model.canary_tokens.get("generated", 0))
    serving = model.serving_fill_ins
    if serving is not None:
        out.add("specwatch_serving_placeholders", extra, int(serving))


def _endpoint(out: Sink, where: Extra, canary: CanaryState) -> None:
    out.add("specwatch_canary_success", where, int(canary.success))
    out.add("specwatch_canary_duration_seconds", where, _duration(canary.duration_seconds))
    if canary.last_success_timestamp is not None:
        out.add("specwatch_canary_last_success_timestamp_seconds", where, _timestamp(canary.last_success_timestamp))
    tally = canary.tally
    if tally is None:
        return
    out.add("specwatch_canary_placeholder_ratio", where, tally.fill_in_ratio)
    out.add("specwatch_canary_tokens", where, tally.judged_tokens)
    out.add("specwatch_canary_placeholder_tokens", where, tally.fill_ins)
    if tally.mean_logprob is not None:
        out.add("specwatch_canary_mean_logprob", where, tally.mean_logprob)
    if tally.draft_n is not None:
        out.add("specwatch_canary_draft_tokens", where, tally.draft_n)


def peer_samples(out: Sink, server: ServerState) -> None:
    """Each model's fingerprint, and its standing in its peer group."""
    for key, model in server.models.items():
        extra = _model(key)
        fingerprint = model.fingerprint
        if fingerprint is not None:
            labels = tuple((name, getattr(fingerprint, name)) for name in FINGERPRINT_FIELDS)
            out.add("specwatch_model_fingerprint_info", (*extra, ("peer_group", server.peer_group(key) or ""), *labels), 1)
        held = model.peer_answers
        if held.outcomes:
            for outcome in ("success", "failure"):
                out.add("specwatch_peer_probes", (*extra, ("outcome", outcome)), held.outcomes.get(outcome, 0))
            for reason, count in held.failures.items():
                out.add("specwatch_peer_probe_failures", (*extra, ("reason", reason.value)), count)
        if held.noise is not None:
            out.add("specwatch_peer_noise_nats", extra, round(held.noise, 4))
        standing = model.peers
        if standing is None:
            continue
        where = (*extra, ("peer_group", standing.group))
        comparison = standing.comparison
        if comparison.agreement is not None:
            out.add("specwatch_peer_agreement", where, int(comparison.agreement))
        if comparison.evidence.answers:
            out.add("specwatch_peer_evidence", where, round(comparison.evidence.share, 4))
            out.add("specwatch_peer_noisy", where, int(comparison.noisy))
            if comparison.floor is not None:
                out.add("specwatch_peer_floor_nats", where, comparison.floor)
            out.add("specwatch_peer_missed_rounds", where, comparison.evidence.missed)


def verdict_samples(out: Sink, server: ServerState) -> None:
    """The verdict of each model as a state set: exactly one of the four is 1."""
    for key, model in server.models.items():
        extra = _model(key)
        verdict = model.decision.verdict
        for state in Verdict:
            out.add("specwatch_verdict", (*extra, *_VERDICTS[state]), int(state is verdict))


def exporter_families(status: ExporterStatus) -> tuple[Family, ...]:
    """The exporter's own families this status has samples for (a reload time once known, discovery once configured)."""
    skipped = set()
    if status.last_reload_success_timestamp is None:
        skipped.add("specwatch_config_last_reload_success_timestamp_seconds")
    if not status.discovery:
        skipped |= {"specwatch_discovery_targets", "specwatch_discovery_refresh_successful",
                    "specwatch_discovery_last_success_timestamp_seconds"}
    return tuple(f for f in EXPORTER if f.name not in skipped)


def exporter_samples(out: Sink, status: ExporterStatus, servers: int) -> None:
    """The exporter's own samples, after the servers'."""
    out.add("specwatch_build_info", (("version", __version__),), 1)
    out.add("specwatch_poll_interval_seconds", NONE, status.poll_interval)
    out.add("specwatch_canary_interval_seconds", NONE, status.canary_interval)
    out.add("specwatch_servers", NONE, servers)
    out.add("specwatch_configured_servers", NONE, servers if status.configured_servers is None else status.configured_servers)
    out.add("specwatch_config_last_reload_successful", NONE, 1 if status.reload_successful else 0)
    if status.last_reload_success_timestamp is not None:
        out.add("specwatch_config_last_reload_success_timestamp_seconds", NONE, status.last_reload_success_timestamp)
    out.add("specwatch_exposition_errors", NONE, status.exposition_errors)
    for source in status.discovery:
        where = (("source", source.source),)
        out.add("specwatch_discovery_targets", where, source.targets)
        if source.ok is not None:
            out.add("specwatch_discovery_refresh_successful", where, int(source.ok))
        if source.last_success_timestamp is not None:
            out.add("specwatch_discovery_last_success_timestamp_seconds", where, source.last_success_timestamp)


def _poll_key(server: ServerState) -> tuple[object, ...]:
    return (server.poll_success, server.poll_duration_seconds, server.last_poll_success_timestamp, server.poll_outcomes,
            server.poll_failures)


def _answers_key(server: ServerState) -> tuple[object, ...]:
    # A model's setup holds every value its answer lines show.
    return (server.router, tuple((key, m.status, None if m.poll is None else m.seen) for key, m in server.models.items()))


def _canaries_key(server: ServerState) -> tuple[object, ...]:
    # Kept by identity through polls, replaced by each canary.
    return tuple((key, m.endpoints, m.canaries, m.canary_failures, m.canary_outcomes, m.canary_tokens)
                 for key, m in server.models.items())


def _peers_key(server: ServerState) -> tuple[object, ...]:
    return (server.router, server.config.peer_group,
            tuple((key, m.peers, m.meta, m.meta_for, m.loaded, None if m.poll is None else m.poll.props,
                   m.peer_answers.outcomes, m.peer_answers.failures, m.peer_answers.spreads)
                  for key, m in server.models.items()))


def _verdict_key(server: ServerState) -> tuple[object, ...]:
    # A poll makes a new model state, but rarely another verdict.
    return tuple((key, m.decision.verdict) for key, m in server.models.items())


@dataclass(frozen=True)
class Group:
    """Some families of a server whose samples are a function of `key(server)` alone: rendered again when it changes."""

    samples: Callable[[Sink, ServerState], None]
    key: Callable[[ServerState], tuple[object, ...]]
    families: tuple[str, ...]


GROUPS: tuple[Group, ...] = (
    Group(poll_samples, _poll_key,
          ("specwatch_up", "specwatch_poll_duration_seconds", "specwatch_last_poll_success_timestamp_seconds",
           "specwatch_polls", "specwatch_poll_failures")),
    Group(answer_samples, _answers_key,
          ("specwatch_model_loaded", "specwatch_speculation_enabled", "specwatch_speculation_contradiction", "specwatch_slots",
           "specwatch_server_info")),
    Group(canary_samples, _canaries_key,
          ("specwatch_canary_success", "specwatch_canary_duration_seconds", "specwatch_canary_last_success_timestamp_seconds",
           "specwatch_canary_checked", "specwatch_canary_placeholder_ratio", "specwatch_canary_tokens",
           "specwatch_canary_placeholder_tokens",
           "specwatch_canary_mean_logprob", "specwatch_canary_draft_tokens", "specwatch_canaries",
           "specwatch_canary_failures", "specwatch_canary_requested_tokens", "specwatch_canary_generated_tokens",
           "specwatch_serving_placeholders")),
    Group(verdict_samples, _verdict_key, ("specwatch_verdict",)),
    Group(peer_samples, _peers_key,
          ("specwatch_model_fingerprint_info", "specwatch_peer_agreement", "specwatch_peer_evidence",
           "specwatch_peer_noise_nats", "specwatch_peer_noisy", "specwatch_peer_floor_nats", "specwatch_peer_missed_rounds",
           "specwatch_peer_probes", "specwatch_peer_probe_failures")),
)
