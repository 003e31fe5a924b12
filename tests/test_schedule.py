"""One job per server: run at once for a small fleet, spread over the interval for a large one, in step with reloads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from specwatch.daemon.schedule import Schedule
from specwatch.settings.schema import Settings


def _servers(n: int) -> list[dict]:
    return [{"name": f"s{i}", "url": f"http://s{i}:8080"} for i in range(n)]


def _schedule(make_watcher, n: int, **kw: object) -> Schedule:
    watcher = make_watcher({}, servers=_servers(n), **kw)
    scheduler = AsyncIOScheduler(timezone=UTC)
    scheduler.start(paused=True)
    schedule = Schedule(watcher, scheduler)
    schedule.sync(list(watcher.settings.servers))
    return schedule


def _offsets(schedule: Schedule) -> list[float]:
    now = datetime.now(UTC)
    return [(j.next_run_time - now).total_seconds() for j in schedule.scheduler.get_jobs()]


async def test_small_fleet_runs_at_once(make_watcher) -> None:
    schedule = _schedule(make_watcher, 3)
    assert len(schedule.scheduler.get_jobs()) == 3
    assert all(offset <= 0.5 for offset in _offsets(schedule))
    job = schedule.scheduler.get_job("watch:s1")
    assert job.trigger.interval == timedelta(seconds=15) and job.func == schedule.watcher.tick


async def test_large_fleet_is_spread_over_the_interval(make_watcher) -> None:
    schedule = _schedule(make_watcher, 400, max_concurrency=16)
    offsets = sorted(_offsets(schedule))
    assert offsets[0] < 1 and offsets[-1] > 14 and offsets[-1] <= 15
    # No second of the poll interval holds more than a small share of the fleet.
    per_second = [sum(1 for o in offsets if s <= o < s + 1) for s in range(15)]
    assert max(per_second) <= 45


async def test_reload_adds_removes_and_retimes_jobs(make_watcher) -> None:
    schedule = _schedule(make_watcher, 3)
    settings = Settings(servers=[*_servers(2), {"name": "new", "url": "http://new:1"}], poll_interval=30)
    schedule.watcher.apply(settings, list(settings.servers))
    schedule.sync(list(settings.servers))
    ids = sorted(j.id for j in schedule.scheduler.get_jobs())
    assert ids == ["watch:new", "watch:s0", "watch:s1"]
    assert schedule.scheduler.get_job("watch:s0").trigger.interval == timedelta(seconds=30)
