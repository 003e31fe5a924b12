"""What specwatch knows about each server, as immutable snapshots that a scrape reads without locks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from exporter.canary import Verdict
from exporter.probes import PollResult
from exporter.reasons import Reason
from exporter.settings import Endpoint, ServerConfig


@dataclass(frozen=True)
class CanaryState:
    duration_seconds: float
    last_result: Verdict | None = None
    """The last successful canary's verdict: cached until the next success."""
    last_success_timestamp: float | None = None
    failure_reason: Reason | None = None
    """Why the last canary failed; None when it succeeded."""

    @property
    def success(self) -> bool:
        return self.failure_reason is None


@dataclass(frozen=True)
class ServerState:
    config: ServerConfig
    poll: PollResult | None = None
    """The last poll's answer; None when the last poll failed or none has run."""
    poll_failure_reason: Reason | None = None
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
    def serving_placeholders(self) -> bool | None:
        results = [c.last_result for c in self.canaries.values() if c.last_result is not None]
        if not results:
            return None
        return any(r.placeholders > 0 for r in results)


def _bumped(counts: Mapping, key: object) -> Mapping:
    updated = dict(counts)
    updated[key] = updated.get(key, 0) + 1
    return MappingProxyType(updated)


class Fleet:
    """Per-server state. Writers run on the event loop; readers (scrapes) may run on any thread.

    Each update rebinds `_servers` to a new dict, so a reader's `snapshot()` is always consistent.
    """

    def __init__(self, servers: Iterable[ServerConfig] = ()) -> None:
        self._servers: dict[str, ServerState] = {s.name: ServerState(config=s) for s in servers}

    def snapshot(self) -> list[ServerState]:
        return list(self._servers.values())

    def get(self, name: str) -> ServerState | None:
        return self._servers.get(name)

    def reconcile(self, servers: Iterable[ServerConfig], endpoints: Iterable[Endpoint]) -> None:
        """Adopt a new config: removed servers and endpoints vanish; a server whose target is unchanged keeps its data."""
        current, wanted = self._servers, set(endpoints)
        updated: dict[str, ServerState] = {}
        for server in servers:
            old = current.get(server.name)
            if old is not None and old.config.url == server.url and old.config.model == server.model:
                canaries = MappingProxyType({e: c for e, c in old.canaries.items() if e in wanted})
                updated[server.name] = replace(old, config=server, canaries=canaries)
            else:
                updated[server.name] = ServerState(config=server)
        self._servers = updated

    def _update(self, name: str, **changes: object) -> None:
        old = self._servers.get(name)
        if old is None:
            return  # removed by a reload while its probe was in flight
        self._servers = {**self._servers, name: replace(old, **changes)}

    def record_poll(self, name: str, *, result: PollResult | None, reason: Reason | None, duration: float, now: float) -> None:
        old = self._servers.get(name)
        if old is None:
            return
        if reason is None:
            self._update(
                name, poll=result, poll_failure_reason=None, poll_duration_seconds=duration,
                last_poll_success_timestamp=now,
            )
        else:
            self._update(
                name,
                poll=None,
                poll_failure_reason=reason,
                poll_duration_seconds=duration,
                poll_failures=_bumped(old.poll_failures, reason),
            )

    def record_canary(
        self, name: str, endpoint: Endpoint, *, verdict: Verdict | None, reason: Reason | None, duration: float, now: float
    ) -> None:
        old = self._servers.get(name)
        if old is None:
            return
        previous = old.canaries.get(endpoint)
        if reason is None:
            state = CanaryState(duration_seconds=duration, last_result=verdict, last_success_timestamp=now)
            failures = old.canary_failures
        else:
            state = CanaryState(
                duration_seconds=duration,
                last_result=previous.last_result if previous else None,
                last_success_timestamp=previous.last_success_timestamp if previous else None,
                failure_reason=reason,
            )
            failures = _bumped(old.canary_failures, (endpoint, reason))
        canaries = dict(old.canaries)
        canaries[endpoint] = state
        self._update(name, canaries=MappingProxyType(canaries), canary_failures=failures)
