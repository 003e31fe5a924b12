"""`specwatch check URL URL ...`: every server checked, and those of one model name compared with the daemon's test, one
pool prompt a round, as many rounds as the test needs to decide, within a bound; a refusal leads the first line."""

from __future__ import annotations

import json
import math

import pytest

from specwatch.core.evidence import ALLOWANCE, FLOOR, THRESHOLD
from specwatch.endpoints import Endpoint
from specwatch.gate.replicas import ROUNDS, SETTLED, render_checks, run_checks
from specwatch.probe.peerprobe import PATH, prompts
from specwatch.settings.targets import ServerConfig
from tests.support.fakes import fake_fleet
from tests.support.wire import TOKEN_PROBABILITY, FakeLlama


async def _checks(fakes: dict[str, FakeLlama], **kw: object):
    servers = [ServerConfig(name="check", url=f"http://{host}:8080") for host in fakes]
    fleet = fake_fleet(fakes)
    return await run_checks(servers, endpoints=kw.pop("endpoints", [Endpoint.COMPLETION, Endpoint.CHAT]), tokens=16,
                            timeout=5, connect=fleet.client, **kw)


def _asked(fake: FakeLlama) -> int:
    """How often the peer probe was asked of a look-alike."""
    pool = set(prompts())
    return sum(1 for r in fake.requests if r.path == PATH and r.json().get("prompt") in pool)


async def test_replicas_of_one_file_agree_and_pass_once_enough_rounds_were_answered() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain()}
    report = await _checks(fakes)
    assert (report.verdict, report.exit_code, report.disagreeing, report.undecided) == ("clean", 0, [], [])
    assert {entry.agreement for entry in report.peers.values()} == {True} and len(report.peers) == 3
    assert "worst of 3 checked" in report.summary
    assert [_asked(f) for f in fakes.values()] == [SETTLED] * 3  # settled then, and asked no further


async def test_another_quantization_differs_at_once_by_fingerprint_and_leads_the_first_line() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(ftype="Q4_0")}
    report = await _checks(fakes)
    assert (report.verdict, report.exit_code, report.disagreeing) == ("clean", 1, ["http://c:8080"])
    entry = report.peers["http://c:8080"]
    assert (entry.kind, entry.held_against) == ("fingerprint", ["http://a:8080", "http://b:8080"])
    assert report.summary.startswith("1 replica(s) differ from their peer group")
    assert "held against http://a:8080, http://b:8080" in report.summary
    assert render_checks(report).startswith("REFUSED (replicas differ; fill-in verdict clean): 1 replica(s) differ")


async def test_answers_that_differ_are_decided_by_the_peer_probe() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(token_probability=0.3)}
    report = await _checks(fakes)
    assert (report.exit_code, report.disagreeing, report.peers["http://c:8080"].kind) == (1, ["http://c:8080"], "answers")
    assert report.peers["http://a:8080"].agreement is True


async def test_a_difference_the_test_cannot_decide_within_its_bound_is_undecided_never_clean() -> None:
    # Every listed logprob moved by just over the allowance: half the threshold's worth of evidence in ROUNDS rounds.
    apart = FLOOR * (ALLOWANCE + THRESHOLD / (2 * ROUNDS))
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(),
             "c": FakeLlama.plain(token_probability=TOKEN_PROBABILITY * math.exp(-apart))}
    report = await _checks(fakes)
    assert (report.verdict, report.exit_code, report.disagreeing, report.undecided) == ("clean", 2, [], ["http://c:8080"])
    assert report.summary.startswith("the peer test has not told whether http://c:8080 answer")
    assert render_checks(report).startswith("UNDECIDED (replicas not told apart; fill-in verdict clean)")
    assert "peers tiny: http://c:8080 UNDECIDED" in render_checks(report)
    assert [_asked(f) for f in fakes.values()] == [ROUNDS] * 3  # asked up to the bound, no further


async def test_a_group_of_two_that_differ_names_both() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(ftype="Q4_0")})
    assert report.disagreeing == ["http://a:8080", "http://b:8080"]
    assert report.peers["http://a:8080"].split


async def test_servers_of_other_model_names_are_neither_asked_nor_compared() -> None:
    fakes = {"a": FakeLlama.plain(), "b": FakeLlama.plain(model_alias="other.gguf", ftype="Q4_0")}
    report = await _checks(fakes)
    assert (report.exit_code, report.peers) == (0, {})
    assert [_asked(f) for f in fakes.values()] == [0, 0]


async def test_fill_ins_stay_the_verdict_and_a_speculating_replica_agrees_on_its_texts() -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(), "d": FakeLlama.draft()})
    assert (report.verdict, report.exit_code, report.disagreeing) == ("fill_ins", 1, [])
    assert report.summary.startswith("http://d:8080: the server serves fill-in logprobs")
    assert report.peers["http://d:8080"].agreement is True


@pytest.mark.parametrize("as_json", [False, True])
async def test_the_report_reads_as_text_and_json(as_json: bool) -> None:
    report = await _checks({"a": FakeLlama.plain(), "b": FakeLlama.plain(), "c": FakeLlama.plain(ftype="Q4_0")})
    if as_json:
        document = json.loads(json.dumps(report.as_json()))
        assert list(document) == ["verdict", "exit_code", "summary", "disagreeing", "undecided", "peers", "servers"]
        assert document["peers"]["http://c:8080"]["kind"] == "fingerprint" and len(document["servers"]) == 3
    else:
        text = render_checks(report)
        assert "peers tiny: http://c:8080 DIFFERS (fingerprint)" in text and "server http://a:8080" in text


async def _reference_of(fake: FakeLlama, path, prompts_count: int = 24):
    """A reference recorded from `fake` as `specwatch reference` records one."""
    from specwatch.core import reference
    from specwatch.gate.options import check_server
    from specwatch.gate.recording import record

    await record(check_server("http://trusted:8080"), path, count=prompts_count, timeout=5,
                 connect=fake_fleet({"trusted": fake}).client)
    return reference.read(path)


async def test_a_pair_held_to_a_reference_names_its_odd_member(tmp_path) -> None:
    held = await _reference_of(FakeLlama.plain(), tmp_path / "tiny.reference.json")
    fakes = {"a": FakeLlama.plain(), "c": FakeLlama.plain(token_probability=0.3)}
    report = await _checks(fakes, reference=held)
    assert (report.exit_code, report.disagreeing) == (1, ["http://c:8080"])  # not both, as without it
    assert not report.peers["http://c:8080"].split and report.peers["http://a:8080"].agreement is True
    assert "from the reference" in report.peers["http://c:8080"].detail
    asked = {r.json()["prompt"] for r in fakes["a"].requests if r.path == PATH and r.json().get("prompt") in set(prompts())}
    assert asked <= {prompts()[i] for i in held.prompts}  # only what the reference recorded


async def test_one_server_held_to_a_reference_is_compared_and_one_that_matches_passes(tmp_path) -> None:
    held = await _reference_of(FakeLlama.plain(), tmp_path / "tiny.reference.json")
    report = await _checks({"c": FakeLlama.plain(token_probability=0.3)}, reference=held)
    assert (report.exit_code, report.disagreeing) == (1, ["http://c:8080"])
    assert "differ from the reference or their peer group" in report.summary
    assert "held against the reference" in report.summary
    report = await _checks({"a": FakeLlama.plain()}, reference=held)
    assert (report.exit_code, report.disagreeing, report.undecided) == (0, [], [])
    assert report.peers["http://a:8080"].agreement is True
