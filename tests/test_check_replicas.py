"""`specwatch check URL URL ...`: every server checked, and those of one model name compared as the daemon compares them."""

from __future__ import annotations

import json

import pytest

from specwatch.endpoints import Endpoint
from specwatch.gate.check import render_checks, run_checks
from specwatch.settings.targets import ServerConfig
from tests.support.fakes import fake_fleet
from tests.support.wire import FakeLlama


async def _checks(fakes: dict[str, FakeLlama], **kw: object):
    servers = [ServerConfig(name="check", url=f"http://{host}:8080") for host in fakes]
    return await run_checks(servers, endpoints=kw.pop("endpoints", [Endpoint.COMPLETION, Endpoint.CHAT]), tokens=16,
                            timeout=5, connect=lambda: fake_fleet(fakes).client(), **kw)


def _requests(fake: FakeLlama, path: str) -> int:
    return sum(1 for r in fake.requests if r.path == path)


async def test_replicas_of_one_file_agree_and_pass() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain()})
    assert (report.verdict, report.exit_code, report.disagreeing) == ("clean", 0, [])
    assert {entry.agreement for entry in report.peers.values()} == {True} and len(report.peers) == 3
    assert "worst of 3 checked" in report.summary


async def test_another_quantization_disagrees_at_once_by_fingerprint() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(ftype="Q4_0")}
    report = await _checks(fakes)
    assert (report.verdict, report.exit_code, report.disagreeing) == ("clean", 1, ["http://c:8080"])
    entry = report.peers["http://c:8080"]
    assert (entry.kind, entry.held_against) == ("fingerprint", ["http://a:8080", "http://b:8080"])
    assert "held against http://a:8080, http://b:8080" in report.summary
    # Noise-free: checked once, never again.
    assert _requests(fakes["c"], "/completion") == 1


async def test_other_answers_are_confirmed_by_checking_again_before_they_count() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(cycle_shift=2)}
    report = await _checks(fakes, confirmations=3)
    assert (report.exit_code, report.disagreeing, report.peers["http://c:8080"].kind) == (1, ["http://c:8080"], "tokens")
    assert _requests(fakes["a"], "/completion") == 3


async def test_a_group_of_two_that_differ_names_both() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(ftype="Q4_0")})
    assert report.disagreeing == ["http://a:8080", "http://b:8080"]


async def test_servers_of_other_model_names_are_not_compared() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(model_alias="other.gguf", ftype="Q4_0")})
    assert (report.exit_code, report.peers) == (0, {})


async def test_fill_ins_stay_the_verdict_and_a_speculating_replica_agrees_on_tokens() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(), "d": FakeLlama.draft()})
    assert (report.verdict, report.exit_code, report.disagreeing) == ("fill_ins", 1, [])
    assert report.summary.startswith("http://d:8080: the server serves fill-in logprobs")
    assert report.peers["http://d:8080"].agreement is True


@pytest.mark.parametrize("as_json", [False, True])
async def test_the_report_reads_as_text_and_json(as_json: bool) -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(ftype="Q4_0")})
    if as_json:
        document = json.loads(json.dumps(report.as_json()))
        assert list(document) == ["verdict", "exit_code", "summary", "disagreeing", "peers", "servers"]
        assert document["peers"]["http://c:8080"]["kind"] == "fingerprint" and len(document["servers"]) == 3
    else:
        text = render_checks(report)
        assert "peers tiny: http://c:8080 DISAGREES (fingerprint)" in text and "server http://a:8080" in text
