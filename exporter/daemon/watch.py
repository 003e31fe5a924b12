"""The watcher: runs probes for each server, times them in one place and records the outcome."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from exporter.daemon.state import Fleet, ServerState
from exporter.probe import probes
from exporter.probe.fetch import Fetcher
from exporter.reasons import ProbeFailure, Reason
from exporter.settings import ServerConfig, Settings
from exporter.verdict import Verdict

log = structlog.get_logger("specwatch")
T = TypeVar("T")


class Watcher:
    """Polls and canaries for a fleet; at most one poll and one canary per server in flight."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        fetcher: Fetcher,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.fleet = fleet
        self.fetcher = fetcher
        self._clock = clock
        self._monotonic = monotonic
        self._limit = asyncio.Semaphore(settings.max_concurrency)
        self._concurrency = settings.max_concurrency
        self._in_flight: set[tuple[str, str]] = set()

    @property
    def concurrency(self) -> int:
        """Probes allowed in flight at once (max_concurrency)."""
        return self._concurrency

    def apply(self, settings: Settings, servers: list[ServerConfig]) -> None:
        """Adopt reloaded settings: every key takes effect from the next probe on."""
        if settings.max_concurrency != self.settings.max_concurrency:
            # Probes in flight release the semaphore they took; new ones queue on the new one.
            self._limit = asyncio.Semaphore(settings.max_concurrency)
            self._concurrency = settings.max_concurrency
        self.fetcher.max_bytes = settings.max_response_bytes
        self.settings = settings
        self.fleet.reconcile(servers, settings.canary_endpoints)

    async def _measure(self, run: Callable[[], Awaitable[T]], timeout: float) -> tuple[T | None, Reason | None, str, float]:
        async with self._limit:
            started = self._monotonic()
            try:
                async with asyncio.timeout(timeout):
                    result = await run()
                return result, None, "", self._monotonic() - started
            except ProbeFailure as failure:
                return None, failure.reason, failure.detail, self._monotonic() - started
            except TimeoutError:
                return None, Reason.TIMEOUT, f"no answer within {timeout:g}s", self._monotonic() - started
            except Exception as err:  # noqa: BLE001 - one server's surprise must never stop the others
                return None, Reason.INTERNAL, f"{err.__class__.__name__}: {str(err)[:200]}", self._monotonic() - started

    async def poll(self, name: str) -> None:
        server = self._claim(name, "poll")
        if server is None:
            return
        try:
            timeout = self.settings.timeout_for(server, canary=False)
            result, reason, detail, duration = await self._measure(
                lambda: probes.poll(self.fetcher, server, timeout=timeout), timeout
            )
            change = self.fleet.record_poll(
                name, result=result, reason=reason, detail=detail, duration=duration, now=self._clock()
            )
            if reason is not None:
                log.warning("poll_failed", server=name, reason=reason.value, detail=detail, duration=round(duration, 4))
            else:
                log.debug("poll_ok", server=name, duration=round(duration, 4))
            _log_verdict(name, change)
        except asyncio.CancelledError:
            log.debug("poll_cancelled", server=name)  # shutdown or reload: nothing to record
        finally:
            self._in_flight.discard((name, "poll"))

    async def canary(self, name: str) -> None:
        server = self._claim(name, "canary")
        if server is None:
            return
        try:
            timeout = self.settings.timeout_for(server, canary=True)
            for endpoint in self.settings.canary_endpoints:
                tally, reason, detail, duration = await self._measure(
                    lambda endpoint=endpoint: probes.canary(
                        self.fetcher, server, endpoint, tokens=self.settings.canary_tokens, timeout=timeout
                    ),
                    timeout,
                )
                change = self.fleet.record_canary(
                    name, endpoint, tally=tally, reason=reason, detail=detail, duration=duration, now=self._clock()
                )
                if tally is None:
                    log.warning(
                        "canary_failed", server=name, endpoint=endpoint.value, reason=reason and reason.value, detail=detail,
                        duration=round(duration, 4),
                    )
                else:
                    log.debug("canary_ok", server=name, endpoint=endpoint.value, tokens=tally.tokens, fill_ins=tally.fill_ins,
                              draft_n=tally.draft_n, duration=round(duration, 4))
                _log_verdict(name, change)
        except asyncio.CancelledError:
            log.debug("canary_cancelled", server=name)  # shutdown or reload: nothing to record
        finally:
            self._in_flight.discard((name, "canary"))

    def _claim(self, name: str, kind: str) -> ServerConfig | None:
        """The server's config if no `kind` probe is in flight for it; a slow server never piles up probes."""
        state = self.fleet.get(name)
        if state is None:
            return None
        if (name, kind) in self._in_flight:
            log.info(f"{kind}_skipped", server=name, why="the previous one is still running")
            return None
        self._in_flight.add((name, kind))
        return state.config


def _log_verdict(name: str, change: tuple[ServerState, ServerState] | None) -> None:
    """One line when a server's verdict changes, not one per probe: a speculating server would repeat it forever."""
    if change is None:
        return
    old, new = change[0].decision, change[1].decision
    if old.verdict is new.verdict:
        return
    level = log.warning if new.verdict is Verdict.FILL_INS else log.info
    level("verdict_changed", server=name, verdict=new.verdict.value, previous=old.verdict.value, summary=new.summary)
