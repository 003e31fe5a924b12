"""`specwatch check`: the verdict and exit code for each kind of server, including a build that drafts honestly."""

from __future__ import annotations

import json

import httpx
import pytest

from exporter.check import render_text, run_check
from exporter.probe.canary import Endpoint
from exporter.settings.schema import ServerConfig
from exporter.verdict import Verdict
from tests.support.wire import FakeLlama


async def _check(fake: FakeLlama, **server_kw: object):
    server = ServerConfig(name="check", url="http://srv:8080", **server_kw)
    client = httpx.AsyncClient(transport=httpx.MockTransport(fake))
    return await run_check(server, endpoints=list(Endpoint), tokens=16, timeout=5, client=client)


async def test_plain_server_is_clean() -> None:
    report = await _check(FakeLlama.plain())
    assert (report.verdict, report.exit_code) == ("clean", Verdict.CLEAN.exit_code)
    assert report.speculation_slots is False
    assert all(e.fill_ins == 0 and e.tokens == 32 for e in report.endpoints)


async def test_draft_server_serves_fill_ins() -> None:
    report = await _check(FakeLlama.draft())
    assert (report.verdict, report.exit_code) == ("fill_ins", Verdict.FILL_INS.exit_code)
    assert {e.endpoint: e.fill_in_ratio for e in report.endpoints} == {e.value: 1.0 for e in Endpoint}
    assert "do not score" in report.summary


async def test_speculating_server_that_never_drafted_is_unproven_after_a_second_round() -> None:
    fake = FakeLlama(speculative=True, drafts=0)
    report = await _check(fake)
    assert (report.verdict, report.exit_code) == ("unproven", Verdict.UNPROVEN.exit_code)
    assert sum(r.method == "POST" for r in fake.requests) == 2 * len(Endpoint)


async def test_a_plain_server_gets_one_round() -> None:
    fake = FakeLlama.plain()
    await _check(fake)
    assert sum(r.method == "POST" for r in fake.requests) == len(Endpoint)


async def test_speculating_server_without_draft_timings_is_unproven() -> None:
    report = await _check(FakeLlama(speculative=True, drafts=None))
    assert (report.verdict, report.exit_code) == ("unproven", Verdict.UNPROVEN.exit_code)


async def test_a_build_that_drafts_and_returns_real_alternatives_is_clean() -> None:
    report = await _check(FakeLlama.future_fixed())
    assert (report.verdict, report.exit_code) == ("clean", Verdict.CLEAN.exit_code)
    assert "drafted" in report.summary


async def test_slots_disabled_and_no_fill_ins_is_clean() -> None:
    report = await _check(FakeLlama.plain(slots_enabled=False))
    assert (report.verdict, report.exit_code, report.speculation_slots) == ("clean", Verdict.CLEAN.exit_code, None)


async def test_unauthorised_is_unchecked() -> None:
    report = await _check(FakeLlama.plain(api_key="secret"))
    assert (report.verdict, report.exit_code) == ("unchecked", Verdict.UNCHECKED.exit_code)
    assert "unauthorized" in report.summary


async def test_right_key_passes(tmp_path) -> None:
    key = tmp_path / "k"
    key.write_text("secret")
    report = await _check(FakeLlama.plain(api_key="secret"), api_key_file=key)
    assert report.exit_code == Verdict.CLEAN.exit_code


async def test_no_logprobs_is_unchecked_not_clean() -> None:
    def stripped(request: httpx.Request) -> httpx.Response:
        response = FakeLlama.plain()(request)
        if request.method == "POST":
            return httpx.Response(200, json={"choices": [{"message": {"content": "x"}}], "content": "x"})
        return response

    server = ServerConfig(name="check", url="http://srv:8080")
    report = await run_check(server, endpoints=[Endpoint.CHAT, Endpoint.COMPLETION], tokens=8, timeout=5,
                             client=httpx.AsyncClient(transport=httpx.MockTransport(stripped)))
    assert (report.verdict, report.exit_code) == ("unchecked", Verdict.UNCHECKED.exit_code)
    assert "no_logprobs" in report.summary


async def test_text_and_json_renderings_carry_per_endpoint_counts() -> None:
    report = await _check(FakeLlama(speculative=True, fill_ins={3, 4}, drafts=4))
    text = render_text(report)
    assert text.startswith("FILL_INS:")
    assert "completion_post_sampling   fill-ins 2/31 after the first" in text
    data = json.loads(json.dumps(report.as_json()))
    assert data["exit_code"] == 1 and data["endpoints"][0]["fill_ins"] == 2


@pytest.mark.parametrize("fake", [FakeLlama.plain(), FakeLlama.draft()])
async def test_mixed_failure_never_reads_as_clean(fake: FakeLlama) -> None:
    calls = 0

    def flaky(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        if request.url.path == "/completion":
            calls += 1
            return httpx.Response(500, text="boom")
        return fake(request)

    server = ServerConfig(name="check", url="http://srv:8080")
    report = await run_check(server, endpoints=list(Endpoint), tokens=8, timeout=5,
                             client=httpx.AsyncClient(transport=httpx.MockTransport(flaky)))
    assert report.exit_code != Verdict.CLEAN.exit_code and calls == 3
