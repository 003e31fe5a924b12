"""The watcher and collector together: probes against fake servers, then the /metrics exposition."""

from __future__ import annotations

import asyncio
import threading

from specwatch.core.verdict import Verdict
from specwatch.endpoints import Endpoint
from specwatch.reasons import Reason
from tests.support.fakes import fake_fleet, serving
from tests.support.faults import Held
from tests.support.loopback import FaultServer
from tests.support.metrics import exposition, parse, value
from tests.support.wire import FakeLlama


def _samples(watcher) -> dict[tuple[str, tuple], float]:
    return parse(exposition(watcher.fleet))


async def test_plain_and_speculating_servers_side_by_side(make_watcher) -> None:
    watcher = make_watcher({"plain": FakeLlama.plain(), "draft": FakeLlama.draft()})
    await asyncio.gather(*(watcher.poll(n) for n in ("plain", "draft")), *(watcher.canary(n) for n in ("plain", "draft")))
    s = _samples(watcher)
    assert value(s, "specwatch_up", server="plain") == 1
    assert value(s, "specwatch_speculation_enabled", server="draft", source="slots") == 1
    assert value(s, "specwatch_speculation_enabled", server="draft", source="props") == 0
    assert value(s, "specwatch_speculation_contradiction", server="draft") == 1
    assert value(s, "specwatch_speculation_contradiction", server="plain") == 0
    assert value(s, "specwatch_serving_placeholders", server="draft") == 1
    assert value(s, "specwatch_serving_placeholders", server="plain") == 0
    for endpoint in ("chat", "chat_stream", "completion", "completion_stream", "completion_post_sampling"):
        assert value(s, "specwatch_canary_placeholder_ratio", server="draft", endpoint=endpoint) == 1.0
        assert value(s, "specwatch_canary_placeholder_ratio", server="plain", endpoint=endpoint) == 0.0
        assert value(s, "specwatch_canary_success", server="plain", endpoint=endpoint) == 1
        assert value(s, "specwatch_canary_tokens", server="draft", endpoint=endpoint) == 31  # tokens after the first: the judged ones
    assert value(s, "specwatch_canary_last_success_timestamp_seconds", server="plain", endpoint="chat") == 1_700_000_000.0
    assert value(s, "specwatch_server_info", server="plain", build="b0-unknown", model="tiny.gguf") == 1


async def test_static_labels_ride_on_every_series(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.plain()}, servers=[{"name": "a", "url": "http://a:1", "labels": {"pool": "eval"}}])
    await watcher.poll("a")
    assert value(_samples(watcher), "specwatch_up", server="a", pool="eval") == 1


async def test_slots_disabled_is_unknown_not_off(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.plain(slots_enabled=False)})
    await watcher.poll("a")
    s = _samples(watcher)
    assert value(s, "specwatch_up", server="a") == 1
    assert value(s, "specwatch_speculation_enabled", server="a", source="slots") is None
    assert value(s, "specwatch_speculation_contradiction", server="a") is None
    assert value(s, "specwatch_speculation_enabled", server="a", source="props") == 0


async def test_api_key_is_sent_as_bearer(make_watcher, tmp_path) -> None:
    key = tmp_path / "key"
    key.write_text("s3cret-key\n")
    fake = FakeLlama.plain(api_key="s3cret-key")
    watcher = make_watcher({"a": fake}, servers=[{"name": "a", "url": "http://a:1", "api_key_file": str(key)}])
    await watcher.poll("a")
    assert value(_samples(watcher), "specwatch_up", server="a") == 1
    assert fake.requests[-1].headers["authorization"] == "Bearer s3cret-key"


async def test_wrong_key_is_unauthorized_and_marks_data_unknown(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.plain(api_key="other")})
    await watcher.poll("a")
    s = _samples(watcher)
    assert value(s, "specwatch_up", server="a") == 0
    assert value(s, "specwatch_poll_failures_total", server="a", reason="unauthorized") == 1
    assert value(s, "specwatch_speculation_enabled", server="a", source="props") is None


async def test_a_dead_server_does_not_touch_its_neighbour(make_watcher) -> None:
    watcher = make_watcher({"ok": FakeLlama.draft()},
                           servers=[{"name": "ok", "url": "http://ok:1"}, {"name": "dead", "url": "http://dead:1"}])
    await asyncio.gather(watcher.poll("ok"), watcher.poll("dead"), watcher.canary("ok"), watcher.canary("dead"))
    s = _samples(watcher)
    assert value(s, "specwatch_up", server="dead") == 0
    assert value(s, "specwatch_poll_failures_total", server="dead", reason="connection_refused") == 1
    assert value(s, "specwatch_canary_failures_total", server="dead", endpoint="chat", reason="connection_refused") == 1
    assert value(s, "specwatch_up", server="ok") == 1
    assert value(s, "specwatch_serving_placeholders", server="ok") == 1


async def test_a_failed_canary_keeps_the_cached_verdict_and_its_age(make_watcher, clock) -> None:
    fake = FakeLlama.draft()
    watcher = make_watcher({"a": fake}, canary_endpoints=["chat"])
    await watcher.canary("a")
    clock.advance(60)
    fake.api_key = "now-protected"
    await watcher.canary("a")
    s = _samples(watcher)
    assert value(s, "specwatch_canary_success", server="a", endpoint="chat") == 0
    assert value(s, "specwatch_canary_placeholder_ratio", server="a", endpoint="chat") == 1.0
    assert value(s, "specwatch_canary_last_success_timestamp_seconds", server="a", endpoint="chat") == 1_700_000_000.0
    assert watcher.fleet.get("a").model().canaries["chat"].failure_reason is Reason.UNAUTHORIZED


async def test_a_canary_in_flight_is_not_started_again(make_watcher) -> None:
    gate = threading.Event()
    watcher = make_watcher({}, servers=[{"name": "slow", "url": "http://slow:1"}], canary_endpoints=["chat"])
    with FaultServer(FakeLlama.plain()) as slow:
        slow.play(Held(gate), "/v1/chat/completions")
        fleet = fake_fleet({})
        fleet.names.ports["slow"] = slow.port
        watcher.fetcher.client = fleet.client()
        first = asyncio.create_task(watcher.canary("slow"))
        while slow.count("/v1/chat/completions") < 1:
            await asyncio.sleep(0.01)
        await watcher.canary("slow")  # returns at once: the first is still in flight
        assert slow.count("/v1/chat/completions") == 1
        gate.set()
        await first
        await watcher.canary("slow")
        assert slow.count("/v1/chat/completions") == 2
        await watcher.fetcher.client.aclose()


async def test_removed_servers_vanish_and_added_ones_appear(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.plain(), "b": FakeLlama.plain()})
    await asyncio.gather(watcher.poll("a"), watcher.poll("b"))
    from specwatch.settings.schema import Settings

    new = Settings(servers=[{"name": "b", "url": "http://b:8080"}, {"name": "c", "url": "http://c:8080"}])
    watcher.apply(new, list(new.servers))
    s = _samples(watcher)
    assert value(s, "specwatch_up", server="a") is None
    assert value(s, "specwatch_up", server="b") == 1
    assert value(s, "specwatch_servers") == 2


async def test_a_verdict_is_logged_when_it_changes_not_every_canary(make_watcher) -> None:
    import structlog

    fake = FakeLlama.draft(tokens=8)
    watcher = make_watcher({"a": fake}, canary_endpoints=["chat"])
    with structlog.testing.capture_logs() as logs:
        await watcher.poll("a")
        for _ in range(3):
            await watcher.canary("a")
            await watcher.poll("a")
        fake.fill_ins.clear()
        await watcher.canary("a")
        await watcher.canary("a")
    changes = [(e["previous"], e["verdict"], e["log_level"]) for e in logs if e["event"] == "verdict_changed"]
    assert changes == [("unchecked", "fill_ins", "warning"), ("fill_ins", "clean", "info")]
    first = next(e for e in logs if e["event"] == "verdict_changed")
    assert first["server"] == "a"
    assert first["summary"] == ("the server serves fill-in logprobs (fill-ins / tokens after the first: chat 7/7); "
                                "do not score")


async def test_a_dead_server_logs_when_it_fails_changes_recovers_and_every_ten_minutes_between(clock) -> None:
    """Not nine warnings a minute forever: one when the trouble starts, a reminder every REMIND_SECONDS, one at the end."""
    import structlog

    from specwatch.core.state import Fleet
    from specwatch.daemon.watch import REMIND_SECONDS, Watcher
    from specwatch.probe.http.fetch import Fetcher
    from specwatch.settings.schema import Settings
    from tests.support.fakes import fake_fleet

    fleet = fake_fleet({})
    server = fleet.standby("a", FakeLlama.plain(api_key="k"))  # down until started
    settings = Settings(servers=[{"name": "a", "url": "http://a:8080"}], canary_endpoints=["completion"])
    async with fleet.client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(client, settings.max_response_bytes), clock=clock, monotonic=clock)
        with structlog.testing.capture_logs() as logs:
            polls = int(3 * REMIND_SECONDS // 15)  # 30 minutes of polls every 15 s, the server down all along
            for _ in range(polls):
                await watcher.poll("a")
                clock.advance(15)
            server.start()  # back, but refusing specwatch: the reason changes
            await watcher.poll("a")
            server.site.lookalike.inner = FakeLlama.plain()
            await watcher.poll("a")
    lines = [(e["event"], e.get("reason") or e.get("last_reason")) for e in logs if e["log_level"] in ("warning", "info")
             and e["event"].startswith("poll_")]
    assert lines == [("poll_failed", "connection_refused")] + [("poll_failed", "connection_refused")] * 2 + [
        ("poll_failed", "unauthorized"), ("poll_recovered", "unauthorized")]
    reminders = [e for e in logs if e["event"] == "poll_failed" and "still_for_seconds" in e]
    assert [e["still_for_seconds"] for e in reminders] == [600, 1200]
    assert sum(e["event"] == "poll_failed" and e["log_level"] == "debug" for e in logs) == polls - 3


async def test_a_server_going_back_and_forth_between_two_reasons_logs_each_once(clock) -> None:
    """A server whose link is down fails as a timeout, then as unreachable, then as a timeout again: a warning at each
    change made a line every other poll for as long as the link stayed down."""
    import structlog

    from specwatch.core.state import Fleet
    from specwatch.daemon.watch import Watcher
    from specwatch.probe.http.fetch import Fetcher
    from specwatch.settings.schema import Settings
    from tests.support.fakes import fake_fleet

    fleet = fake_fleet({})
    server = fleet.standby("a", FakeLlama.plain(api_key="k"))
    settings = Settings(servers=[{"name": "a", "url": "http://a:8080"}], canary_endpoints=["completion"])
    async with fleet.client() as client:
        watcher = Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                          Fetcher(client, settings.max_response_bytes), clock=clock, monotonic=clock)
        with structlog.testing.capture_logs() as logs:
            for i in range(12):
                if i % 2:
                    server.start()  # refusing specwatch's key
                else:
                    server.stop()  # refusing connections
                await watcher.poll("a")
                clock.advance(15)
            server.site.lookalike.inner = FakeLlama.plain()  # started by the last turn, and now accepting the key
            await watcher.poll("a")
    lines = [(e["event"], e.get("reason") or e.get("last_reason")) for e in logs if e["log_level"] in ("warning", "info")
             and e["event"].startswith("poll_")]
    assert lines == [("poll_failed", "connection_refused"), ("poll_failed", "unauthorized"),
                     ("poll_recovered", "unauthorized")]
    assert next(e for e in logs if e["event"] == "poll_recovered")["times"] == 12


async def test_attempt_counters_exist_from_the_first_probe_so_rates_see_the_first_failure(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.plain(tokens=None)}, canary_endpoints=["completion"])
    await watcher.poll("a")
    await watcher.canary("a")
    s = _samples(watcher)
    assert value(s, "specwatch_polls_total", server="a", outcome="failure") == 0
    assert value(s, "specwatch_polls_total", server="a", outcome="success") == 1
    assert value(s, "specwatch_canaries_total", server="a", outcome="failure") == 0
    assert value(s, "specwatch_canary_requested_tokens_total", server="a") == 8  # /slots says it does not speculate
    assert value(s, "specwatch_canary_generated_tokens_total", server="a") == 8


async def test_a_canary_answered_by_another_model_is_a_model_mismatch_not_a_verdict(make_watcher) -> None:
    watcher = make_watcher({"a": FakeLlama.draft(model_alias="other-model.gguf")},
                           servers=[{"name": "a", "url": "http://a:8080", "model": "qwen3-8b"}], canary_endpoints=["completion"])
    await watcher.canary("a")
    model = watcher.fleet.get("a").model()
    assert model.canaries["completion"].failure_reason is Reason.MODEL_MISMATCH
    assert "asked model 'qwen3-8b', answered by" in model.canaries["completion"].failure_detail
    assert model.canaries["completion"].tally is None and model.serving_fill_ins is None
    await watcher.poll("a")  # the poll says the same, and the daemon sends no canary after a failed poll
    assert watcher.fleet.get("a").poll_failure_reason is Reason.MODEL_MISMATCH


async def test_periodic_canaries_are_spaced_by_the_configured_token_sizes(make_watcher, clock) -> None:
    async def attempts_after(seconds: float, **settings_kw: object) -> int:
        watcher = make_watcher({"d": FakeLlama.draft()}, canary_endpoints=["completion"], **settings_kw)
        seen = set()
        for _ in range(2):
            await watcher.tick("d")
            await asyncio.gather(*watcher._rounds)
            seen.add(watcher.fleet.get("d").model().canaries["completion"].attempted_at)
            clock.advance(seconds)
        return len(seen)

    # A speculating server asked for 32 tokens (4 x canary_tokens) waits two intervals; asked for 8, one.
    assert await attempts_after(60, canary_interval=60, canary_tokens=8, canary_tokens_speculating=32) == 1
    assert await attempts_after(60, canary_interval=60, canary_tokens=8, canary_tokens_speculating=8) == 2


def _paths(fake: FakeLlama) -> list[str]:
    return [r.path for r in fake.requests]


async def test_a_steady_poll_asks_props_alone_and_slots_when_the_process_changes(make_watcher, clock) -> None:
    fake = FakeLlama.plain(tokens=8)
    watcher = make_watcher({"srv": fake}, canary_tokens=8, canary_interval=60)
    await watcher.poll("srv")
    assert _paths(fake) == ["/props", "/slots"]  # no /health: /props answers everything it did
    for _ in range(3):
        clock.advance(15)
        await watcher.poll("srv")
    assert _paths(fake)[2:] == ["/props"] * 3, "the same process: its /slots answer still holds"
    clock.advance(15)  # a minute since /slots was asked: asked again, in case a build keeps its marker
    await watcher.poll("srv")
    assert _paths(fake)[5:] == ["/props", "/slots"]
    fake.media_marker, fake.speculative = "<__media_restarted__>", True  # restarted with speculation on
    fake.fill_ins, fake.drafts = set(range(1, 8)), 8
    clock.advance(15)
    await watcher.poll("srv")
    assert _paths(fake)[7:] == ["/props", "/slots"]
    model = watcher.fleet.get("srv").model()
    assert model.poll.slots.speculative and model.full_round_due == "changed"


async def test_a_build_without_a_media_marker_gets_slots_at_every_poll(make_watcher, clock) -> None:
    fake = FakeLlama.plain(tokens=8, media_marker="")
    watcher = make_watcher({"srv": fake}, canary_tokens=8)
    for _ in range(3):
        await watcher.poll("srv")
        clock.advance(15)
    assert _paths(fake) == ["/props", "/slots"] * 3


async def test_a_sleeping_server_is_left_asleep(make_watcher, clock) -> None:
    fake = FakeLlama.draft(tokens=8, sleeping=True)
    watcher = make_watcher({"srv": fake}, canary_tokens=8)
    for _ in range(6):
        await watcher.tick("srv")
        await asyncio.gather(*watcher._rounds)
        clock.advance(60)
    assert (fake.woken, set(_paths(fake))) == (0, {"/props"})
    model = watcher.fleet.get("srv").model()
    assert model.decision.verdict is Verdict.UNCHECKED and "sleeping" in model.decision.summary
    samples = parse(exposition(watcher.fleet))
    assert value(samples, "specwatch_model_loaded", server="srv") == 0 and value(samples, "specwatch_up", server="srv") == 1
    fake.sleeping = False  # an eval woke it: the next poll finds it awake and canaries it
    await watcher.tick("srv")
    await asyncio.gather(*watcher._rounds)
    assert watcher.fleet.get("srv").model().decision.verdict is Verdict.FILL_INS
    assert value(parse(exposition(watcher.fleet)), "specwatch_model_loaded", server="srv") is None


async def test_check_asks_slots_every_time(clock) -> None:
    from specwatch.gate.check import run_check
    from specwatch.settings.targets import ServerConfig

    fake = FakeLlama.plain(tokens=8)
    await run_check(ServerConfig(name="x", url="http://srv:8080"), endpoints=[Endpoint.CHAT], tokens=8, timeout=5,
                    connect=serving(fake))
    assert _paths(fake)[:2] == ["/props", "/slots"]


async def test_canary_checked_is_0_for_every_endpoint_until_canaried_since_the_server_changed(make_watcher) -> None:
    fake = FakeLlama.plain()
    watcher = make_watcher({"a": fake}, canary_endpoints=["completion", "chat"])
    await watcher.poll("a")
    s = _samples(watcher)
    assert [value(s, "specwatch_canary_checked", server="a", endpoint=e) for e in ("completion", "chat")] == [0, 0]
    await watcher.canary("a")
    s = _samples(watcher)
    assert [value(s, "specwatch_canary_checked", server="a", endpoint=e) for e in ("completion", "chat")] == [1, 1]
    # A restart with speculation on: what the canaries found before says nothing about the new process.
    fake.speculative, fake.fill_ins, fake.drafts = True, set(range(1, 32)), 32
    fake.media_marker = "<__media_anotherProcessAnotherProcessAnotherPr__>"
    await watcher.poll("a")
    s = _samples(watcher)
    assert [value(s, "specwatch_canary_checked", server="a", endpoint=e) for e in ("completion", "chat")] == [0, 0]
    assert value(s, "specwatch_canary_placeholder_tokens", server="a", endpoint="chat") is None
    # A canary that fails proves nothing either.
    fake.api_key = "now-protected"
    await watcher.canary("a")
    s = _samples(watcher)
    assert [value(s, "specwatch_canary_checked", server="a", endpoint=e) for e in ("completion", "chat")] == [0, 0]
    fake.api_key = None
    await watcher.canary("a")
    s = _samples(watcher)
    assert [value(s, "specwatch_canary_checked", server="a", endpoint=e) for e in ("completion", "chat")] == [1, 1]
    assert value(s, "specwatch_canary_placeholder_tokens", server="a", endpoint="chat") == 31


async def test_close_ends_a_tick_in_flight_and_nothing_is_sent_after(make_watcher) -> None:
    """A tick cancelled while its poll waits goes no further: no /v1/models, no canary, once close() has returned."""
    release = threading.Event()
    watcher = make_watcher({}, servers=[{"name": "a", "url": "http://a:1"}], canary_endpoints=["chat"])
    with FaultServer(FakeLlama.plain()) as server:
        server.play(Held(release), "/props")
        fleet = fake_fleet({})
        fleet.names.ports["a"] = server.port
        watcher.fetcher.client = fleet.client()
        tick = asyncio.create_task(watcher.tick("a"))
        while server.count("/props") < 1:
            await asyncio.sleep(0.01)
        await watcher.close()
        assert tick.cancelled()
        release.set()
        await watcher.tick("a")  # a tick the schedule fired late starts nothing either
        await asyncio.sleep(0.2)
        assert [r.path for r in server.seen] == ["/props"]
        assert watcher.fleet.get("a").poll_success is None  # nothing was recorded of the cut poll
        await watcher.fetcher.client.aclose()
