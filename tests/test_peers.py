"""Replicas compared: groups, fingerprints (content counts, deployment is shown), the difference of two answers, the
sequential test, and each member held against its floor(n/2)-th nearest (pairs and splits included)."""

from __future__ import annotations

import math

import pytest

from specwatch.core.evidence import ALLOWANCE, CAP, MARGIN, THRESHOLD, Difference, Evidence, difference, score, spread
from specwatch.core.peers import ANSWERS, FINGERPRINT, OPT_OUT, Fingerprint, Peer, Standing, compare, group_of
from specwatch.core.report import peers_entry
from specwatch.probe.logprobs import Logprobs, logprobs_of
from specwatch.probe.peerprobe import read
from specwatch.probe.readers import Token

Q4KM = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf", ftype="Q4_K - Medium", size="253", n_params="268",
                   n_vocab="262144", n_ctx_train="32768", n_embd="640")
Q40 = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf", ftype="Q4_0", size="241", n_params="268",
                  n_vocab="262144", n_ctx_train="32768", n_embd="640")
TEXT = ("the", " cat", " sat", " on")
VALUES = (-0.1, -0.2, -0.3, -0.4)


def answer(values: tuple[float | None, ...] = VALUES, texts: tuple[str, ...] = TEXT,
           tops: tuple[tuple[object, ...], ...] | None = None) -> Logprobs:
    """An answer whose every token lists itself and " dog" 1.5 nats below it, unless `tops` says otherwise."""
    tokens = []
    for i, (value, text) in enumerate(zip(values, texts, strict=True)):
        top = tops[i] if tops is not None else (() if value is None else (text, value, " dog", value - 1.5))
        tokens.append(Token(value, len(top) // 2 if value is not None else 0, text=text, top=top))
    return logprobs_of(tokens)


OFF = answer((-0.1, -0.9, -1.0, -1.1))
"""0.525 nats a value from answer(): 17.5 times the margin."""


def group(*answers: Logprobs, noise: float = 0.0, fingerprints: tuple[Fingerprint, ...] = (),
          questions: tuple[int, ...] = (0,)) -> dict[str, Peer]:
    """Members r0, r1, ... giving their answer to each of `questions`, the noise measured on each: a comparison that
    counts every answer afresh counts one per member and question."""
    prints = fingerprints or (Q4KM,) * len(answers)
    return {f"r{i}": Peer(fp, {q: a for q in questions}, {q: noise for q in questions})
            for i, (a, fp) in enumerate(zip(answers, prints, strict=True))}


def decided(peers: dict[str, Peer], times: int = 1):
    """`times` comparisons, each counting every answer afresh, the evidence carried from one to the next."""
    evidence: dict[str, Evidence] = {}
    judgement = compare(peers)
    for _ in range(times - 1):
        evidence = {k: c.evidence for k, c in judgement.members.items()}
        judgement = compare(peers, before=evidence)
    return judgement


@pytest.mark.parametrize(("configured", "reported", "whole", "expected"), [
    (None, "gemma", True, "gemma"),
    (None, "gemma-Q4_K_M.gguf", True, "gemma-Q4_K_M"),  # a file and a router id of its stem meet
    (None, "/models/a/gemma.gguf", True, "gemma"),  # a server without an alias reports the path
    (None, "org/gemma", True, "org/gemma"),
    (None, "", True, None),
    ("eval", "gemma", True, "eval"),
    ("eval", "gemma", False, "eval/gemma"),  # a router's models stay apart within its group
    (OPT_OUT, "gemma", True, None),
])
def test_the_group_of_a_model(configured: str | None, reported: str, whole: bool, expected: str | None) -> None:
    assert group_of(configured, reported, whole_server=whole) == expected


# (case, b, mean, values compared, parted at): against answer() = the, cat, sat, on at -0.1 -0.2 -0.3 -0.4.
DIFFERENCES = {
    "alike": (answer(), 0.0, 4, None),
    "one value moved": (answer((-0.1, -0.3, -0.3, -0.4)), 0.025, 4, None),
    "a fill-in's value is no measurement": (answer((-0.1, None, -0.3, -0.4)), 0.0, 3, None),
    "a shorter answer, over its length": (answer(VALUES[:2], TEXT[:2]), 0.0, 2, None),
    # Parting at token 1 where b is sure of " dog": its log-odds moved by 1.5 (a's) + 1.5 (b's) = 3.0.
    "a parting where both were sure": (answer(texts=("the", " dog", " sat", " on")), 3.0 / 2, 2, 1),
    # A near-tie flipped: a gives " dog" -0.25 (0.05 below " cat"), b gives " cat" -0.24 (0.04 below " dog").
    "a near-tie flipped": (answer((-0.1, -0.2, -0.3, -0.4), ("the", " dog", " sat", " on"),
                                  (("the", -0.1), (" dog", -0.2, " cat", -0.24), (" sat", -0.3), (" on", -0.4))),
                           None, 2, 1),
    # b does not list a's token: it is at most as likely as b's lowest alternative (a lower bound of the move).
    "the other's token not listed": (answer((-0.1, -0.2, -0.3, -0.4), ("the", " fox", " sat", " on"),
                                            (("the", -0.1), (" fox", -0.2, " owl", -4.2), (" sat", -0.3), (" on", -0.4))),
                                     None, 2, 1),
    # A fill-in where the texts part: only a's side is known (its log-odds of " cat" over " dog", 1.5).
    "a fill-in where they part": (answer((-0.1, None, None, None), ("the", " dog", " sat", " on")), 1.5 / 2, 2, 1),
}


@pytest.mark.parametrize("case", DIFFERENCES, ids=DIFFERENCES)
def test_the_difference_of_two_answers(case: str) -> None:
    b, mean, values, parted = DIFFERENCES[case]
    found = difference(answer(), b)
    assert (found.values, found.parted) == (values, parted)
    if mean is not None:
        assert found.mean == pytest.approx(mean)
    assert difference(b, answer()).mean == pytest.approx(found.mean)  # the same both ways


def test_a_near_tie_moves_the_difference_by_little_and_a_sure_parting_by_much() -> None:
    tie = DIFFERENCES["a near-tie flipped"][0]
    sure = DIFFERENCES["the other's token not listed"][0]
    # a puts " dog" 0.05 below " cat", b puts " cat" 0.04 below " dog": their log-odds moved by 0.09 in all.
    assert difference(answer(tops=(("the", -0.1), (" cat", -0.2, " dog", -0.25), (" sat", -0.3), (" on", -0.4))),
                      tie).mean == pytest.approx((0.0 + 0.05 + 0.04) / 2)
    assert difference(answer(), sure).mean == pytest.approx((0.0 + 1.5 + 4.0) / 2)


def test_nothing_in_common_says_nothing() -> None:
    assert difference(answer((-0.1, None), ("a", "b")), answer((None, None), ("x", "y"))).nothing is False
    assert difference(answer((None, None), ("a", "b")), answer((None, None), ("x", "y"))).nothing


def test_the_spread_of_a_burst_is_its_largest_difference() -> None:
    assert spread([answer()]) == 0.0
    assert spread([answer(), answer((-0.1, -0.3, -0.3, -0.4)), answer((-0.1, -0.2, -0.5, -0.4))]) == pytest.approx(0.075)


@pytest.mark.parametrize(("scores", "total", "decides"), [
    ([1.0] * 50, 0.0, False),  # within the noise, however many answers
    ([CAP * 3], CAP - ALLOWANCE, False),  # one answer never decides, however gross
    ([CAP * 3] * 2, THRESHOLD, True),  # two gross answers do
    ([5.0] * 3, 9.0, False),
    ([5.0] * 4, THRESHOLD, True),  # five times the noise, four answers
    ([5.0, 5.0, 0.0, 0.0, 0.0, 0.0, 5.0], 3.0, False),  # answers within the noise wear the evidence down
    ([3.0] * 12, THRESHOLD, True),  # a small difference that persists decides, later
    ([float("nan"), 5.0], 3.0, False),  # nothing compared counts for nothing
])
def test_the_sequential_test(scores: list[float], total: float, decides: bool) -> None:
    evidence = Evidence()
    for each in scores:
        evidence = evidence.after(each)
    assert (evidence.total, evidence.decided) == (pytest.approx(total), decides)
    assert evidence.answers == sum(1 for s in scores if not math.isnan(s))


def test_a_decision_holds_until_the_evidence_wears_down_to_nothing() -> None:
    evidence = Evidence().after(CAP).after(CAP)
    assert evidence.decided
    for _ in range(int(THRESHOLD / ALLOWANCE) - 1):
        evidence = evidence.after(0.0)
        assert evidence.decided, evidence  # an answer within the noise does not undo it
    assert not evidence.after(0.0).decided  # a run of them does
    assert not Evidence().after(5.0).after(5.0).after(5.0).decided  # below the threshold nothing was decided


def test_a_score_is_the_difference_over_the_noise_never_below_the_margin() -> None:
    assert score(Difference(0.2, 4), 0.05) == pytest.approx(4.0)
    assert score(Difference(0.2, 4), 0.0) == pytest.approx(0.2 / MARGIN)


def test_one_replica_off_the_majority_differs_and_the_others_agree() -> None:
    off = OFF
    judgement = decided(group(answer(), off, answer()), times=2)
    members = judgement.members
    assert (members["r1"].agreement, members["r1"].kind, members["r1"].held_against) == (False, ANSWERS, ("r0", "r2"))
    assert members["r0"].agreement is True and members["r2"].agreement is True
    assert (judgement.agreement, judgement.split) == (False, False)
    assert members["r1"].detail.startswith("question 0: 0.525 nats from its nearest peers, 17.5 times")
    assert decided(group(answer(), off, answer()), times=1).members["r1"].agreement is True  # one answer never decides


def test_within_the_measured_noise_replicas_agree() -> None:
    off = answer((-0.1, -0.3, -0.4, -0.5))  # 0.075 per value
    assert decided(group(answer(), off, answer(), noise=0.08), times=20).agreement is True
    assert decided(group(answer(), off, answer(), noise=0.0), times=24).members["r1"].agreement is False  # 2.5 times


def test_a_pair_that_differs_is_held_to_the_gap_itself_and_splits() -> None:
    off = OFF
    pair = decided(group(answer(), off, noise=0.105), times=5)  # 5 times the noise: 3 an answer
    assert {k: (c.agreement, c.held_against) for k, c in pair.members.items()} == {
        "r0": (False, ("r1",)), "r1": (False, ("r0",))}
    assert pair.split and pair.agreement is False
    # The same gap in a trio decides for the odd one alone: in a pair it is not halved.
    assert pair.members["r0"].evidence.last == decided(group(answer(), off, answer(), noise=0.105)).members["r1"].evidence.last


def test_a_two_two_split_leaves_no_majority() -> None:
    off = OFF
    judgement = decided(group(answer(), answer(), off, off), times=2)
    assert judgement.split and all(c.agreement is False for c in judgement.members.values())


def test_a_three_two_split_keeps_the_majority() -> None:
    off = OFF
    members = decided(group(answer(), answer(), answer(), off, off), times=2).members
    assert [members[f"r{i}"].agreement for i in range(5)] == [True, True, True, False, False]
    assert members["r3"].held_against == ("r0", "r1", "r2")


def test_another_file_content_differs_at_once_and_a_deployment_only_shows() -> None:
    renamed = Fingerprint(**{**vars(Q4KM), "build": "b2", "file": "gemma-copy.gguf"})
    members = compare(group(answer(), answer(), answer(), fingerprints=(Q4KM, Q40, renamed))).members
    assert (members["r1"].agreement, members["r1"].kind, members["r1"].held_against) == (False, FINGERPRINT, ("r0", "r2"))
    assert members["r1"].detail == "ftype 'Q4_0', the group's 'Q4_K - Medium'"
    assert (members["r2"].agreement, members["r2"].kind) == (True, None)
    assert members["r2"].deployment == "build 'b2', the group's 'b1'"


def test_a_rolling_upgrade_at_half_of_a_pool_keeps_every_replica_agreeing() -> None:
    upgraded = Fingerprint(**{**vars(Q4KM), "build": "b2"})
    members = compare(group(answer(), answer(), answer(), answer(), fingerprints=(Q4KM, upgraded) * 2)).members
    assert all(c.agreement is True for c in members.values())
    assert {c.deployment for c in members.values()} == {"build 'b1', the group's others", "build 'b2', the group's others"}


def test_a_field_a_server_does_not_report_is_not_held_against_it() -> None:
    unknown = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf")  # no /v1/models meta
    assert compare(group(answer(), answer(), fingerprints=(Q4KM, unknown))).agreement is True


def test_no_question_is_judged_before_every_member_answered_it_and_had_its_noise_measured() -> None:
    peers = group(answer(), OFF, answer())
    peers["r2"] = Peer(Q4KM, {0: answer()}, {})  # its noise not measured yet
    peers["r1"] = Peer(Q4KM, {q: a for q, a in peers["r1"].answers.items() if q != 1}, peers["r1"].noise)
    judgement = compare(peers)
    assert {k: c.evidence.answers for k, c in judgement.members.items()} == {"r0": 0, "r1": 0, "r2": 0}


def test_each_fresh_answer_counts_once_however_often_the_group_is_compared() -> None:
    peers = group(answer(), OFF, answer())
    first = compare(peers, fresh={"r1": {0}})
    assert first.members["r1"].evidence.answers == 1
    again = compare(peers, before={k: c.evidence for k, c in first.members.items()}, fresh={})
    assert again.members["r1"].evidence == first.members["r1"].evidence


def test_members_with_nothing_to_compare_say_nothing() -> None:
    judgement = compare({"a": Peer(), "b": Peer(Q4KM), "c": Peer(None, {0: answer()}, {0: 0.0})})
    assert {k: c.agreement for k, c in judgement.members.items()} == {"a": None, "b": None, "c": None}
    assert judgement.agreement is None


def test_many_alike_replicas_cost_their_distinct_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.core import peers as module

    calls = 0
    real = module.difference

    def counted(a: Logprobs, b: Logprobs) -> Difference:
        nonlocal calls
        calls += 1
        return real(a, b)

    monkeypatch.setattr(module, "difference", counted)
    peers = {f"r{i}": Peer(Q4KM, {0: answer()}, {0: 0.0}) for i in range(500)}
    peers["odd"] = Peer(Q4KM, {0: OFF}, {0: 0.0})
    judgement = compare(peers)
    assert calls == 2  # the two distinct answers, each against the other
    assert judgement.members["odd"].evidence.last == pytest.approx(17.5)
    assert judgement.members["r0"].evidence.last == 0.0


def test_the_peer_probe_reads_an_answer_and_what_model_gave_it() -> None:
    def entry(text: str, value: float, top: list[tuple[str, float]]) -> dict:
        return {"id": 1, "token": text, "logprob": value, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}

    body = {"model": "gemma", "choices": [{"text": " A cat", "logprobs": {"content": [
        entry(" A", -0.5, [(" A", -0.5), (" The", -1.1)]), entry(" cat", 0.0, [])]}}]}
    got, model = read(body)
    assert (got.texts, model) == ((" A", " cat"), "gemma")
    assert got.values[0] == -0.5 and math.isnan(got.values[1])  # a fill-in: its value is no measurement
    assert got.value_of(0, " The") == -1.1 and got.value_of(1, " The") is None


def test_the_verdicts_document_shows_a_standing() -> None:
    off = OFF
    members = decided(group(answer(), off, noise=0.105), times=5).members
    shown = peers_entry(Standing("gemma", members["r1"], False, True))
    assert (shown.agreement, shown.kind, shown.held_against, shown.evidence, shown.split) == (
        False, ANSWERS, ["r0"], 1.0, True)
    pending = peers_entry(Standing("gemma", compare(group(answer(), off, noise=0.105)).members["r1"], True, False))
    assert (pending.agreement, pending.kind, pending.held_against, pending.evidence) == (True, None, [], 0.25)


def test_the_verdicts_document_reads_back_a_peers_object() -> None:
    from dataclasses import asdict

    from specwatch.core.report import read_verdicts

    model = {"model": "gemma", "status": "loaded", "verdict": "clean", "key": "", "age_seconds": 1.0,
             "poll_age_seconds": 1.0, "max_age_seconds": 9.0, "max_poll_age_seconds": 9.0, "fresh": True,
             "peers": {"group": "gemma", "agreement": False, "kind": "fingerprint", "held_against": ["b", "c"],
                       "evidence": 0.0, "group_agreement": False, "split": False,
                       "detail": "ftype 'Q4_0', the group's 'Q4_K - Medium'", "deployment": ""}}
    document = {"specwatch": "0.5", "generated_at": 0.0, "poll_interval_seconds": 15.0, "canary_interval_seconds": 60.0,
                "verdicts": [], "servers": [{"server": "a", "url": "http://a:1", "labels": {}, "router": False, "up": True,
                                             "models": [model]}]}
    read_back = read_verdicts(document)
    peers_of = read_back.servers[0].models[0].peers
    assert peers_of is not None and (peers_of.agreement, peers_of.held_against) == (False, ["b", "c"])
    assert asdict(read_back)["servers"][0]["models"][0]["peers"] == model["peers"]
    # A 0.4 daemon's peers object (largest_difference, no evidence) is read too.
    model["peers"] = {"group": "gemma", "agreement": True, "kind": None, "held_against": [], "largest_difference": 0.1,
                      "detail": ""}
    assert read_verdicts(document).servers[0].models[0].peers.agreement is True
    del model["peers"]  # a daemon before 0.4 says nothing of peers
    assert read_verdicts(document).servers[0].models[0].peers is None
