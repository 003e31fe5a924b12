"""GET /api/v1/verdicts: what the daemon knows of each watched server and model, for `specwatch check --exporter`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..core.report import EndpointEntry, ModelEntry, ServerEntry, VerdictsDocument, model_report, peers_entry
from ..core.state import ModelState, ServerState
from ..core.verdict import Freshness, Verdict
from ..probe.llama import names_of
from ..settings.schema import Settings
from ..version import __version__
from .cadence import freshness_bound

POLL_STALE_INTERVALS = 3
"""A model whose last good poll is older than this many poll_intervals is not being watched: its verdict is stale."""


@dataclass(frozen=True)
class Selection:
    """What an eval will read: servers by name (any of them), labels (all must match), a router model."""

    servers: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    model: str | None = None

    def matches(self, state: ServerState) -> bool:
        config = state.config
        if self.servers and config.name not in self.servers:
            return False
        return all(config.labels.get(key) == value for key, value in self.labels)

    def model_matches(self, key: str, model: ModelState) -> bool:
        if self.model is None:
            return True
        if key:
            return key == self.model
        reported = model.poll.props.model if model.poll is not None else ""
        return self.model in names_of(reported)


def parse_selection(query: Mapping[str, Sequence[str]]) -> Selection:
    """The selection from a query string (server=, label=KEY=VALUE, model=); raises ValueError saying what is wrong."""
    unknown = sorted(set(query) - {"server", "label", "model"})
    if unknown:
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}: use server=NAME, label=KEY=VALUE, model=ID")
    labels = []
    for item in query.get("label", ()):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"label {item!r} must look like KEY=VALUE")
        labels.append((key, value))
    models = query.get("model", ())
    if len(models) > 1:
        raise ValueError("model= may be given once")
    return Selection(frozenset(query.get("server", ())), tuple(labels), models[0] if models else None)


def _age(now: float, since: float | None) -> float | None:
    return None if since is None else max(0.0, now - since)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def _model_entry(key: str, model: ModelState, state: ServerState, settings: Settings, now: float) -> ModelEntry:
    report = model_report(key, model)
    successes = [c.last_success_timestamp for c in model.canaries.values() if c.last_success_timestamp is not None]
    confirmed = min(successes) if len(successes) == len(model.endpoints) and successes else None
    bound = freshness_bound(
        model, poll_interval=settings.poll_interval, interval=settings.canary_interval,
        timeout=settings.timeout_for(state.config, canary=True), tokens=settings.canary_tokens,
        tokens_speculating=settings.canary_tokens_speculating,
    )
    freshness = Freshness.measured(age=_age(now, confirmed), bound=bound,
                                   poll_age=_age(now, state.last_poll_success_timestamp),
                                   poll_bound=POLL_STALE_INTERVALS * settings.poll_interval)
    confirmed_at = {e.value: c.last_success_timestamp for e, c in model.canaries.items()}
    endpoints = [EndpointEntry(**vars(e), age_seconds=_rounded(_age(now, confirmed_at.get(e.endpoint))))
                 for e in report.endpoints]
    return ModelEntry(
        **(vars(report) | {"verdict": Verdict(report.verdict), "endpoints": endpoints}),
        key=key,
        age_seconds=_rounded(freshness.age),
        poll_age_seconds=_rounded(freshness.poll_age),
        max_age_seconds=round(bound, 3),
        max_poll_age_seconds=freshness.poll_bound,
        fresh=freshness.fresh,
        peers=None if model.peers is None else peers_entry(model.peers),
    )


def verdicts(states: Iterable[ServerState], settings: Settings, selection: Selection, now: float) -> dict[str, Any]:
    """The document GET /api/v1/verdicts answers (a report.VerdictsDocument): each selected server and its selected models."""
    servers = []
    for state in states:
        if not selection.matches(state):
            continue
        models = [_model_entry(key, model, state, settings, now) for key, model in state.models.items()
                  if selection.model_matches(key, model)]
        if not models:
            continue
        servers.append(ServerEntry(server=state.config.name, url=state.config.url, labels=dict(state.config.labels),
                                   router=bool(state.router), up=state.poll_success, models=models))
    return asdict(VerdictsDocument(
        specwatch=__version__, generated_at=round(now, 3), poll_interval_seconds=settings.poll_interval,
        canary_interval_seconds=settings.canary_interval, verdicts=[v.value for v in Verdict], servers=servers,
    ))
