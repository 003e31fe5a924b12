"""One APScheduler job for the whole fleet: each server polled every poll_interval at its own phase, in small batches."""

from __future__ import annotations

import asyncio
import heapq
import math
from datetime import UTC

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from ..settings.targets import ServerConfig
from .shard import phase
from .watch import Watcher

log = structlog.get_logger("specwatch")

BATCH_SECONDS = 1.0
"""The fleet's one job runs this often and starts every poll due before its next run: one wake-up of the event loop
starts them all, where a job per server woke it (and went through APScheduler's job store and executor) for each; at
1,000 servers a tenth of the daemon's CPU went to that. Polls started together also share the loop's later wake-ups
(their connects and answers come back from one epoll wait): batches a second apart cost a quarter less CPU than a
quarter second apart, and a timer per poll half as much again as those (docs/operating.md, Fleet scale). A poll
starts at most this much before its phase; at 1,000 servers and 15 s a batch is about 67 polls."""


class Schedule:
    """Keeps each watched server's next poll, in step with the watcher's config, and starts the polls that are due.

    Each poll is the watcher's tick: it polls, then starts the canaries the poll made due (see cadence.py), so a
    server that restarts or changes gets its canary within one poll, and a server that is down gets none.
    """

    def __init__(self, watcher: Watcher, scheduler: AsyncIOScheduler | None = None) -> None:
        self.watcher = watcher
        self.scheduler = scheduler or AsyncIOScheduler(timezone=UTC)
        self.interval = watcher.settings.poll_interval
        self._next: dict[str, float] = {}
        """Each server's next poll, in the event loop's time."""
        self._heap: list[tuple[float, str]] = []
        """(time, server) of every next poll; entries that no longer match `_next` are dropped when they come up."""
        self._ticks: set[asyncio.Task[None]] = set()
        self._paused = False

    def start(self, servers: list[ServerConfig]) -> None:
        self.sync(servers)
        self.scheduler.add_job(
            self._batch, IntervalTrigger(seconds=BATCH_SECONDS, timezone=UTC), id="specwatch:polls",
            name="specwatch:polls", max_instances=1, coalesce=True, misfire_grace_time=None,
        )
        self.scheduler.start()
        self._batch_now()

    def shutdown(self) -> None:
        """Start no more polls; those in flight are the watcher's to end (Watcher.close)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def pause(self) -> None:
        """Start no polls until resume(); the ones due meanwhile start at the resume."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._batch_now()

    def next_polls(self) -> dict[str, float]:
        """Seconds until each server's next poll (negative when it is due)."""
        now = asyncio.get_running_loop().time()
        return {name: at - now for name, at in self._next.items()}

    def sync(self, servers: list[ServerConfig]) -> None:
        """Add new servers, drop removed ones, re-time all when the interval changed."""
        settings = self.watcher.settings
        interval = settings.poll_interval
        now = asyncio.get_running_loop().time()
        # A small fleet is probed at once; a fleet larger than the concurrency limit is spread over
        # the interval so requests never queue behind each other.
        spread = len(servers) > settings.max_concurrency
        retime = interval != self.interval
        self.interval = interval
        wanted = {s.name for s in servers}
        self._next = {name: at for name, at in self._next.items() if name in wanted and not retime}
        for name in wanted - self._next.keys():
            at = self._next[name] = now + (phase(name, "poll") * interval if spread else 0.0)
            heapq.heappush(self._heap, (at, name))
        if len(self._heap) > 2 * len(self._next) + 64:  # removed servers' entries: keep the heap to the fleet's size
            self._heap = [(at, name) for name, at in self._next.items()]
            heapq.heapify(self._heap)
        self._batch_now()

    async def _batch(self) -> None:
        """The fleet's job: start the polls due before its next run."""
        self._batch_now()

    def _batch_now(self) -> None:
        # A server added or resumed is polled at once, not at the job's next run.
        if self.scheduler.running and not self._paused:
            self._start_due(asyncio.get_running_loop().time() + BATCH_SECONDS)

    def _start_due(self, until: float) -> None:
        """Start every poll due before `until`, and set each server's next one an interval after it was due."""
        heap, interval, now = self._heap, self.interval, asyncio.get_running_loop().time()
        while heap and heap[0][0] <= until:
            at, name = heapq.heappop(heap)
            if self._next.get(name) != at:
                continue  # removed or re-timed since
            task = asyncio.ensure_future(self.watcher.tick(name))
            self._ticks.add(task)
            task.add_done_callback(self._ended)
            # A poll that starts late (a busy loop, a pause) keeps its phase: the next one is the first due after now.
            ahead = at + interval * max(1, math.ceil((now - at) / interval)) if interval > 0 else now + 1.0
            self._next[name] = ahead
            heapq.heappush(heap, (ahead, name))

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._ticks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            log.error("poll_job_failed", error=f"{error.__class__.__name__}: {str(error)[:200]}")

    def __len__(self) -> int:
        """Servers with a next poll: the watched ones."""
        return len(self._next)
