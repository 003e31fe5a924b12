"""What specwatch knows about each server, as immutable snapshots that a scrape reads without locks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from exporter.probe.canary import Endpoint, Tally
from exporter.probe.probes import PollResult
from exporter.reasons import Reason
from exporter.settings import ServerConfig
from exporter.verdict import Decision, EndpointEvidence, Evidence, decide


@dataclass(frozen=True)
class CanaryState:
    duration_seconds: float
    tally: Tally | None = None
    """The last successful canary's tally: cached until the next success."""
    last_success_timestamp: float | None = None
    failure_reason: Reason | None = None
    """Why the last canary failed; None when it succeeded."""
    failure_detail: str = ""

    @property
    def success(self) -> bool:
        return self.failure_reason is None


@dataclass(frozen=True)
class ServerState:
    config: ServerConfig
    endpoints: tuple[Endpoint, ...] = ()
    """The endpoints the canary asks: a verdict needs every one of them."""
    poll: PollResult | None = None
    """The last poll's answer; None when the last poll failed or none has run."""
    poll_failure_reason: Reason | None = None
    poll_failure_detail: str = ""
    poll_duration_seconds: float | None = None
    last_poll_success_timestamp: float | None = None
    poll_failures: Mapping[Reason, int] = field(default_factory=lambda: MappingProxyType({}))
    canaries: Mapping[Endpoint, CanaryState] = field(default_factory=lambda: MappingProxyType({}))
    canary_failures: Mapping[tuple[Endpoint, Reason], int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def poll_success(self) -> bool | None:
        """True after a good poll, False after a failed one, None before the first."""
        if self.poll is not None:
            return True
        return False if self.poll_failure_reason is not None else None

    @property
    def serving_fill_ins(self) -> bool | None:
        """Whether the last successful canary of any endpoint found fill-ins; None before any success."""
        tallies = [c.tally for c in self.canaries.values() if c.tally is not None]
        if not tallies:
            return None
        return any(t.fill_ins > 0 for t in tallies)

    @cached_property
    def decision(self) -> Decision:
        """The verdict on this server, from `exporter.verdict` like every other consumer's."""
        if self.poll is None:
            reason = self.poll_failure_reason
            return decide(Evidence(poll_failure=f"{reason}: {self.poll_failure_detail}" if reason else "not polled yet"))
        evidence = []
        for endpoint in self.endpoints:
            canary = self.canaries.get(endpoint)
            if canary is None:
                evidence.append(EndpointEvidence(endpoint.value, None))
            else:
                failure = None if canary.success else f"{canary.failure_reason}: {canary.failure_detail}"
                evidence.append(EndpointEvidence(endpoint.value, canary.tally, failure))
        return decide(Evidence(
            poll_failure=None,
            speculation_slots=self.poll.slots.speculative if self.poll.slots is not None else None,
            speculation_props=self.poll.props.speculative,
            endpoints=evidence,
        ))


def _bumped(counts: Mapping, key: object) -> Mapping:
    updated = dict(counts)
    updated[key] = updated.get(key, 0) + 1
    return MappingProxyType(updated)


class Fleet:
    """Per-server state. Writers run on the event loop; readers (scrapes) may run on any thread.

    Each update rebinds `_servers` to a new dict, so a reader's `snapshot()` is always consistent.
    """

    def __init__(self, servers: Iterable[ServerConfig] = (), endpoints: Iterable[Endpoint] = ()) -> None:
        wanted = tuple(endpoints)
        self._servers: dict[str, ServerState] = {s.name: ServerState(config=s, endpoints=wanted) for s in servers}

    def snapshot(self) -> list[ServerState]:
        return list(self._servers.values())

    def get(self, name: str) -> ServerState | None:
        return self._servers.get(name)

    def reconcile(self, servers: Iterable[ServerConfig], endpoints: Iterable[Endpoint]) -> None:
        """Adopt a new config: removed servers and endpoints vanish; a server whose target is unchanged keeps its data."""
        current, wanted = self._servers, tuple(endpoints)
        updated: dict[str, ServerState] = {}
        for server in servers:
            old = current.get(server.name)
            if old is not None and old.config.url == server.url and old.config.model == server.model:
                canaries = MappingProxyType({e: c for e, c in old.canaries.items() if e in wanted})
                updated[server.name] = replace(old, config=server, endpoints=wanted, canaries=canaries)
            else:
                updated[server.name] = ServerState(config=server, endpoints=wanted)
        self._servers = updated

    def _update(self, name: str, **changes: object) -> tuple[ServerState, ServerState] | None:
        """(old, new) state of `name` after `changes`; None when a reload removed it while its probe was in flight."""
        old = self._servers.get(name)
        if old is None:
            return None
        new = replace(old, **changes)
        self._servers = {**self._servers, name: new}
        return old, new

    def record_poll(
        self, name: str, *, result: PollResult | None, reason: Reason | None, detail: str = "", duration: float, now: float
    ) -> tuple[ServerState, ServerState] | None:
        old = self._servers.get(name)
        if old is None:
            return None
        if reason is None:
            return self._update(
                name, poll=result, poll_failure_reason=None, poll_failure_detail="", poll_duration_seconds=duration,
                last_poll_success_timestamp=now,
            )
        return self._update(
            name, poll=None, poll_failure_reason=reason, poll_failure_detail=detail, poll_duration_seconds=duration,
            poll_failures=_bumped(old.poll_failures, reason),
        )

    def record_canary(
        self, name: str, endpoint: Endpoint, *, tally: Tally | None, reason: Reason | None, detail: str = "",
        duration: float, now: float,
    ) -> tuple[ServerState, ServerState] | None:
        old = self._servers.get(name)
        if old is None:
            return None
        previous = old.canaries.get(endpoint)
        if reason is None:
            state = CanaryState(duration_seconds=duration, tally=tally, last_success_timestamp=now)
            failures = old.canary_failures
        else:
            state = CanaryState(
                duration_seconds=duration,
                tally=previous.tally if previous else None,
                last_success_timestamp=previous.last_success_timestamp if previous else None,
                failure_reason=reason,
                failure_detail=detail,
            )
            failures = _bumped(old.canary_failures, (endpoint, reason))
        canaries = dict(old.canaries)
        canaries[endpoint] = state
        return self._update(name, canaries=MappingProxyType(canaries), canary_failures=failures)
