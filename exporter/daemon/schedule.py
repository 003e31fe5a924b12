"""Per-server poll and canary jobs on APScheduler, phase-spread so a large fleet is not probed in bursts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.interval import IntervalTrigger

from exporter.daemon.shard import phase
from exporter.daemon.watch import Watcher
from exporter.settings import ServerConfig

KINDS = ("poll", "canary")


def _job_id(kind: str, name: str) -> str:
    return f"{kind}:{name}"


class Schedule:
    """Keeps one poll and one canary job per watched server, in step with the watcher's config."""

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
        """Add jobs for new servers, drop those of removed ones, re-time all when intervals changed."""
        settings = self.watcher.settings
        intervals = {"poll": settings.poll_interval, "canary": settings.canary_interval}
        # A small fleet is probed at once; a fleet larger than the concurrency limit is spread over
        # the interval so requests never queue behind each other.
        spread = len(servers) > settings.max_concurrency
        wanted = {_job_id(kind, s.name): (kind, s.name) for s in servers for kind in KINDS}
        for job in self.scheduler.get_jobs():
            if job.id not in wanted:
                job.remove()
        now = datetime.now(UTC)
        for job_id, (kind, name) in wanted.items():
            interval = intervals[kind]
            existing = self.scheduler.get_job(job_id)
            if existing is not None and existing.trigger.interval == timedelta(seconds=interval):
                continue
            offset = phase(name, kind) * interval if spread else 0.0
            self.scheduler.add_job(
                getattr(self.watcher, kind),
                IntervalTrigger(seconds=interval, start_date=now + timedelta(seconds=offset), timezone=UTC),
                args=[name],
                id=job_id,
                name=job_id,
                replace_existing=True,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(interval)),
                next_run_time=now + timedelta(seconds=offset),
            )
