"""Every bad answer a server can give, over real sockets: the exact reason, data marked unknown, the neighbour untouched."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import structlog

from specwatch.core.state import Fleet
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.client import new_client
from specwatch.probe.http.failures import reason_of
from specwatch.probe.http.fetch import Fetcher
from specwatch.reasons import Reason
from specwatch.settings.schema import Settings
from tests.support.certs import make_certs, server_tls
from tests.support.faults import CloseAtOnce, Hang, Huge, Mutate, Raw, Redirect, Reset, Respond, Status, Trickle, Truncated
from tests.support.loopback import FaultServer
from tests.support.metrics import exposition, parse, value
from tests.support.net import UNREACHABLE_URL, UNRESOLVABLE_URL, stranded_sockets
from tests.support.wire import FakeLlama

TIMEOUT = 2.5
"""Long beside a loopback answer (milliseconds), so a healthy poll on a starved machine still ends within it."""
MAX_BYTES = 256 * 1024
FAULTY, NEIGHBOUR = "faulty", "neighbour"


def scrape(watcher: Watcher) -> tuple[str, dict[tuple[str, tuple], float]]:
    text = exposition(watcher.fleet)
    return text, parse(text)


def server_series(samples: dict, server: str, name: str) -> list[tuple]:
    return [key for key in samples if key[0] == name and ("server", server) in key[1]]


@pytest.fixture
async def clients():
    opened = []

    def make():
        client = new_client()
        opened.append(client)
        return client

    yield make
    for client in opened:
        await client.aclose()


@pytest.fixture
def neighbour():
    with FaultServer(FakeLlama.draft(tokens=8)) as server:
        yield server


def watcher_for(clients, faulty: dict[str, Any], neighbour: FaultServer, **settings: Any) -> Watcher:
    config = Settings(
        servers=[{"name": FAULTY, **faulty}, {"name": NEIGHBOUR, "url": neighbour.url}],
        poll_timeout=TIMEOUT, canary_timeout=TIMEOUT, max_response_bytes=MAX_BYTES, canary_tokens=8, **settings,
    )
    return Watcher(config, Fleet(config.servers, config.canary_endpoints), Fetcher(clients(), config.max_response_bytes))


async def poll_both(watcher: Watcher) -> dict[str, float]:
    """Poll both servers at once; returns when each finished, in seconds from the start."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    finished: dict[str, float] = {}

    async def one(name: str) -> None:
        await watcher.poll(name)
        finished[name] = loop.time() - started

    await asyncio.gather(one(FAULTY), one(NEIGHBOUR))
    return finished


def assert_neighbour_healthy(samples: dict, took: dict[str, float]) -> None:
    assert value(samples, "specwatch_up", server=NEIGHBOUR) == 1
    assert value(samples, "specwatch_speculation_enabled", server=NEIGHBOUR, source="slots") == 1
    assert server_series(samples, NEIGHBOUR, "specwatch_poll_failures_total") == []
    # A slow or broken server never delays its neighbour: where the faulty poll was held until its timeout, the healthy
    # one had ended while it was still pending. An order, not a bound, so a busy machine cannot make it fail.
    if value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="timeout"):
        assert took[NEIGHBOUR] < took[FAULTY], took


@dataclass(frozen=True)
class PollRow:
    """One bad answer for the poll: `arrange` makes `faulty` misbehave and returns the URL to watch."""

    arrange: Callable[[FaultServer, Any], object]
    reason: str
    config: dict[str, Any] | None = None


def _on(path: str, fault) -> Callable[[FaultServer, Any], str]:
    def arrange(server: FaultServer, _: Any) -> str:
        server.play(fault, path)
        if path == "/slots":
            # The poll asks /slots again only when /props shows another process: the server restarted.
            server.fake.media_marker = "<__media_restarted__>"  # type: ignore[attr-defined]
        return server.url

    return arrange


def _stopped(server: FaultServer, _: Any) -> str:
    server.stop()
    return server.url


def _https_to_plain(server: FaultServer, _: Any) -> str:
    return server.url_as("https")


def _set_in(path: str, change: Callable[[Any], Any]) -> Callable[[FaultServer, Any], str]:
    return _on(path, Mutate(change))


def _props_without_settings(body: dict) -> dict:
    body.pop("default_generation_settings")
    return body


def _props_field(key: str, new: Any) -> Callable[[dict], dict]:
    def change(body: dict) -> dict:
        body[key] = new
        return body

    return change


def _slot_field(key: str, new: Any) -> Callable[[list], list]:
    def change(slots: list) -> list:
        slots[0][key] = new
        return slots

    return change


def _slot_without(key: str) -> Callable[[list], list]:
    def change(slots: list) -> list:
        del slots[0][key]
        return slots

    return change


POLL_ROWS: dict[str, PollRow] = {
    "connection refused (server stopped while watched)": PollRow(_stopped, "connection_refused"),
    "reset mid-body": PollRow(_on("/props", Reset()), "connection_reset"),
    "closed without an answer": PollRow(_on("/slots", CloseAtOnce()), "connection_reset"),
    "slow headers": PollRow(_on("/props", Hang()), "timeout"),
    "trickling body": PollRow(_on("/slots", Trickle()), "timeout"),
    "401 on /props": PollRow(_on("/props", Status(401)), "unauthorized"),
    "403 on /slots": PollRow(_on("/slots", Status(403)), "unauthorized"),
    "404 on /props": PollRow(_on("/props", Status(404)), "not_found"),
    "501 on /props": PollRow(_on("/props", Status(501)), "not_supported"),
    "503 loading on /props": PollRow(
        _on("/props", Status(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}')), "loading"
    ),
    "500 on /slots": PollRow(_on("/slots", Status(500)), "server_error"),
    "502 from a proxy": PollRow(_on("/props", Status(502, b"<html>Bad Gateway</html>")), "server_error"),
    "418 on /props": PollRow(_on("/props", Status(418)), "client_error"),
    "redirect to the same host": PollRow(_on("/props", Redirect("/props?again=1", 307)), "redirect"),
    "HTML page with 200": PollRow(_on("/props", Raw(b"<!doctype html><html><body>Sign in</body></html>")), "invalid_json"),
    "truncated JSON": PollRow(_on("/props", Truncated()), "invalid_json"),
    "empty body": PollRow(_on("/slots", Raw(b"", "application/json")), "invalid_json"),
    "NaN in /props": PollRow(_set_in("/props", _props_field("total_slots", float("nan"))), "invalid_json"),
    "Infinity in /slots": PollRow(_set_in("/slots", _slot_field("n_ctx", float("inf"))), "invalid_json"),
    "/props without default_generation_settings": PollRow(_set_in("/props", _props_without_settings), "invalid_response"),
    "/props total_slots as a string": PollRow(_set_in("/props", _props_field("total_slots", "1")), "invalid_response"),
    "/props total_slots beyond any float": PollRow(_set_in("/props", _props_field("total_slots", 10**400)), "invalid_response"),
    "/props model_alias as a number": PollRow(_set_in("/props", _props_field("model_alias", 7)), "invalid_response"),
    "/slots an object, not a list": PollRow(_set_in("/slots", lambda slots: slots[0]), "invalid_response"),
    "/slots without speculative": PollRow(_set_in("/slots", _slot_without("speculative")), "invalid_response"),
    "/slots speculative as a string": PollRow(_set_in("/slots", _slot_field("speculative", "true")), "invalid_response"),
    "/props as a list": PollRow(_set_in("/props", lambda body: [body]), "invalid_response"),
    "huge body, length declared": PollRow(_on("/props", Huge(declared=True)), "body_too_large"),
    "huge body, chunked": PollRow(_on("/slots", Huge(declared=False)), "body_too_large"),
    "another model than configured (router mode)": PollRow(
        lambda server, _: server.url, "model_mismatch", config={"model": "qwen3-8b"}
    ),
}


@pytest.mark.parametrize("row", POLL_ROWS.values(), ids=POLL_ROWS.keys())
async def test_poll_fault(row: PollRow, clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.plain()) as faulty:
        config = {"url": faulty.url, **(row.config or {})}
        watcher = watcher_for(clients, config, neighbour)
        if row.reason != "model_mismatch":
            await poll_both(watcher)
            _, before = scrape(watcher)
            assert value(before, "specwatch_up", server=FAULTY) == 1
            assert value(before, "specwatch_speculation_enabled", server=FAULTY, source="props") == 0

        row.arrange(faulty, neighbour)
        with structlog.testing.capture_logs() as logs:
            took = await poll_both(watcher)

    text, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason=row.reason) == 1, text
    assert len(server_series(samples, FAULTY, "specwatch_poll_failures_total")) == 1
    assert value(samples, "specwatch_up", server=FAULTY) == 0
    # The last good answer is not served as current: everything the poll reads is gone until it succeeds again.
    polled = ("specwatch_speculation_enabled", "specwatch_speculation_contradiction", "specwatch_slots", "specwatch_server_info")
    for name in polled:
        assert server_series(samples, FAULTY, name) == [], name
    failed = [e for e in logs if e["event"] == "poll_failed" and e["server"] == FAULTY]
    assert [e["reason"] for e in failed] == [row.reason]
    assert_neighbour_healthy(samples, took)


async def test_dns_failure(clients, neighbour: FaultServer) -> None:
    watcher = watcher_for(clients, {"url": UNRESOLVABLE_URL}, neighbour)
    took = await poll_both(watcher)
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="dns") == 1
    assert value(samples, "specwatch_up", server=FAULTY) == 0
    assert server_series(samples, FAULTY, "specwatch_speculation_enabled") == []
    assert_neighbour_healthy(samples, took)


async def test_no_route_to_the_host_is_unreachable_not_a_reset(clients, neighbour: FaultServer) -> None:
    """A server whose link was down answered "No route to host", which used to count as connection_reset."""
    watcher = watcher_for(clients, {"url": UNREACHABLE_URL}, neighbour)
    took = await poll_both(watcher)
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="unreachable") == 1
    assert value(samples, "specwatch_up", server=FAULTY) == 0
    assert_neighbour_healthy(samples, took)


@pytest.mark.parametrize("code", [errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN])
def test_every_no_route_error_is_unreachable(code: int) -> None:
    """As aiohttp raises it, at connect or on a connection that was up: from the kernel's OSError."""
    kernel = OSError(code, f"Connect call failed ('10.0.0.2', 8080): {os.strerror(code)}")
    assert reason_of(aiohttp.ClientOSError(code, os.strerror(code))) is Reason.UNREACHABLE
    try:
        raise aiohttp.ClientOSError(code, str(kernel)) from kernel
    except aiohttp.ClientOSError as err:
        assert reason_of(err) is Reason.UNREACHABLE


async def test_tls_with_a_certificate_the_client_does_not_trust(clients, neighbour: FaultServer, tmp_path) -> None:
    certs = make_certs(tmp_path)
    with FaultServer(FakeLlama.plain(), tls=server_tls(certs)) as faulty:
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour)
        took = await poll_both(watcher)
        assert faulty.count() == 0  # the handshake failed before any request was sent
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="tls") == 1
    assert value(samples, "specwatch_up", server=FAULTY) == 0
    assert_neighbour_healthy(samples, took)


async def test_tls_to_a_plain_http_server(clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.plain()) as faulty:
        watcher = watcher_for(clients, {"url": _https_to_plain(faulty, None)}, neighbour)
        took = await poll_both(watcher)
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="tls") == 1
    assert_neighbour_healthy(samples, took)


async def test_redirect_to_another_host_is_never_followed(clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.plain()) as elsewhere, FaultServer(FakeLlama.plain()) as faulty:
        faulty.play(Redirect(f"{elsewhere.url}/props", 302), "/props")
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour)
        took = await poll_both(watcher)
        assert elsewhere.count() == 0
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_poll_failures_total", server=FAULTY, reason="redirect") == 1
    assert_neighbour_healthy(samples, took)


async def test_slots_disabled_is_unknown_not_a_failure(clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.plain(slots_enabled=False)) as faulty:
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour)
        took = await poll_both(watcher)
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_up", server=FAULTY) == 1
    assert server_series(samples, FAULTY, "specwatch_poll_failures_total") == []
    assert value(samples, "specwatch_speculation_enabled", server=FAULTY, source="slots") is None
    assert value(samples, "specwatch_speculation_enabled", server=FAULTY, source="props") == 0
    assert_neighbour_healthy(samples, took)


@pytest.mark.parametrize("next_token", [{"has_next_token": True}, [{"has_next_token": True}]], ids=["object", "list"])
async def test_next_token_as_object_or_list_is_accepted(clients, neighbour: FaultServer, next_token: Any) -> None:
    with FaultServer(FakeLlama.draft()) as faulty:
        faulty.play(Mutate(_slot_field("next_token", next_token)), "/slots")
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour)
        took = await poll_both(watcher)
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_up", server=FAULTY) == 1
    assert value(samples, "specwatch_speculation_enabled", server=FAULTY, source="slots") == 1
    assert_neighbour_healthy(samples, took)


async def test_a_hostile_model_name_cannot_break_the_scrape(clients, neighbour: FaultServer) -> None:
    """A lone surrogate or a megabyte label would make every scrape fail or balloon, for every server."""
    with FaultServer(FakeLlama.plain()) as faulty:
        faulty.play(Mutate(lambda body: {**body, "model_alias": "\ud800bad" + "x" * 100_000, "build_info": "b\udfff"}), "/props")
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour)
        took = await poll_both(watcher)
    text, samples = scrape(watcher)
    assert value(samples, "specwatch_up", server=FAULTY) == 1
    [info] = server_series(samples, FAULTY, "specwatch_server_info")
    labels = dict(info[1])
    assert len(labels["model"]) <= 256 and labels["model"].startswith("\ufffdbad")
    assert labels["build"] == "b\ufffd"
    assert len(text) < 20_000
    assert_neighbour_healthy(samples, took)


@dataclass(frozen=True)
class CanaryRow:
    endpoint: str
    path: str
    fault: Any
    reason: str


def _strip_chat_logprobs(body: dict) -> dict:
    for choice in body.get("choices", []):
        choice.pop("logprobs", None)
    return body


def _strip_alternatives(body: dict) -> dict:
    for entry in body["choices"][0]["logprobs"]["content"]:
        entry.pop("top_logprobs")
    return body


def _strip_completion_probs(event: dict) -> dict:
    event.pop("completion_probabilities", None)
    return event


def _first_logprob(new: Any) -> Callable[[dict], dict]:
    def change(body: dict) -> dict:
        body["choices"][0]["logprobs"]["content"][0]["logprob"] = new
        return body

    return change


def _first_prob(new: Any) -> Callable[[dict], dict]:
    def change(body: dict) -> dict:
        body["completion_probabilities"][0]["prob"] = new
        return body

    return change


def _stream_error_line(request) -> tuple[int, dict[str, str], bytes]:
    body = b'data: {"choices":[{"index":0,"delta":{"content":" the"}}]}\n\nerror: {"message":"slot crashed"}\n\n'
    return 200, {"Content-Type": "text/event-stream"}, body


def _stream_error_event(request) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/event-stream"}, b'data: {"error":{"code":500,"message":"context shift failed"}}\n\n'


CHAT = "/v1/chat/completions"
CANARY_ROWS: dict[str, CanaryRow] = {
    "logprobs absent although requested (chat)": CanaryRow("chat", CHAT, Mutate(_strip_chat_logprobs), "no_logprobs"),
    "alternatives stripped by a proxy (chat)": CanaryRow("chat", CHAT, Mutate(_strip_alternatives), "no_logprobs"),
    "logprobs absent although requested (stream)": CanaryRow(
        "completion_stream", "/completion", Mutate(_strip_completion_probs), "no_logprobs"
    ),
    "logprob as a string": CanaryRow("chat", CHAT, Mutate(_first_logprob("-0.3")), "invalid_response"),
    "logprob NaN": CanaryRow("chat", CHAT, Mutate(_first_logprob(float("nan"))), "invalid_json"),
    "positive logprob": CanaryRow("chat", CHAT, Mutate(_first_logprob(3.0)), "invalid_response"),
    "prob above 1 (post-sampling)": CanaryRow(
        "completion_post_sampling", "/completion", Mutate(_first_prob(1.5)), "invalid_response"
    ),
    "choices missing": CanaryRow("chat", CHAT, Mutate(lambda body: {"timings": {}}), "invalid_response"),
    "501 on /completion": CanaryRow("completion", "/completion", Status(501), "not_supported"),
    "401 on the canary": CanaryRow("chat", "/v1/chat/completions", Status(401), "unauthorized"),
    "stream error line": CanaryRow("chat_stream", "/v1/chat/completions", Respond(_stream_error_line), "server_error"),
    "stream error event": CanaryRow("completion_stream", "/completion", Respond(_stream_error_event), "server_error"),
    "huge stream": CanaryRow("chat_stream", "/v1/chat/completions", Huge(declared=False), "body_too_large"),
    "trickling canary": CanaryRow("completion", "/completion", Trickle(), "timeout"),
    "truncated canary JSON": CanaryRow("completion", "/completion", Truncated(), "invalid_json"),
    "reset mid canary": CanaryRow("chat", "/v1/chat/completions", Reset(), "connection_reset"),
}


@pytest.mark.parametrize("row", CANARY_ROWS.values(), ids=CANARY_ROWS.keys())
async def test_canary_fault(row: CanaryRow, clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.plain(tokens=8)) as faulty:
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour, canary_endpoints=[row.endpoint])
        await asyncio.gather(watcher.canary(FAULTY), watcher.canary(NEIGHBOUR))
        _, before = scrape(watcher)
        assert value(before, "specwatch_canary_success", server=FAULTY, endpoint=row.endpoint) == 1
        good_at = value(before, "specwatch_canary_last_success_timestamp_seconds", server=FAULTY, endpoint=row.endpoint)

        faulty.play(row.fault, row.path)
        with structlog.testing.capture_logs() as logs:
            await asyncio.gather(watcher.canary(FAULTY), watcher.canary(NEIGHBOUR))

    text, samples = scrape(watcher)
    assert value(samples, "specwatch_canary_failures_total", server=FAULTY, endpoint=row.endpoint, reason=row.reason) == 1, text
    assert len(server_series(samples, FAULTY, "specwatch_canary_failures_total")) == 1
    assert value(samples, "specwatch_canary_success", server=FAULTY, endpoint=row.endpoint) == 0
    # The cached verdict keeps the age of its last success, so staleness shows.
    assert value(samples, "specwatch_canary_last_success_timestamp_seconds", server=FAULTY, endpoint=row.endpoint) == good_at
    failed = [e for e in logs if e["event"] == "canary_failed" and e["server"] == FAULTY]
    assert [e["reason"] for e in failed] == [row.reason]
    assert value(samples, "specwatch_canary_success", server=NEIGHBOUR, endpoint=row.endpoint) == 1
    assert value(samples, "specwatch_canary_placeholder_ratio", server=NEIGHBOUR, endpoint=row.endpoint) == 1.0
    assert server_series(samples, NEIGHBOUR, "specwatch_canary_failures_total") == []


async def test_huge_draft_count_cannot_break_the_scrape(clients, neighbour: FaultServer) -> None:
    with FaultServer(FakeLlama.draft(tokens=8)) as faulty:
        faulty.play(Mutate(lambda body: {**body, "timings": {"draft_n": 10**400, "draft_n_accepted": 10**400}}), "/completion")
        watcher = watcher_for(clients, {"url": faulty.url}, neighbour, canary_endpoints=["completion"])
        await asyncio.gather(watcher.canary(FAULTY), watcher.canary(NEIGHBOUR))
    _, samples = scrape(watcher)
    assert value(samples, "specwatch_canary_success", server=FAULTY, endpoint="completion") == 1
    assert value(samples, "specwatch_canary_draft_tokens", server=FAULTY, endpoint="completion") is None
    assert value(samples, "specwatch_canary_placeholder_ratio", server=FAULTY, endpoint="completion") == 1.0
    assert value(samples, "specwatch_canary_success", server=NEIGHBOUR, endpoint="completion") == 1


ROUNDS = 10


@pytest.mark.slow
async def test_timeouts_under_load_never_strand_a_connection(clients) -> None:
    """A timeout that lands while a connection is being set up or torn down never leaves it checked out, its socket open."""
    import time

    servers = [FaultServer().play(Hang(0.6), "/props").start() for _ in range(20)]
    try:
        config = Settings(servers=[{"name": f"s{i}", "url": s.url} for i, s in enumerate(servers)], poll_timeout=0.3)
        watcher = Watcher(config, Fleet(config.servers, config.canary_endpoints), Fetcher(clients(), config.max_response_bytes))

        async def busy_loop() -> None:
            while True:  # a loaded event loop: deadlines land while cleanups are still running
                time.sleep(0.003)
                await asyncio.sleep(0)

        load = asyncio.create_task(busy_loop())
        for _ in range(ROUNDS):
            await asyncio.gather(*(watcher.poll(f"s{i}") for i in range(len(servers))))
        load.cancel()
        await asyncio.sleep(1.0)  # every server has hung up by now
        assert stranded_sockets({s.port for s in servers}) == 0
        _, samples = scrape(watcher)
        assert all(value(samples, "specwatch_poll_failures_total", server=f"s{i}", reason="timeout") == ROUNDS for i in range(20))
    finally:
        for server in servers:
            server.stop()
