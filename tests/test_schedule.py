"""One timer for the fleet: a small fleet polled at once, a large one spread over the interval, in step with reloads."""

from __future__ import annotations

import asyncio
import itertools

from specwatch.daemon import schedule as schedule_module
from specwatch.daemon.schedule import Schedule
from specwatch.settings.schema import Settings


def _servers(n: int) -> list[dict]:
    return [{"name": f"s{i}", "url": f"http://s{i}:8080"} for i in range(n)]


def _schedule(make_watcher, n: int, **kw: object) -> Schedule:
    watcher = make_watcher({}, servers=_servers(n), **kw)
    schedule = Schedule(watcher)
    schedule.sync(list(watcher.settings.servers))
    return schedule


def _offsets(schedule: Schedule) -> list[float]:
    return list(schedule.next_polls().values())


async def test_small_fleet_runs_at_once(make_watcher) -> None:
    schedule = _schedule(make_watcher, 3)
    assert len(schedule) == 3
    assert all(offset <= 0.5 for offset in _offsets(schedule))
    assert schedule.interval == 15


async def test_large_fleet_is_spread_over_the_interval(make_watcher) -> None:
    schedule = _schedule(make_watcher, 400, max_concurrency=16)
    offsets = sorted(_offsets(schedule))
    assert offsets[0] < 1 and offsets[-1] > 14 and offsets[-1] <= 15
    # No second of the poll interval holds more than a small share of the fleet.
    per_second = [sum(1 for o in offsets if s <= o < s + 1) for s in range(15)]
    assert max(per_second) <= 45


async def test_reload_adds_removes_and_retimes_servers(make_watcher) -> None:
    schedule = _schedule(make_watcher, 3)
    settings = Settings(servers=[*_servers(2), {"name": "new", "url": "http://new:1"}], poll_interval=30)
    schedule.watcher.apply(settings, list(settings.servers))
    schedule.sync(list(settings.servers))
    assert sorted(schedule.next_polls()) == ["new", "s0", "s1"]
    assert schedule.interval == 30


async def test_each_server_is_polled_every_interval_in_batches(make_watcher, monkeypatch) -> None:
    monkeypatch.setattr(schedule_module, "BATCH_SECONDS", 0.05)
    watcher = make_watcher({}, servers=_servers(40), max_concurrency=4, poll_interval=1)
    ticks: list[tuple[str, float]] = []
    loop = asyncio.get_running_loop()

    async def tick(name: str) -> None:
        ticks.append((name, loop.time()))

    async def lateness(every: float = 0.01) -> None:
        # How late the loop itself wakes: a starved worker delays a poll as much, which is no fault of the schedule's.
        while True:
            due = loop.time() + every
            await asyncio.sleep(every)
            late[0] = max(late[0], loop.time() - due)

    watcher.tick = tick
    late = [0.0]
    watching = asyncio.create_task(lateness())
    schedule = Schedule(watcher)
    started = loop.time()
    schedule.start(list(watcher.settings.servers))
    try:
        await asyncio.sleep(2.5)
        schedule.pause()
        # Polls the last batch started before the pause take their first step on the loop's next turn: let them.
        await asyncio.sleep(0)
        paused = len(ticks)
        await asyncio.sleep(0.5)
        assert len(ticks) == paused, "a paused schedule starts no poll"
        schedule.resume()
        await asyncio.sleep(0.1)
    finally:
        schedule.shutdown()
        watching.cancel()
    by_server: dict[str, list[float]] = {}
    for name, at in ticks[:paused]:
        by_server.setdefault(name, []).append(at - started)
    assert sorted(by_server) == sorted(f"s{i}" for i in range(40))
    for name, times in by_server.items():
        assert len(times) in (2, 3), (name, times)
        gaps = [b - a for a, b in itertools.pairwise(times)]
        # On its phase, a batch early at most, or as late as the loop was.
        assert all(0.9 - late[0] <= gap <= 1.1 + late[0] for gap in gaps), (name, times, late[0])
    # Spread over the interval, started in batches: far fewer start times than polls.
    starts = {round(at, 3) for _, at in ticks}
    assert len(starts) < len(ticks) / 2
    assert len(schedule) == 40
