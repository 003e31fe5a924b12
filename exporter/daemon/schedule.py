"""One APScheduler job per watched server, phase-spread so a large fleet is not probed in bursts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from ..settings.schema import ServerConfig
from .shard import phase
from .watch import Watcher


def _job_id(name: str) -> str:
    return f"watch:{name}"


class Schedule:
    """Keeps one job per watched server, in step with the watcher's config.

    The job polls every poll_interval and starts the canaries the poll makes due (see cadence.py), so a server that
    restarts or changes gets its canary within one poll, and a server that is down gets none.
    """

    def __init__(self, watcher: Watcher, scheduler: AsyncIOScheduler | None = None) -> None:
        self.watcher = watcher
        self.scheduler = scheduler or AsyncIOScheduler(timezone=UTC)

    def start(self, servers: list[ServerConfig]) -> None:
        self.sync(servers)
        self.scheduler.start()

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def sync(self, servers: list[ServerConfig]) -> None:
        """Add jobs for new servers, drop those of removed ones, re-time all when the interval changed."""
        settings = self.watcher.settings
        interval = settings.poll_interval
        # A small fleet is probed at once; a fleet larger than the concurrency limit is spread over
        # the interval so requests never queue behind each other.
        spread = len(servers) > settings.max_concurrency
        wanted = {_job_id(s.name): s.name for s in servers}
        for job in self.scheduler.get_jobs():
            if job.id not in wanted:
                job.remove()
        now = datetime.now(UTC)
        for job_id, name in wanted.items():
            existing = self.scheduler.get_job(job_id)
            if existing is not None and existing.trigger.interval == timedelta(seconds=interval):
                continue
            offset = phase(name, "poll") * interval if spread else 0.0
            self.scheduler.add_job(
                self.watcher.tick,
                IntervalTrigger(seconds=interval, start_date=now + timedelta(seconds=offset), timezone=UTC),
                args=[name],
                id=job_id,
                name=job_id,
                replace_existing=True,
                # The watcher skips (and logs once) a poll whose previous one still runs; APScheduler need not warn.
                max_instances=2,
                coalesce=True,
                misfire_grace_time=max(1, int(interval)),
                next_run_time=now + timedelta(seconds=offset),
            )
