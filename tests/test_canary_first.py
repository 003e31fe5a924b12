"""The canary first (issue 37): no peer probe before a model's first full canary round has ended or while a canary of it
is in flight, the members' first peer rounds spread over one canary_interval, and a share of the slots of their own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from specwatch.core.state import Fleet, ModelState
from specwatch.daemon.cadence import canary_first
from specwatch.daemon.shard import phase
from specwatch.daemon.watch import Watcher
from specwatch.endpoints import Endpoint
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.llama import Props, Slots
from specwatch.probe.peerprobe import PATH, prompts
from specwatch.probe.probes import ModelPoll, PollResult
from specwatch.settings.schema import Settings
from tests.conftest import FakeClock
from tests.support.fakes import FakeFleet
from tests.support.faults import Held
from tests.support.wire import FakeLlama, Request

CANARY = "/v1/chat/completions"
"""The one canary endpoint these tests ask (chat): the peer probe asks PATH, so a fault on one holds only that probe."""
Build = Callable[..., tuple[Watcher, FakeFleet]]


@pytest.fixture
async def watched(clock: FakeClock) -> AsyncIterator[Build]:
    """A watcher over look-alikes that all serve one model (one peer group), and the fake fleet behind it."""
    watchers: list[Watcher] = []

    def build(names: list[str], **kw: object) -> tuple[Watcher, FakeFleet]:
        fleet = FakeFleet({name: FakeLlama.plain(tokens=None) for name in names})
        settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080"} for n in names], canary_endpoints=["chat"],
                            **kw)
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(fleet.client(), settings.max_response_bytes), clock=clock)
        watchers.append(watcher)
        return watcher, fleet

    yield build
    for watcher in watchers:
        await watcher.close()
        await watcher.fetcher.client.aclose()


def _is_peer_probe(request: Request) -> bool:
    return request.path == PATH and request.json().get("prompt") in set(prompts())


def _kinds(fleet: FakeFleet, name: str) -> list[str]:
    """What `name` was asked, in the order the requests arrived: "canary" or "peers" (polls left out)."""
    return ["peers" if _is_peer_probe(r) else "canary" for r in list(fleet.servers[name].seen)
            if r.path == CANARY or _is_peer_probe(r)]


async def _tick_all(watcher: Watcher) -> None:
    for state in watcher.fleet.snapshot():
        await watcher.tick(state.config.name)


async def _drain(watcher: Watcher) -> None:
    while watcher._rounds:
        await asyncio.gather(*watcher._rounds)


async def _until(what: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not what():
            await asyncio.sleep(0.01)


async def _drain_except_held(watcher: Watcher) -> None:
    """Wait for every round in flight but the held one (a's canary), which stays in flight."""
    await asyncio.sleep(0.5)
    assert len([task for task in watcher._rounds if not task.done()]) <= 1


async def test_no_peer_probe_reaches_a_server_before_its_first_full_canary_round_has_ended(watched: Build,
                                                                                          clock: FakeClock) -> None:
    watcher, fleet = watched(["a", "b"])
    release = threading.Event()
    fleet.servers["a"].play(Held(release), CANARY)  # a's first canary hangs, as on a loaded one-slot server
    await _tick_all(watcher)  # b, polled after a, makes a a member of a group of two
    await _until(lambda: fleet.servers["a"].count(CANARY) == 1)
    await _drain_except_held(watcher)
    for _ in range(2):  # polls and intervals go by while a's canary is still in flight
        clock.advance(60)
        await _tick_all(watcher)
        await _drain_except_held(watcher)
    assert _kinds(fleet, "a") == ["canary"]
    assert "peers" in _kinds(fleet, "b")  # b's canaries were done: its questions were asked
    release.set()
    await _drain(watcher)
    clock.advance(60)
    await _tick_all(watcher)
    await _drain(watcher)
    kinds = _kinds(fleet, "a")
    assert kinds[0] == "canary" and kinds.count("peers") >= 1, kinds
    assert kinds.index("peers") > kinds.index("canary")


async def test_a_peer_round_does_not_start_beside_a_canary_in_flight(watched: Build, clock: FakeClock) -> None:
    watcher, fleet = watched(["a", "b"], poll_interval=15, canary_interval=60)
    for _ in range(3):  # canaries and peer probes settled into their cadence
        clock.advance(60)
        await _tick_all(watcher)
        await _drain(watcher)
    release = threading.Event()
    fleet.servers["a"].play(Held(release), CANARY)
    before = _kinds(fleet, "a").count("peers")
    clock.advance(60)  # a's rotation canary and its next question both due: the canary goes first and hangs
    await watcher.tick("a")
    await _until(lambda: _kinds(fleet, "a")[-1] == "canary")
    for _ in range(8):  # more polls, on both servers, while the canary is in flight: no question is asked of a
        clock.advance(15)
        await _tick_all(watcher)
        await asyncio.sleep(0.05)
        assert _kinds(fleet, "a").count("peers") == before
    release.set()
    await _drain(watcher)
    for _ in range(4):  # the polls of the next round: a is asked at its phase of it
        clock.advance(15)
        await _tick_all(watcher)
        await _drain(watcher)
    assert _kinds(fleet, "a").count("peers") > before


async def test_the_members_first_peer_rounds_are_spread_over_one_canary_interval(watched: Build,
                                                                               clock: FakeClock) -> None:
    names = [f"m{i:02d}" for i in range(12)]
    watcher, _ = watched(names, poll_interval=15, canary_interval=60)
    start = clock()
    first: dict[str, float] = {}
    for _ in range(8):  # two canary_intervals of polls
        await _tick_all(watcher)
        await _drain(watcher)
        for name in names:
            asked = watcher.fleet.get(name).model().peer_answers.asked_at
            if asked is not None:
                first.setdefault(name, asked)
        clock.advance(15)
    assert set(first) == set(names)
    offsets = sorted(at - start for at in first.values())
    # None with the first canaries (at 0), each within one interval after them, and no poll asks all at once.
    assert 0 < offsets[0] and offsets[-1] <= 60
    assert len(set(offsets)) >= 3 and max(offsets.count(at) for at in offsets) <= len(names) // 2, offsets
    for name, at in first.items():  # each member at its own phase, the first poll at or after it
        assert 0 <= at - start - phase(f"{name}\0", "peers") * 60 < 15


@pytest.mark.parametrize("concurrency", [2, 4, 8])
async def test_peer_probes_in_flight_never_take_the_canaries_or_polls_slots(watched: Build, clock: FakeClock,
                                                                           concurrency: int) -> None:
    names = ["a", "b", "c", "d", "e", "f"]
    watcher, fleet = watched(names, max_concurrency=concurrency)
    await _tick_all(watcher)
    await _drain(watcher)
    release = threading.Event()
    for name in names:
        fleet.servers[name].play(Held(release), PATH)  # every peer probe hangs, as a burst on busy servers would
    share = max(1, concurrency // 4)
    peers = [asyncio.create_task(watcher.peer_round(n, "", (0,))) for n in names]
    try:
        await _until(lambda: sum(fleet.servers[n].count(PATH) for n in names) >= share)
        await asyncio.sleep(0.2)
        assert sum(fleet.servers[n].count(PATH) for n in names) == share  # their own share, no more
        clock.advance(60)
        # Canaries of as many servers as they may hold, and every poll, go through while the peer probes hang.
        canaries = names[:max(1, concurrency // 2)]
        async with asyncio.timeout(10):
            await asyncio.gather(*(watcher.canary(n) for n in canaries), *(watcher.poll(n) for n in names))
        assert all(fleet.servers[n].count(CANARY) == 2 for n in canaries)
    finally:
        release.set()
        await asyncio.gather(*peers)


async def test_at_max_concurrency_1_the_peer_probe_waits_for_the_one_slot(watched: Build) -> None:
    watcher, _ = watched(["a", "b"], max_concurrency=1)
    assert watcher._peer_limit is watcher._limit  # never a second request in flight


# canary_first on its own: the fill-in judgement of the process before any question.

ENDPOINTS = (Endpoint.CHAT,)


def _polled() -> ModelState:
    result = PollResult(Props("none", 1, "m.gguf", "b1", 2048), Slots(1, True))
    return ModelState("", ENDPOINTS).polled(ModelPoll("loaded", result), 0.0)


def test_no_question_before_the_first_full_round_nor_while_one_is_due() -> None:
    new = _polled()
    assert new.full_round_due == "new" and not canary_first(new, 1000.0, phase=0.0)
    begun = replace(new, full_round_due=None, full_round_at=100.0, rotated_at=100.0)
    assert canary_first(begun, 100.0, phase=0.0)
    for due in ("new", "changed", "back"):
        assert not canary_first(replace(begun, full_round_due=due), 1000.0, phase=0.0)


def test_a_process_first_round_waits_for_its_phase_and_the_next_rounds_do_not() -> None:
    begun = replace(_polled(), full_round_due=None, full_round_at=100.0, rotated_at=100.0)
    assert not canary_first(begun, 100.0 + 29.9, phase=30.0)
    assert canary_first(begun, 100.0 + 30.0, phase=30.0)
    asked = replace(begun, peer_answers=replace(begun.peer_answers, asked_at=101.0))
    assert canary_first(asked, 102.0, phase=30.0)  # the phase spreads the first round only; peers_due paces the rest


def test_phases_are_stable_and_spread() -> None:
    phases = [phase(f"s{i}\0", "peers") for i in range(1000)]
    assert phases == [phase(f"s{i}\0", "peers") for i in range(1000)]
    assert all(0 <= p < 1 for p in phases)
    assert all(80 < sum(1 for p in phases if k / 10 <= p < (k + 1) / 10) < 120 for k in range(10))


async def test_every_later_round_is_asked_over_the_round_each_member_at_its_phase(watched: Build,
                                                                                clock: FakeClock) -> None:
    from specwatch.daemon.cadence import round_of

    names = [f"m{i:02d}" for i in range(12)]
    watcher, _ = watched(names, poll_interval=15, canary_interval=60)
    asked: dict[tuple[str, int], float] = {}
    for _ in range(16):  # four canary_intervals of polls
        await _tick_all(watcher)
        await _drain(watcher)
        for name in names:
            answers = watcher.fleet.get(name).model().peer_answers
            if answers.asked_round is not None:
                asked.setdefault((name, answers.asked_round), answers.asked_at)
        clock.advance(15)
    late = max(r for _, r in asked)
    offsets = [at - (late - 1) * 60 for (_, r), at in asked.items() if r == late - 1]
    assert len(offsets) == len(names)  # every member asked the round, once
    assert all(0 <= o < 60 for o in offsets) and len(set(offsets)) >= 3, offsets  # over the round, not at its start
    assert round_of(max(asked.values()), 60) == late
