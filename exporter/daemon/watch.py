"""The watcher: the runner under the daemon's limits, starting the canaries that are due and logging trouble once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from ..core.peers import Reference
from ..core.runner import Measured, Runner
from ..core.state import Change, Fleet, ModelState
from ..core.verdict import Verdict
from ..endpoints import Endpoint
from ..probe.canary import Tally
from ..probe.http.fetch import Fetcher
from ..probe.llama import Props, Slots
from ..probe.logprobs import Logprobs
from ..probe.peerprobe import COPIES
from ..probe.probes import PLAIN, KnownSlots
from ..settings.schema import Settings
from ..settings.targets import ServerConfig
from .cadence import Round, canary_first, due, peers_due, slots_known
from .peering import PeerBoard
from .shard import phase

log = structlog.get_logger("specwatch")
_CANCELLED = {"poll": "poll_cancelled", "canary": "canary_cancelled", "peers": "peer_probe_cancelled"}
REMIND_SECONDS = 600.0
"""A failure that goes on is logged again this often; counters and gauges carry every occurrence."""
@dataclass
class _Streak:
    """A run of trouble on one server: logged when it starts, shows a reason it had not shown, ends, and every
    REMIND_SECONDS."""

    what: str
    since: float
    logged_at: float
    count: int = 1
    seen: set[str] = field(default_factory=set)
    """Every reason this run of trouble has shown."""


class Watcher(Runner):
    """Polls and canaries for a fleet; at most one poll per server and one canary round per model in flight."""

    policy: Settings
    """The daemon's policy is its settings: every key a probe reads, and the rest of the config."""

    def __init__(
        self,
        settings: Settings,
        fleet: Fleet,
        fetcher: Fetcher,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        references: Mapping[str, Reference] | None = None,
    ) -> None:
        super().__init__(fleet, fetcher, settings, clock=clock, monotonic=monotonic)
        self._set_limits(settings.max_concurrency)
        self._in_flight: set[tuple[str, ...]] = set()
        self._rounds: set[asyncio.Task[None]] = set()
        """The canary rounds the ticks started, in flight."""
        self._tasks: set[asyncio.Task[object]] = set()
        """Every tick, poll and canary in flight (the rounds among them), so that close() can end them."""
        self._closed = False
        self._streaks: dict[tuple[str, ...], _Streak] = {}
        self.peers = PeerBoard(fleet, monotonic, clock, max_gap=settings.poll_interval,
                               interval=settings.canary_interval, references=references or {},
                               uniform=settings.peer_uniform)
        self.peers.expect({s.config.name for s in fleet.snapshot()})

    @property
    def settings(self) -> Settings:
        return self.policy

    def _set_limits(self, concurrency: int) -> None:
        # Probes in flight release the semaphores they took; new ones queue on the new ones. Canaries may hold half
        # the slots at most: a burst of them (an exporter start, a fleet-wide restart) must never delay the polls.
        # Peer probes have a quarter of their own (one at least), apart from the slots polls and canaries share: a
        # burst of them (every member's first round) must never delay a canary or a poll. Only at max_concurrency 1
        # is there nothing to set apart, and the peer probe waits for the one slot as the others do.
        share = max(1, concurrency // 4) if concurrency > 1 else 0
        self._limit = asyncio.Semaphore(concurrency - share)
        self._peer_limit = asyncio.Semaphore(share) if share else self._limit
        self._canary_limit = asyncio.Semaphore(max(1, concurrency // 2))
        self._concurrency = concurrency

    @property
    def concurrency(self) -> int:
        """Probes allowed in flight at once (max_concurrency)."""
        return self._concurrency

    def apply(self, settings: Settings, servers: list[ServerConfig],
              references: Mapping[str, Reference] | None = None) -> None:
        """Adopt reloaded settings: every key takes effect from the next probe on."""
        if settings.max_concurrency != self.settings.max_concurrency:
            self._set_limits(settings.max_concurrency)
        self.fetcher.max_bytes = settings.max_response_bytes
        self.fetcher.forget()
        self.policy = settings
        before = {s.config.name for s in self.fleet.snapshot()}
        self.fleet.reconcile(servers, settings.canary_endpoints)
        names = {s.name for s in servers}
        self._streaks = {key: streak for key, streak in self._streaks.items() if key[1] in names}
        self.peers.configure(max_gap=settings.poll_interval, interval=settings.canary_interval,
                             references=self.peers.references if references is None else references,
                             uniform=settings.peer_uniform)
        self.peers.forget(before - names)
        self.peers.expect(names - before)
        for name in names:
            self.peers.touch(name)  # a peer_group may have changed

    async def close(self) -> None:
        """End the ticks, polls and canary rounds in flight (shutdown) and start none after: nothing is sent once it returns."""
        self._closed = True
        current = asyncio.current_task()
        while running := [task for task in (*self._tasks, *self._rounds) if task is not current]:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            self._tasks.difference_update(running)
            self._rounds.difference_update(running)

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """The current task counts as in flight until it ends: close() cancels it and waits for it."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            yield
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def _running(self, key: tuple[str, ...]) -> Iterator[None]:
        """A probe `_claim` let start, in flight until it ends; cancelled (shutdown), it records nothing more."""
        try:
            with self._tracked():
                yield
        except asyncio.CancelledError:
            log.debug(_CANCELLED[key[0]], server=key[1])  # shutdown: nothing to record, and nothing after it
            raise
        finally:
            self._in_flight.discard(key)

    @contextlib.asynccontextmanager
    async def _gate(self, *, canary: bool, peers: bool = False) -> AsyncIterator[None]:
        if peers:
            async with self._peer_limit:
                yield
            return
        async with self._canary_limit if canary else contextlib.nullcontext(), self._limit:
            yield

    async def tick(self, name: str) -> None:
        """The scheduled job of one server: poll it, then start the canary rounds that the poll made due."""
        if self._closed:
            return
        with self._tracked():
            await self.poll(name)
            await self.ask_meta(name)
            self.start_due_rounds(name)
            for other in self.peers.waiting() - {name}:
                self.start_due_rounds(other)
            self.peers.settle()

    async def ask_meta(self, name: str) -> None:
        """/v1/models' meta of the server's models, where their process was not asked yet (Runner.meta_once)."""
        state = self.fleet.get(name)
        if state is not None:
            await self.meta_once(state.config)

    def _meta_asked(self, server: ServerConfig, key: str, measured: Measured[dict[str, str]]) -> None:
        if measured.result is None:
            log.debug("model_meta_failed", server=server.name, reason=measured.reason.value if measured.reason else "",
                      detail=measured.detail)
        self.peers.touch(server.name)  # a poll that asked nothing was touched by _polled already

    def start_due_rounds(self, name: str) -> None:
        state = self.fleet.get(name)
        if state is None or self._closed:
            return
        now = self._clock()
        for key, model in state.models.items():
            found = due(model, now, interval=self.settings.canary_interval, tokens=self.settings.canary_tokens,
                        tokens_speculating=self.settings.canary_tokens_speculating,
                        poll_interval=self.settings.poll_interval)
            canarying = ("canary", name, key) in self._in_flight
            canary = found is not None and not canarying
            # The canary first: no question while one of its rounds is in flight, none before its first full round
            # in this process, and one due now goes ahead of the questions on the same connection.
            first = not canarying and canary_first(model, now, phase=self._phase(name, key))
            questions = peers_due(model, now, interval=self.settings.canary_interval,
                                  phase=self._round_phase(name, key)) if first and self.peers.compared(name, key) else None
            ask = bool(questions) and ("peers", name, key) not in self._in_flight
            if canary and ask:
                self._start(self._one_after_the_other(name, key, found, questions))  # type: ignore[arg-type]
            elif canary:
                self._start(self.canary(name, key, found))
            elif ask:
                self._start(self.peer_round(name, key, questions))  # type: ignore[arg-type]

    def _phase(self, name: str, key: str) -> float:
        """How long after its first full canary round a member's first peer round waits: its share of canary_interval."""
        return phase(f"{name}\0{key}", "peers") * self.settings.canary_interval

    def _round_phase(self, name: str, key: str) -> float:
        """How far into each round a member is asked: its share of the round, less a poll interval so that a poll
        always falls between its phase and the round's end."""
        span = max(0.0, self.settings.canary_interval - self.settings.poll_interval)
        return phase(f"{name}\0{key}", "peers") * span

    async def _one_after_the_other(self, name: str, key: str, rounds: Round, questions: tuple[int, ...]) -> None:
        """The canary round, then the peer probe: on the connection the canary left open, and never both at once."""
        await self.canary(name, key, rounds)
        await self.peer_round(name, key, questions)

    def _start(self, round_: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(round_)
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def poll(self, name: str) -> None:
        server = None if self._closed else self._claim(("poll", name))
        if server is None:
            return
        with self._running(("poll", name)):
            await self.poll_once(server)

    def _known_slots(self, server: ServerConfig) -> KnownSlots:
        state, now, max_age = self.fleet.get(server.name), self._clock(), self.settings.canary_interval

        def known(key: str, props: Props) -> tuple[bool, Slots | None]:
            return slots_known(state.models.get(key) if state is not None else None, props, now, max_age=max_age)

        return known

    def _polled(self, server: ServerConfig, measured: Measured[object], change: Change | None) -> None:
        name, duration = server.name, round(measured.duration, 4)
        if measured.reason is not None:
            self._trouble(("poll", name), "poll_failed", measured.reason.value, detail=measured.detail, server=name,
                          duration=duration)
        else:
            self._over(("poll", name), "poll_recovered", server=name)
            log.debug("poll_ok", server=name, duration=duration)
        _log_changes(name, change)
        self.peers.touch(name)

    async def canary(self, name: str, key: str | None = None, rounds: Round | None = None) -> None:
        """One canary round on one model (by default the server's configured or only one), every endpoint unless told."""
        state = self.fleet.get(name)
        key = (state.config.model or PLAIN) if key is None and state is not None else key
        if state is None or key is None or self._closed or self._claim(("canary", name, key)) is None:
            return
        with self._running(("canary", name, key)):
            model = state.models.get(key)
            if model is None:
                return
            plan = rounds or Round(model.endpoints, full=True, rotation=True)
            await self.round(state.config, key, plan.endpoints, full=plan.full)

    def _canaried(self, server: ServerConfig, key: str, endpoint: Endpoint, measured: Measured[Tally],
                  change: Change | None) -> None:
        name = server.name
        where = {"server": name, **({"model": key} if key else {}), "endpoint": endpoint.value}
        streak = ("canary", name, key, endpoint.value)
        tally = measured.result
        if tally is None:
            self._trouble(streak, "canary_failed", measured.reason.value if measured.reason else "", detail=measured.detail,
                          duration=round(measured.duration, 4), **where)
        else:
            self._over(streak, "canary_recovered", **where)
            log.debug("canary_ok", tokens=tally.tokens, fill_ins=tally.fill_ins, draft_n=tally.draft_n,
                      duration=round(measured.duration, 4), **where)
        _log_changes(name, change)
        self.peers.touch(name)
        self.peers.settle()

    async def peer_round(self, name: str, key: str, questions: tuple[int, ...]) -> None:
        """The peer probe's due rounds for one model of a server in a peer group of two or more."""
        state = self.fleet.get(name)
        if state is None or self._closed or self._claim(("peers", name, key)) is None:
            return
        with self._running(("peers", name, key)):
            model = state.models.get(key)
            if model is None or model.poll is None:
                return
            slots = model.poll.props.total_slots
            copies = COPIES if slots is None or slots > 1 else 1
            rounds = [(q, self.peers.prompt_for(name, key, q)) for q in questions]
            await self.ask_peers(state.config, key, rounds, copies=copies)

    def _peer_asked(self, server: ServerConfig, key: str, question: int, measured: Measured[Logprobs],
                    change: Change | None) -> None:
        where = {"server": server.name, **({"model": key} if key else {}), "question": question}
        streak = ("peers", server.name, key)
        if measured.result is None:
            self._trouble(streak, "peer_probe_failed", measured.reason.value if measured.reason else "",
                          detail=measured.detail, duration=round(measured.duration, 4), **where)
        else:
            self._over(streak, "peer_probe_recovered", **where)
        _log_changes(server.name, change)
        self.peers.touch(server.name)
        self.peers.settle()

    def _unloaded(self, server: ServerConfig, key: str, change: Change | None) -> None:
        _log_changes(server.name, change)

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
        """Log trouble when it starts or shows a reason it had not shown yet, then only every REMIND_SECONDS.

        A server that goes back and forth between reasons it already showed is not logged at every change: one whose
        link is down fails as a timeout, then as unreachable once its neighbour entry failed, then as a timeout again.
        """
        now = self._monotonic()
        streak = self._streaks.get(key)
        if streak is None:
            self._streaks[key] = _Streak(what, now, now, seen={what})
            log.warning(event, reason=what, **fields)
            return
        streak.count += 1
        previous, streak.what = streak.what, what
        if what not in streak.seen:
            streak.seen.add(what)
            streak.logged_at = now
            log.warning(event, reason=what, previous=previous, **fields)
        elif now - streak.logged_at >= REMIND_SECONDS:
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
