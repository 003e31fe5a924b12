"""Replicas compared: groups, fingerprints (content counts, deployment is shown), the difference of two answers, the
sequential test, each member scored against its group round by round (pairs, splits, references, any size), and a
member that stops answering never left agreeing."""

from __future__ import annotations

import math

import pytest

from specwatch.core.evidence import (
    ALLOWANCE,
    CAP,
    FLOOR,
    GROSS,
    GROSS_ROUNDS,
    GROSS_WINDOW,
    MISSED,
    NOISY,
    THRESHOLD,
    UNIFORM_FLOOR,
    Cusum,
    Difference,
    difference,
    spread,
)
from specwatch.core.peers import (
    ANSWERS,
    FINGERPRINT,
    OPT_OUT,
    Comparing,
    Fingerprint,
    Judgement,
    Peer,
    Reference,
    Standing,
    group_of,
    score_round,
)
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


OFF = answer((-0.1, -1.4, -1.5, -1.6))
OFF_BY = 0.9
"""OFF is 0.9 nats a token from answer(): over GROSS times the floor, so three rounds decide."""


def group(*answers: Logprobs, noise: float | None = None, fingerprints: tuple[Fingerprint, ...] = (),
          rounds: int = 1) -> dict[str, Peer]:
    """Members r0, r1, ... each giving its answer to rounds 0 .. rounds-1, with `noise` its own."""
    prints = fingerprints or (Q4KM,) * len(answers)
    return {f"r{i}": Peer(fp, {q: a for q in range(rounds)}, noise)
            for i, (a, fp) in enumerate(zip(answers, prints, strict=True))}


def decided(peers: dict[str, Peer], reference: Reference | None = None) -> Judgement[str]:
    """Every round the members answered, counted once, then judged."""
    test: Comparing[str] = Comparing(reference, salt=0)
    test.count(peers, before=max((q for p in peers.values() for q in p.answers), default=0) + 1)
    return test.judge(peers)


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


# (case, b, mean, tokens compared, parted at): against answer() = the, cat, sat, on at -0.1 -0.2 -0.3 -0.4, each
# listing itself and " dog" 1.5 below it.
DIFFERENCES = {
    "alike": (answer(), 0.0, 4, None),
    "one value moved": (answer((-0.1, -0.3, -0.3, -0.4)), 0.025, 4, None),
    "a fill-in's value is no measurement": (answer((-0.1, None, -0.3, -0.4)), 0.0, 3, None),
    "a shorter answer, over its length": (answer(VALUES[:2], TEXT[:2]), 0.0, 2, None),
    # Parting at token 1 where b is sure of " dog" and puts " cat" 1.5 below: both alternatives moved by 1.5.
    "a parting where both were sure": (answer(texts=("the", " dog", " sat", " on"),
                                              tops=(("the", -0.1), (" dog", -0.2, " cat", -1.7), (" sat", -0.3),
                                                    (" on", -0.4))), 1.5 / 2, 2, 1),
    # b sure of " fox", listing " dog" as a does and not " cat": " dog" moved by 0.5; a's " cat" is at most b's lowest,
    # so it moved by 2.0 at least; b's " fox", by 0.3 over a's lowest: (0.5 + 2.0 + 0.3) / 3 where they part.
    "a parting where each is sure of its own": (answer((-0.1, -1.4, -0.3, -0.4), ("the", " fox", " sat", " on"),
                                                       (("the", -0.1), (" fox", -1.4, " dog", -2.2), (" sat", -0.3),
                                                        (" on", -0.4))), 2.8 / 3 / 2, 2, 1),
    # A near-tie flipped: b gives " cat" -0.24 (0.04 below its " dog"), where a gives " dog" -1.7.
    "a near-tie flipped": (answer((-0.1, -0.2, -0.3, -0.4), ("the", " dog", " sat", " on"),
                                  (("the", -0.1), (" dog", -0.2, " cat", -0.24), (" sat", -0.3), (" on", -0.4))),
                           None, 2, 1),
    # b does not list a's token: it is at most as likely as b's lowest alternative (a lower bound of the move).
    "the other's token not listed": (answer((-0.1, -0.2, -0.3, -0.4), ("the", " fox", " sat", " on"),
                                            (("the", -0.1), (" fox", -0.2, " owl", -4.2), (" sat", -0.3), (" on", -0.4))),
                                     None, 2, 1),
    # The same chosen tokens, a runner-up moved: token 1's " dog" 1.0 lower, so it moved (0.0 + 1.0) / 2.
    "a runner-up moved": (answer(tops=(("the", -0.1, " dog", -1.6), (" cat", -0.2, " dog", -2.7),
                                       (" sat", -0.3, " dog", -1.8), (" on", -0.4, " dog", -1.9))), 0.5 / 4, 4, None),
    # No alternative listed in common at token 1: the chosen token's own value moved, by 0.1.
    "no alternative in common": (answer((-0.1, -0.3, -0.3, -0.4),
                                        tops=(("the", -0.1, " dog", -1.6), (" owl", -2.0), (" sat", -0.3, " dog", -1.8),
                                              (" on", -0.4, " dog", -1.9))), 0.1 / 4, 4, None),
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
    # a puts " dog" 0.05 below " cat", b puts " cat" 0.04 below " dog": " cat" moved by 0.04, " dog" by 0.05.
    assert difference(answer(tops=(("the", -0.1), (" cat", -0.2, " dog", -0.25), (" sat", -0.3), (" on", -0.4))),
                      tie).mean == pytest.approx((0.0 + (0.04 + 0.05) / 2) / 2)
    # Nothing listed in common where they part: the pair's log-odds, a's 1.5 (its lowest for " fox") and b's 4.0.
    assert difference(answer(), sure).mean == pytest.approx((0.0 + 1.5 + 4.0) / 2)


def test_nothing_in_common_says_nothing() -> None:
    assert difference(answer((-0.1, None), ("a", "b")), answer((None, None), ("x", "y"))).nothing is False
    assert difference(answer((None, None), ("a", "b")), answer((None, None), ("x", "y"))).nothing


def test_the_spread_of_a_burst_is_its_largest_difference() -> None:
    assert spread([answer()]) == 0.0
    assert spread([answer(), answer((-0.1, -0.3, -0.3, -0.4)), answer((-0.1, -0.2, -0.5, -0.4))]) == pytest.approx(0.075)


FEWEST = math.ceil(THRESHOLD / (CAP - ALLOWANCE))
"""The fewest answers that decide by their sum: each adds CAP - ALLOWANCE at most."""
STEP = 0.25
"""A small difference that persists: each answer STEP over the allowance."""
SMALL = math.ceil(THRESHOLD / STEP)
"""The answers it takes to decide."""
LARGE = min(CAP, GROSS - 1.0)
"""A large answer, not a gross one (three gross ones in a window decide whatever the sum)."""
WORN = math.ceil(2 * (LARGE - ALLOWANCE) / ALLOWANCE)
"""Answers at no distance that wear two large ones down to nothing."""


@pytest.mark.parametrize(("scores", "total", "decides"), [
    ([ALLOWANCE] * 50, 0.0, False),  # within the noise, however many answers
    ([CAP * 3], CAP - ALLOWANCE, False),  # one answer never decides, however gross
    ([CAP] * (FEWEST - 1), (FEWEST - 1) * (CAP - ALLOWANCE), False),
    ([CAP] * FEWEST, THRESHOLD, True),  # FEWEST large answers in a row do
    ([ALLOWANCE + STEP] * (SMALL - 1), (SMALL - 1) * STEP, False),
    ([ALLOWANCE + STEP] * SMALL, THRESHOLD, True),  # a small difference that persists decides, later
    ([LARGE, LARGE, *[0.0] * WORN, LARGE], LARGE - ALLOWANCE, False),  # answers within the noise wear the evidence down
])
def test_the_sequential_test(scores: list[float], total: float, decides: bool) -> None:
    evidence = Cusum()
    for each in scores:
        evidence = evidence.after(each)
    assert (evidence.total, evidence.decided) == (pytest.approx(total), decides)
    assert evidence.answers == len(scores)


def test_gross_answers_among_quiet_ones_decide() -> None:
    evidence = Cusum()
    for at in range(GROSS_WINDOW):
        evidence = evidence.after(GROSS if at % (GROSS_WINDOW // GROSS_ROUNDS) == 0 else 0.0)
        if evidence.decided:
            break
    assert evidence.decided and sum(evidence.gross) == GROSS_ROUNDS  # the sum alone would have worn each one down
    fewer = Cusum()
    for at in range(GROSS_WINDOW * 2):
        fewer = fewer.after(GROSS if at % GROSS_WINDOW == 0 else 0.0)
    assert not fewer.decided  # one gross answer per window is not enough


def test_a_decision_holds_until_the_evidence_wears_down_to_nothing() -> None:
    evidence = Cusum()
    for _ in range(FEWEST):
        evidence = evidence.after(CAP)
    assert evidence.decided
    for _ in range(math.ceil(THRESHOLD / ALLOWANCE) - 1):
        evidence = evidence.after(0.0)
        assert evidence.decided, evidence  # an answer within the noise does not undo it
    assert not evidence.after(0.0).decided  # a run of them does


def test_missed_rounds_lapse_and_an_answer_resumes() -> None:
    evidence = Cusum().after(0.5)
    for _ in range(MISSED - 1):
        evidence = evidence.missing()
    assert not evidence.lapsed
    evidence = evidence.missing()
    assert evidence.lapsed and evidence.answers == 1
    assert not evidence.after(0.5).lapsed and evidence.after(float("nan")).missed == MISSED + 1


def test_one_replica_off_the_majority_differs_and_the_others_agree() -> None:
    judgement = decided(group(answer(), OFF, answer(), rounds=3))
    members = judgement.members
    assert (members["r1"].agreement, members["r1"].kind, members["r1"].held_against) == (False, ANSWERS, ("r0", "r2"))
    assert members["r0"].agreement is True and members["r2"].agreement is True
    assert (judgement.agreement, judgement.split) == (False, False)
    assert members["r1"].detail.startswith(f"round 2: {OFF_BY:.3f} nats from its group, {OFF_BY / FLOOR:.1f} times")
    assert decided(group(answer(), OFF, answer(), rounds=2)).members["r1"].agreement is True  # two never decide


def test_a_member_is_scored_against_its_group_not_against_its_own_noise() -> None:
    # A bad member that is noisy too cannot raise the bar it is held to beyond NOISY times its group's noise.
    peers = group(answer(), OFF, answer(), answer(), noise=0.0)
    peers["r1"] = Peer(Q4KM, peers["r1"].answers, 10.0)
    scored = score_round({k: p.answers[0] for k, p in peers.items()}, {k: p.noise for k, p in peers.items()}, seed=0)
    assert scored["r1"].noise == pytest.approx(NOISY * FLOOR) and scored["r1"].noisy
    assert scored["r1"].score == pytest.approx(OFF_BY / (NOISY * FLOOR))
    assert not scored["r0"].noisy and scored["r0"].noise == pytest.approx(FLOOR)


def test_a_busy_member_is_held_to_its_own_noise_within_bounds() -> None:
    busy = answer((-0.1, -0.55, -0.65, -0.75))  # 0.2625 a value off, as a busy member's batching moves it
    peers = group(answer(), busy, answer(), answer(), noise=0.01, rounds=60)
    assert decided(peers).members["r1"].agreement is False  # 2.4 times the floor, answer after answer: it decides
    peers["r1"] = Peer(Q4KM, peers["r1"].answers, 0.25)  # its copies part by 0.25: its load, not its weights
    judged = decided(peers).members["r1"]
    assert judged.agreement is True and not judged.noisy


def test_a_pair_that_differs_splits_and_a_reference_names_the_odd_one() -> None:
    pair = decided(group(answer(), OFF, rounds=3))
    assert {k: (c.agreement, c.held_against) for k, c in pair.members.items()} == {
        "r0": (False, ("r1",)), "r1": (False, ("r0",))}
    assert pair.split and pair.agreement is False
    from specwatch.probe.peerprobe import prompt

    reference = Reference({prompt(q, salt=0): answer() for q in range(3)})
    held = decided(group(answer(), OFF, rounds=3), reference)
    assert {k: c.agreement for k, c in held.members.items()} == {"r0": True, "r1": False}
    assert not held.split and held.members["r1"].detail.startswith(f"round 2: {OFF_BY:.3f} nats from the reference")


def test_a_group_all_wrong_alike_is_caught_by_its_reference_alone() -> None:
    from specwatch.probe.peerprobe import prompt

    peers = group(OFF, OFF, OFF, rounds=3)
    assert decided(peers).agreement is True
    reference = Reference({prompt(q, salt=0): answer() for q in range(3)})
    assert {c.agreement for c in decided(peers, reference).members.values()} == {False}


def test_a_two_two_split_leaves_no_majority() -> None:
    # Half the group off lifts what its members typically stand apart, but only to NOISY times the floor: it decides.
    assert decided(group(answer(), answer(), OFF, OFF, rounds=3)).agreement is True
    judgement = decided(group(answer(), answer(), OFF, OFF, rounds=40))
    assert judgement.split and all(c.agreement is False for c in judgement.members.values())


def test_a_three_two_split_keeps_the_majority() -> None:
    members = decided(group(answer(), answer(), answer(), OFF, OFF, rounds=3)).members
    assert [members[f"r{i}"].agreement for i in range(5)] == [True, True, True, False, False]
    assert members["r3"].held_against == ("r0", "r1", "r2")


def test_another_file_content_differs_at_once_and_a_deployment_only_shows() -> None:
    renamed = Fingerprint(**{**vars(Q4KM), "build": "b2", "file": "gemma-copy.gguf"})
    members = decided(group(answer(), answer(), answer(), fingerprints=(Q4KM, Q40, renamed))).members
    assert (members["r1"].agreement, members["r1"].kind, members["r1"].held_against) == (False, FINGERPRINT, ("r0", "r2"))
    assert members["r1"].detail == "ftype 'Q4_0', the group's 'Q4_K - Medium'"
    assert (members["r2"].agreement, members["r2"].kind) == (True, None)
    assert members["r2"].deployment == "build 'b2', the group's 'b1'"


def test_a_rolling_upgrade_at_half_of_a_pool_keeps_every_replica_agreeing() -> None:
    upgraded = Fingerprint(**{**vars(Q4KM), "build": "b2"})
    members = decided(group(answer(), answer(), answer(), answer(), fingerprints=(Q4KM, upgraded) * 2)).members
    assert all(c.agreement is True for c in members.values())
    assert {c.deployment for c in members.values()} == {"build 'b1', the group's others", "build 'b2', the group's others"}


SLIGHT = FLOOR * ALLOWANCE * 0.95
"""A member this far off (nats a token) never adds to its sum at FLOOR; at UNIFORM_FLOOR every answer adds."""


def _slightly_off(uniform: bool, prints: tuple[Fingerprint, ...] = (Q4KM,) * 4,
                  reference: Reference | None = None) -> tuple[Comparing[str], Judgement[str]]:
    rounds = 40
    peers = group(answer(), answer(tuple(v - SLIGHT for v in VALUES)), answer(), answer(), fingerprints=prints,
                  rounds=rounds)
    test: Comparing[str] = Comparing(reference, salt=0, uniform=uniform)
    test.count(peers, before=rounds)
    return test, test.judge(peers)


def test_a_group_deployed_alike_is_held_to_the_uniform_floor_while_one_build_answers() -> None:
    assert SLIGHT / UNIFORM_FLOOR > ALLOWANCE  # the uniform floor is what tells this member apart
    test, judgement = _slightly_off(True)
    assert judgement.members["r1"].agreement is False and judgement.members["r1"].kind == ANSWERS
    assert f"times the noise ({UNIFORM_FLOOR:.3f})" in judgement.members["r1"].detail
    assert all(judgement.members[k].agreement is True for k in ("r0", "r2", "r3"))
    # Decided as the sum says: each answer adds its capped score less the allowance.
    step = min(SLIGHT / UNIFORM_FLOOR, CAP) - ALLOWANCE
    assert test.evidence["r1"].answers >= math.ceil(THRESHOLD / step)
    # Not declared alike: the same member never adds to its sum.
    test, judgement = _slightly_off(False)
    assert judgement.members["r1"].agreement is True and test.evidence["r1"].total == 0.0


def test_a_group_deployed_alike_goes_back_to_the_floor_during_a_rollout_or_against_a_reference() -> None:
    upgraded = Fingerprint(**{**vars(Q4KM), "build": "b2"})
    test, judgement = _slightly_off(True, (Q4KM, Q4KM, upgraded, Q4KM))
    assert judgement.members["r1"].agreement is True and test.evidence["r1"].total == 0.0
    assert test.floor_among([Peer(Q4KM, {}), Peer(upgraded, {})]) == FLOOR
    unknown = Fingerprint(**{**vars(Q4KM), "build": ""})  # a build not reported is no proof of one build
    assert test.floor_among([Peer(unknown, {}), Peer(unknown, {})]) == FLOOR
    assert test.floor_among([Peer(Q4KM, {}), Peer(Q4KM, {})]) == UNIFORM_FLOOR
    referenced: Comparing[str] = Comparing(Reference({0: answer()}), uniform=True)
    assert referenced.floor_among([Peer(Q4KM, {}), Peer(Q4KM, {})]) == FLOOR


def test_a_field_a_server_does_not_report_is_not_held_against_it() -> None:
    unknown = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf")  # no /v1/models meta
    assert decided(group(answer(), answer(), fingerprints=(Q4KM, unknown))).agreement is True


def test_no_member_agrees_before_a_round_of_its_was_counted() -> None:
    peers = group(answer(), answer(), answer())
    test: Comparing[str] = Comparing()
    assert {c.agreement for c in test.judge(peers).members.values()} == {None}  # the same file is no proof
    assert test.judge(peers).members["r0"].detail == "no answer counted yet"
    test.count(peers, before=0)  # round 0 is not over
    assert {c.agreement for c in test.judge(peers).members.values()} == {None}


def test_each_round_counts_once_however_often_the_group_is_compared() -> None:
    peers = group(answer(), OFF, answer(), rounds=2)
    test: Comparing[str] = Comparing()
    assert test.count(peers, before=2) == 2
    once = test.evidence["r1"]
    assert test.count(peers, before=2) == 0 and test.evidence["r1"] == once and once.answers == 2


def test_a_member_that_stops_answering_becomes_unknown_never_agrees() -> None:
    peers = group(answer(), answer(), answer(), rounds=2)
    test: Comparing[str] = Comparing()
    test.count(peers, before=2)
    assert test.judge(peers).members["r2"].agreement is True
    for q in range(2, 2 + MISSED):
        peers = {k: Peer(p.fingerprint, {**p.answers, **({q: answer()} if k != "r2" else {})}) for k, p in peers.items()}
        test.count(peers, before=q + 1)
    stopped = test.judge(peers).members["r2"]
    assert stopped.agreement is None and stopped.detail.startswith(f"unknown: it did not answer the last {MISSED}")
    assert test.judge(peers).members["r0"].agreement is True


def test_members_with_nothing_to_compare_say_nothing() -> None:
    judgement = decided({"a": Peer(), "b": Peer(Q4KM), "c": Peer(None, {0: answer()})})
    assert {k: c.agreement for k, c in judgement.members.items()} == {"a": None, "b": None, "c": None}
    assert judgement.agreement is None


@pytest.mark.parametrize("size", [2, 3, 4, 16, 66, 1000])
def test_any_group_size_scores_every_member(size: int) -> None:
    import random

    draw = random.Random(size)

    def noisy(shift: float) -> Logprobs:
        return answer(tuple(v - shift + draw.gauss(0, 0.03) for v in VALUES))  # no two answers alike

    test: Comparing[str] = Comparing()
    for q in range(6):
        peers = {f"r{i}": Peer(Q4KM, {q: noisy(1.0 if i == 0 else 0.0)}, 0.03) for i in range(size)}
        test.count(peers, before=q + 1)
    members = test.judge(peers).members
    assert all(c.evidence.answers == 6 for c in members.values())
    assert members["r0"].agreement is False
    if size > 2:
        assert [k for k, c in members.items() if c.agreement is not True] == ["r0"]


def test_many_alike_replicas_cost_their_distinct_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.core import peers as module

    calls = 0
    real = module.difference

    def counted(a: Logprobs, b: Logprobs) -> Difference:
        nonlocal calls
        calls += 1
        return real(a, b)

    monkeypatch.setattr(module, "difference", counted)
    peers = {f"r{i}": Peer(Q4KM, {0: answer()}) for i in range(500)}
    peers["odd"] = Peer(Q4KM, {0: OFF})
    judgement = decided(peers)
    assert calls == 1  # the two distinct answers, once
    assert judgement.members["odd"].evidence.last == pytest.approx(OFF_BY / FLOOR)
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
    members = decided(group(answer(), OFF, rounds=3)).members
    shown = peers_entry(Standing("gemma", members["r1"], False, True))
    assert (shown.agreement, shown.kind, shown.held_against, shown.evidence, shown.split) == (
        False, ANSWERS, ["r0"], 1.0, True)
    shift = 0.4 / 3
    off = answer((-0.1, -0.2 - shift, -0.3 - shift, -0.4 - shift))  # 0.1 a value: the floor, within the allowance
    pending = peers_entry(Standing("gemma", decided(group(answer(), off, answer(), answer())).members["r1"], True, False))
    assert (pending.agreement, pending.kind, pending.held_against, pending.evidence) == (True, None, [], 0.0)


def test_the_verdicts_document_reads_back_a_peers_object() -> None:
    from dataclasses import asdict

    from specwatch.core.report import read_verdicts

    model = {"model": "gemma", "status": "loaded", "verdict": "clean", "key": "", "age_seconds": 1.0,
             "poll_age_seconds": 1.0, "max_age_seconds": 9.0, "max_poll_age_seconds": 9.0, "fresh": True,
             "peers": {"group": "gemma", "agreement": False, "kind": "fingerprint", "held_against": ["b", "c"],
                       "evidence": 0.0, "group_agreement": False, "split": False,
                       "detail": "ftype 'Q4_0', the group's 'Q4_K - Medium'", "deployment": "", "noisy": False, "missed_rounds": 0}}
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
