"""The watcher: polls each server, canaries the models that are due, times every probe in one place and records it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from exporter.daemon.cadence import Round, due
from exporter.daemon.state import Change, Fleet, ModelState
from exporter.probe import probes
from exporter.probe.fetch import Fetcher
from exporter.probe.probes import PLAIN
from exporter.reasons import ProbeFailure, Reason
from exporter.settings.schema import ServerConfig, Settings
from exporter.verdict import Verdict

log = structlog.get_logger("specwatch")
T = TypeVar("T")
REMIND_SECONDS = 600.0
"""A failure that goes on is logged again this often; counters and gauges carry every occurrence."""


@dataclass
class _Streak:
    """A run of one kind of trouble on one server: logged when it starts, changes, ends, and every REMIND_SECONDS."""

    what: str
    since: float
    logged_at: float
    count: int = 1


class Watcher:
    """Polls and canaries for a fleet; at most one poll per server and one canary round per model in flight."""

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
        self._set_limits(settings.max_concurrency)
        self._in_flight: set[tuple[str, ...]] = set()
        self._rounds: set[asyncio.Task[None]] = set()
        self._streaks: dict[tuple[str, ...], _Streak] = {}

    def _set_limits(self, concurrency: int) -> None:
        # Probes in flight release the semaphores they took; new ones queue on the new ones. Canaries may hold half
        # the slots at most: a burst of them (an exporter start, a fleet-wide restart) must never delay the polls.
        self._limit = asyncio.Semaphore(concurrency)
        self._canary_limit = asyncio.Semaphore(max(1, concurrency // 2))
        self._concurrency = concurrency

    @property
    def concurrency(self) -> int:
        """Probes allowed in flight at once (max_concurrency)."""
        return self._concurrency

    def apply(self, settings: Settings, servers: list[ServerConfig]) -> None:
        """Adopt reloaded settings: every key takes effect from the next probe on."""
        if settings.max_concurrency != self.settings.max_concurrency:
            self._set_limits(settings.max_concurrency)
        self.fetcher.max_bytes = settings.max_response_bytes
        self.settings = settings
        self.fleet.reconcile(servers, settings.canary_endpoints)
        names = {s.name for s in servers}
        self._streaks = {key: streak for key, streak in self._streaks.items() if key[1] in names}

    async def close(self) -> None:
        """Cancel the canary rounds in flight (shutdown)."""
        rounds = list(self._rounds)
        for task in rounds:
            task.cancel()
        await asyncio.gather(*rounds, return_exceptions=True)

    async def _measure(
        self, run: Callable[[], Awaitable[T]], timeout: float, *, canary: bool = False
    ) -> tuple[T | None, Reason | None, str, float]:
        async with self._canary_limit if canary else contextlib.nullcontext(), self._limit:
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

    async def tick(self, name: str) -> None:
        """The scheduled job of one server: poll it, then start the canary rounds that the poll made due."""
        await self.poll(name)
        self.start_due_rounds(name)

    def start_due_rounds(self, name: str) -> None:
        state = self.fleet.get(name)
        if state is None:
            return
        now = self._clock()
        for key, model in state.models.items():
            found = due(model, now, interval=self.settings.canary_interval, tokens=self.settings.canary_tokens,
                        tokens_speculating=self.settings.canary_tokens_speculating)
            if found is not None and ("canary", name, key) not in self._in_flight:
                task = asyncio.ensure_future(self.canary(name, key, found))
                self._rounds.add(task)
                task.add_done_callback(self._rounds.discard)

    async def poll(self, name: str) -> None:
        server = self._claim(("poll", name))
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
                self._trouble(("poll", name), "poll_failed", reason.value, detail=detail, server=name,
                              duration=round(duration, 4))
            else:
                self._over(("poll", name), "poll_recovered", server=name)
                log.debug("poll_ok", server=name, duration=round(duration, 4))
            _log_changes(name, change)
        except asyncio.CancelledError:
            log.debug("poll_cancelled", server=name)  # shutdown or reload: nothing to record
        finally:
            self._in_flight.discard(("poll", name))

    async def canary(self, name: str, key: str | None = None, rounds: Round | None = None) -> None:
        """One canary round on one model (by default the server's configured or only one), every endpoint unless told."""
        state = self.fleet.get(name)
        key = (state.config.model or PLAIN) if key is None and state is not None else key
        if state is None or key is None or self._claim(("canary", name, key)) is None:
            return
        try:
            model = state.models.get(key)
            if model is None:
                return
            plan = rounds or Round(model.endpoints, full=True, rotation=True)
            self.fleet.start_round(name, key, full=plan.full, now=self._clock())
            # A full round that proves nothing on a speculating model runs again: n-gram speculation learns from the
            # first pass and drafts on the second (specwatch check does the same).
            for _ in range(2 if plan.full else 1):
                if not await self._canary_pass(state.config, key, plan):
                    return
                current = self.fleet.get(name)
                model_now = current.models.get(key) if current is not None else None
                if model_now is None or model_now.decision.verdict is not Verdict.UNPROVEN:
                    return
        except asyncio.CancelledError:
            log.debug("canary_cancelled", server=name)  # shutdown or reload: nothing to record
        finally:
            self._in_flight.discard(("canary", name, key))

    async def _canary_pass(self, server: ServerConfig, key: str, plan: Round) -> bool:
        """Canary each endpoint of `plan` in turn; False when the model turned out not to be loaded."""
        name = server.name
        state = self.fleet.get(name)
        model = state.models.get(key) if state is not None else None
        tokens = self.settings.canary_tokens_speculating if model is None or model.suspect else self.settings.canary_tokens
        timeout = self.settings.timeout_for(server, canary=True)
        for endpoint in plan.endpoints:
            tally, reason, detail, duration = await self._measure(
                lambda endpoint=endpoint: probes.canary(
                    self.fetcher, server, endpoint, tokens=tokens, timeout=timeout, model=key or None
                ),
                timeout,
                canary=True,
            )
            where = {"server": name, **({"model": key} if key else {}), "endpoint": endpoint.value}
            if reason is Reason.NOT_LOADED:
                # The router unloaded it since the poll: a state of the model, not a failure of the canary.
                _log_changes(name, self.fleet.record_unloaded(name, key))
                return False
            change = self.fleet.record_canary(
                name, key, endpoint, tally=tally, reason=reason, detail=detail, duration=duration, now=self._clock(),
                requested=tokens,
            )
            streak = ("canary", name, key, endpoint.value)
            if tally is None:
                self._trouble(streak, "canary_failed", reason.value if reason else "", detail=detail,
                              duration=round(duration, 4), **where)
            else:
                self._over(streak, "canary_recovered", **where)
                log.debug("canary_ok", tokens=tally.tokens, fill_ins=tally.fill_ins, draft_n=tally.draft_n,
                          duration=round(duration, 4), **where)
            _log_changes(name, change)
        return True

    def _claim(self, key: tuple[str, ...]) -> ServerConfig | None:
        """The server's config if no such probe is in flight for it; a slow server never piles up probes."""
        state = self.fleet.get(key[1])
        if state is None:
            return None
        busy = (f"{key[0]}_busy", *key[1:])
        if key in self._in_flight:
            self._trouble(busy, f"{key[0]}_skipped", "the previous one is still running", server=key[1])
            return None
        self._over(busy, f"{key[0]}_resumed", server=key[1])
        self._in_flight.add(key)
        return state.config

    def _trouble(self, key: tuple[str, ...], event: str, what: str, **fields: Any) -> None:
        """Log trouble when it starts or changes, then only every REMIND_SECONDS while it goes on."""
        now = self._monotonic()
        streak = self._streaks.get(key)
        if streak is None or streak.what != what:
            if streak is not None:
                fields["previous"] = streak.what
            self._streaks[key] = _Streak(what, now if streak is None else streak.since, now)
            log.warning(event, reason=what, **fields)
            return
        streak.count += 1
        if now - streak.logged_at >= REMIND_SECONDS:
            streak.logged_at = now
            log.warning(event, reason=what, still_for_seconds=round(now - streak.since), times=streak.count, **fields)
        else:
            log.debug(event, reason=what, **fields)

    def _over(self, key: tuple[str, ...], event: str, **fields: Any) -> None:
        streak = self._streaks.pop(key, None)
        if streak is not None:
            log.info(event, after_seconds=round(self._monotonic() - streak.since, 1), times=streak.count,
                     last_reason=streak.what, **fields)


def _log_changes(name: str, change: Change | None) -> None:
    """One line when a model's verdict or status changes, not one per probe: a speculating server would repeat it."""
    if change is None:
        return
    old, new = change
    for key, model in new.models.items():
        before: ModelState | None = old.models.get(key)
        where = {"server": name, **({"model": key} if key else {})}
        if new.router and (before is None or before.status != model.status):
            log.info("model_status", status=model.status, previous=before.status if before else None, **where)
        previous = before.decision.verdict if before is not None else Verdict.UNCHECKED
        verdict = model.decision.verdict
        # A model is unchecked until its first canary, whether configured or found on a router: no line for that.
        if previous is not verdict:
            level = log.warning if verdict is Verdict.FILL_INS else log.info
            level("verdict_changed", verdict=verdict.value, previous=previous.value,
                  summary=model.decision.summary, **where)
