"""Canary economy on real llama-servers: a change is canaried at the next poll, a steady server stays within its token
budget (its own /metrics), and every speculation type is still caught at the default canary sizes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from specwatch.core.state import Fleet, ModelState
from specwatch.core.verdict import Verdict
from specwatch.daemon.cadence import spacing
from specwatch.daemon.schedule import Schedule
from specwatch.daemon.watch import Watcher
from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import write_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.probe import peerprobe
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.support.router import PREDICTED, ROUTER_MODEL, Router, counters
from tests.support.waiting import wait_until_async

pytestmark = pytest.mark.real

DRAFT = ["-md", "{model}", "--spec-type", "draft-simple"]
SPECULATION = {"draft-simple": DRAFT, "ngram-mod": ["--spec-type", "ngram-mod"],
               "ngram-map-k": ["--spec-type", "ngram-map-k"]}
CANARY_ALLOWANCE = 2.0
"""Seconds one canary round may take on the generated model under load (it takes a fraction of one)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cycle_model(tmp_path_factory.mktemp("economy") / "cycle.gguf")


def _server(model: Path, extra: list[str], tmp_path: Path, **kw: object) -> LlamaServer:
    return LlamaServer(model, ["--metrics", *(a.replace("{model}", str(model)) for a in extra)], log_dir=tmp_path, **kw)


@contextlib.asynccontextmanager
async def watching(**settings: object) -> AsyncIterator[tuple[Watcher, Schedule]]:
    """The daemon's watcher on its real schedule (one job per server: poll, then the canaries due)."""
    config = Settings(**settings)
    client = new_client()
    watcher = Watcher(config, Fleet(config.servers, config.canary_endpoints), Fetcher(client, config.max_response_bytes))
    schedule = Schedule(watcher)
    schedule.start(list(config.servers))
    try:
        yield watcher, schedule
    finally:
        schedule.shutdown()
        await watcher.close()
        await client.aclose()


async def settle(watcher: Watcher, schedule: Schedule) -> None:
    """Stop scheduling and let the canaries in flight finish (not cancel them: the server would still count them)."""
    schedule.shutdown()
    if watcher._rounds:
        await asyncio.wait(list(watcher._rounds), timeout=60)


def _peer_probes(watcher: Watcher, name: str) -> int:
    """Peer probe answers the server gave (each copy counted)."""
    model = _model(watcher, name)
    return model.peer_answers.outcomes.get("success", 0) if model is not None else 0


def _model(watcher: Watcher, name: str) -> ModelState | None:
    state = watcher.fleet.get(name)
    if state is None:
        return None
    return next(iter(state.models.values()), None) if state.router else state.model()


async def _seen(what: str, condition: Callable[[], bool], *, timeout: float) -> float:
    """When `condition` was first seen true (monotonic seconds)."""
    await wait_until_async(what, condition, timeout=timeout)
    return time.monotonic()


def _verdict(watcher: Watcher, name: str) -> Verdict | None:
    model = _model(watcher, name)
    return model.decision.verdict if model is not None else None


def _round_done(watcher: Watcher, name: str) -> bool:
    model = _model(watcher, name)
    return model is not None and len(model.canaries) == len(model.endpoints) and name not in {
        key[1] for key in watcher._in_flight if key[0] == "canary"}


async def test_a_restart_with_a_draft_model_is_canaried_at_the_next_poll_not_the_next_interval(
        model: Path, tmp_path: Path) -> None:
    poll = 2.0
    plain = _server(model, [], tmp_path).start()
    restarted: LlamaServer | None = None
    try:
        # A canary interval of an hour: only the change seen by the poll can canary the restarted server.
        async with watching(servers=[{"name": "target", "url": plain.url}], poll_interval=f"{poll:g}s",
                            canary_interval="1h") as (watcher, _):
            await wait_until_async("the first full round on the plain server", lambda: _verdict(watcher, "target") is Verdict.CLEAN and _round_done(watcher, "target"), timeout=30)
            assert _model(watcher, "target").canary_outcomes["success"] == len(Endpoint)

            await asyncio.to_thread(plain.stop)
            restarted = _server(model, DRAFT, tmp_path, port=plain.port)
            await asyncio.to_thread(restarted.start)  # returns at its first /health 200
            answered = time.monotonic()
            caught = await _seen("fill_ins after the restart", lambda: _verdict(watcher, "target") is Verdict.FILL_INS, timeout=30)
            assert caught - answered <= 2 * poll + CANARY_ALLOWANCE, f"caught {caught - answered:.1f}s after /health"

            await wait_until_async("the round after the restart", lambda: _round_done(watcher, "target"), timeout=30)
            settings = watcher.settings
            # One round of every endpoint at the speculating size, and nothing else: the server's own count.
            predicted = (await asyncio.to_thread(counters, restarted.url))[PREDICTED]
            assert predicted == len(Endpoint) * settings.canary_tokens_speculating
            assert _model(watcher, "target").canary_outcomes["success"] == 2 * len(Endpoint)
    finally:
        for server in (plain, restarted):
            if server is not None:
                server.stop()


async def test_a_steady_server_stays_within_its_canary_budget(model: Path, tmp_path: Path) -> None:
    poll, interval, window = 1.0, 2.0, 24.0
    plain = _server(model, [], tmp_path).start()
    draft = _server(model, DRAFT, tmp_path).start()
    try:
        async with watching(servers=[{"name": "plain", "url": plain.url}, {"name": "draft", "url": draft.url}],
                            poll_interval=f"{poll:g}s", canary_interval=f"{interval:g}s") as (watcher, schedule):
            for name in ("plain", "draft"):
                await wait_until_async(f"{name} verdict", lambda n=name: _verdict(watcher, n) not in (None, Verdict.UNCHECKED), timeout=30)
            await asyncio.sleep(interval)  # the first full round (and a second pass, if one runs) is over
            # The peer probe's first round comes after the first full canary rounds, at each member's
            # phase of an interval: the window begins once it is over.
            for name in ("plain", "draft"):
                await wait_until_async(f"{name}'s first peer round",
                                       lambda n=name: _peer_probes(watcher, n) >= 1, timeout=30)
            # Both serve one model, so each also answers the peer probe: one question of TOKENS per canary_interval.
            before = {s.url: (await asyncio.to_thread(counters, s.url))[PREDICTED] for s in (plain, draft)}
            probes_before = {name: _peer_probes(watcher, name) for name in ("plain", "draft")}
            await asyncio.sleep(window)
            after = {s.url: (await asyncio.to_thread(counters, s.url))[PREDICTED] for s in (plain, draft)}
            settings = watcher.settings
            for name, server, size in (("plain", plain, settings.canary_tokens),
                                       ("draft", draft, settings.canary_tokens_speculating)):
                probed = (_peer_probes(watcher, name) - probes_before[name]) * peerprobe.TOKENS
                # At most one per interval, plus one begun before the window; late by at most a poll interval.
                assert (int(window // (interval + poll)) - 1) * peerprobe.TOKENS <= probed <= (
                    window / interval + 1) * peerprobe.TOKENS, (name, probed)
                spent = after[server.url] - before[server.url] - probed
                every = spacing(_model(watcher, name), interval=settings.canary_interval, tokens=settings.canary_tokens,
                                tokens_speculating=settings.canary_tokens_speculating)
                assert every == settings.canary_interval * (1 if name == "plain" else 2)
                # One canary of its size per spacing, plus the one that may have started before the window and ended
                # in it: at the defaults (60 s, 8 and 32 tokens) 480 and 960 tokens an hour. A peer probe in flight
                # at either end is counted by the server and not yet by specwatch, or the other way: one either way.
                budget = size * window / every + size + peerprobe.TOKENS
                # Canaries start at polls, so one is late by at most a poll interval: the fewest the window holds.
                fewest = (int(window // (every + poll)) - 1) * size - peerprobe.TOKENS
                assert fewest <= spent <= budget, (name, spent, fewest, budget)
            await settle(watcher, schedule)
            for name, server in (("plain", plain), ("draft", draft)):
                # Every token the server generated was a canary or a peer probe that specwatch asked for and counted
                # (the cycle model never ends an answer early: a probe is TOKENS).
                total = (await asyncio.to_thread(counters, server.url))[PREDICTED]
                assert total == _model(watcher, name).canary_tokens["generated"] + _peer_probes(
                    watcher, name) * peerprobe.TOKENS, name
                assert _model(watcher, name).peer_answers.outcomes.get("failure", 0) == 0, name
    finally:
        plain.stop()
        draft.stop()


async def test_every_speculation_type_is_caught_at_the_default_sizes_and_a_plain_server_never_is(
        model: Path, tmp_path: Path) -> None:
    servers = {name: _server(model, extra, tmp_path).start() for name, extra in {"plain": [], **SPECULATION}.items()}
    try:
        async with watching(servers=[{"name": n, "url": s.url} for n, s in servers.items()], poll_interval="1s",
                            canary_interval="2s") as (watcher, _):
            settings = watcher.settings
            assert (settings.canary_tokens, settings.canary_tokens_speculating) == (8, 32)  # the defaults
            for name in servers:
                await wait_until_async(f"a full round on {name}", lambda n=name: _round_done(watcher, n), timeout=30)
            first = {name: dict(_model(watcher, name).canaries) for name in servers}
            for name in SPECULATION:
                assert _verdict(watcher, name) is Verdict.FILL_INS, (name, _model(watcher, name).decision.summary)
                tallies = {e: c.tally for e, c in first[name].items()}
                assert all(t is not None and t.tokens == settings.canary_tokens_speculating for t in tallies.values())
                # Streaming too: a speculating server's stream carries no logprobs after its first chunk.
                for endpoint in (Endpoint.COMPLETION, Endpoint.COMPLETION_STREAM):
                    assert tallies[endpoint].fill_ins > 0, (name, endpoint, tallies[endpoint])
            assert all(c.tally.fill_ins == c.tally.tokens - 1 for c in first["draft-simple"].values())
            assert first["draft-simple"][Endpoint.CHAT_STREAM].tally.fill_ins > 0

            # The plain server, over its first round and four rotation canaries after it: never a fill-in. A rotation
            # canary starts at the first poll after it falls due, so they come 2 to 3 s apart (more on a loaded machine).
            seen = 0
            deadline = time.monotonic() + 30
            while seen < len(Endpoint) + 4 and time.monotonic() < deadline:
                plain = _model(watcher, "plain")
                assert plain.decision.verdict is Verdict.CLEAN, plain.decision.summary
                assert all(c.tally is not None and c.tally.fill_ins == 0 and c.tally.tokens == settings.canary_tokens
                           for c in plain.canaries.values())
                seen = plain.canary_outcomes.get("success", 0)
                await asyncio.sleep(0.5)
            assert seen >= len(Endpoint) + 4, seen
    finally:
        for server in servers.values():
            server.stop()


async def test_a_router_model_reloaded_with_speculation_is_canaried_at_the_next_poll(model: Path, tmp_path: Path) -> None:
    poll = 2.0
    router = Router(model, tmp_path)
    await asyncio.to_thread(router.start)
    try:
        await asyncio.to_thread(router.load)
        async with watching(servers=[{"name": "router", "url": router.url}], poll_interval=f"{poll:g}s",
                            canary_interval="1h") as (watcher, _):
            await wait_until_async("the first full round on the router model", lambda: _verdict(watcher, "router") is Verdict.CLEAN and _round_done(watcher, "router"), timeout=30)
            # The preset now gives the model a draft; the router re-reads it, unloads the model, and a client loads it.
            answered = await asyncio.to_thread(router.reload_with, [a.replace("{model}", str(model)) for a in DRAFT])
            caught = await _seen("fill_ins after the reload", lambda: _verdict(watcher, "router") is Verdict.FILL_INS, timeout=30)
            assert caught - answered <= 2 * poll + CANARY_ALLOWANCE, f"caught {caught - answered:.1f}s after loading"
            assert _model(watcher, "router").model == ROUTER_MODEL
    finally:
        await asyncio.to_thread(router.stop)
