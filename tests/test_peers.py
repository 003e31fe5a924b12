"""Replicas compared: groups, fingerprints, answers against the majority, the tolerance and confirmation."""

from __future__ import annotations

import pytest

from specwatch.core.peers import (
    FINGERPRINT,
    LOGPROBS,
    OPT_OUT,
    TOKENS,
    Fingerprint,
    Peer,
    compare,
    group_of,
)
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import CHUNKS, classify
from specwatch.probe.logprobs import Logprobs, logprobs_of
from specwatch.probe.readers import Token, completion_reader, read_choice, stream_reader

Q4KM = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf", ftype="Q4_K - Medium", size="253", n_params="268",
                   n_vocab="262144", n_ctx_train="32768", n_embd="640")
Q40 = Fingerprint(build="b1", file="gemma-Q4_0.gguf", ftype="Q4_0", size="241", n_params="268",
                  n_vocab="262144", n_ctx_train="32768", n_embd="640")
TEXT = ("the", " cat", " sat", " on")


def answer(values: tuple[float | None, ...] = (-0.1, -0.2, -0.3, -0.4), tokens: tuple[str, ...] = TEXT,
           alternatives: tuple[tuple[object, ...], ...] | None = None) -> Logprobs:
    return Logprobs(tokens, values, alternatives if alternatives is not None else tuple(() for _ in tokens))


def peers(*answers: Logprobs, fingerprints: tuple[Fingerprint | None, ...] = ()) -> dict[str, Peer]:
    found = fingerprints or (None,) * len(answers)
    return {f"r{i}": Peer(fp, {"chat": a} if a is not None else {}) for i, (a, fp) in enumerate(zip(answers, found, strict=True))}


@pytest.mark.parametrize(("configured", "reported", "whole", "group"), [
    (None, "gemma", True, "gemma"),
    (None, "gemma-Q4_K_M.gguf", True, "gemma-Q4_K_M"),  # a file and a router id of its stem meet
    (None, "/models/a/gemma.gguf", True, "gemma"),  # a server without an alias reports the path
    (None, "org/gemma", True, "org/gemma"),
    (None, "", True, None),
    ("eval", "gemma", True, "eval"),
    ("eval", "gemma", False, "eval/gemma"),  # a router's models stay apart within its group
    (OPT_OUT, "gemma", True, None),
])
def test_the_group_of_a_model(configured: str | None, reported: str, whole: bool, group: str | None) -> None:
    assert group_of(configured, reported, whole_server=whole) == group


def test_the_majority_is_the_reference_not_the_first_server() -> None:
    other = answer(tokens=("the", " dog", " sat", " on"))
    result = compare(peers(other, answer(), answer()), confirmations=1)
    assert result["r0"].agreement is False and result["r0"].kind == TOKENS
    assert result["r0"].held_against == ("r1", "r2")
    assert result["r0"].detail == "chat: token 1 is ' dog', ' cat' elsewhere"
    assert result["r1"].agreement is True and result["r2"].agreement is True


def test_in_a_group_of_two_a_disagreement_names_both() -> None:
    result = compare(peers(answer(), answer(tokens=("a", "b", "c", "d"))), confirmations=1)
    assert (result["r0"].agreement, result["r0"].held_against) == (False, ("r1",))
    assert (result["r1"].agreement, result["r1"].held_against) == (False, ("r0",))


def test_without_a_majority_every_side_disagrees() -> None:
    result = compare(peers(answer(), answer(tokens=("a",) * 4), answer(tokens=("b",) * 4)), confirmations=1)
    assert all(c.agreement is False for c in result.values())
    assert result["r0"].held_against == ("r1", "r2")


def test_a_group_of_one_compares_nothing() -> None:
    result = compare(peers(answer(), fingerprints=(Q4KM,)))
    assert result["r0"].agreement is None and result["r0"].counted is None


def test_members_with_nothing_to_compare_say_nothing() -> None:
    result = compare({"a": Peer(), "b": Peer(Q4KM), "c": Peer(None, {"chat": answer()})})
    assert {k: c.agreement for k, c in result.items()} == {"a": None, "b": None, "c": None}


def test_another_file_disagrees_by_fingerprint_at_once() -> None:
    result = compare(peers(answer(), answer(), answer(), fingerprints=(Q4KM, Q40, Q4KM)), confirmations=5)
    assert result["r1"].kind == FINGERPRINT and result["r1"].confirmed and result["r1"].counted is False
    assert result["r1"].detail == "file 'gemma-Q4_0.gguf', the group's 'gemma-Q4_K_M.gguf'"
    assert result["r1"].held_against == ("r0", "r2")
    assert result["r0"].agreement is True


def test_a_field_a_server_does_not_report_is_not_held_against_it() -> None:
    unknown = Fingerprint(build="b1", file="gemma-Q4_K_M.gguf")  # no /v1/models meta
    result = compare(peers(answer(), answer(), fingerprints=(Q4KM, unknown)))
    assert result["r0"].agreement is True and result["r1"].agreement is True


def test_fill_ins_are_not_compared_as_values_but_their_tokens_are() -> None:
    speculating = answer(values=(-0.1, None, None, None))  # a replica whose fill-ins carry no measurement
    result = compare(peers(answer(), speculating, answer()), tolerance=0.01, confirmations=1)
    assert all(c.agreement is True for c in result.values())
    wrong = answer(values=(-0.1, None, None, None), tokens=("the", " cat", " ran", " on"))
    assert compare(peers(answer(), wrong, answer()), confirmations=1)["r1"].kind == TOKENS


def test_a_longer_answer_is_compared_on_the_shorter_ones_prefix() -> None:
    longer = answer(values=(-0.1, -0.2, -0.3, -0.4, -0.5, -0.6), tokens=(*TEXT, " a", " mat"))
    result = compare(peers(answer(), longer), confirmations=1)
    assert result["r0"].agreement is True and result["r1"].agreement is True


@pytest.mark.parametrize(("moved", "tolerance", "agreement"), [
    (0.081, 0.5, True),  # the batching noise measured with identical tokens
    (0.6, 0.5, False),
    (0.2, 0.1, False),
    (0.05, 0.1, True),
])
def test_logprobs_within_the_tolerance_agree(moved: float, tolerance: float, agreement: bool) -> None:
    off = answer(values=(-0.1, -0.2 - moved, -0.3, -0.4))
    result = compare(peers(answer(), off, answer()), tolerance=tolerance, confirmations=1)
    assert result["r1"].agreement is agreement
    assert result["r1"].largest_difference == pytest.approx(moved)
    assert result["r0"].largest_difference == 0.0
    if not agreement:
        assert result["r1"].kind == LOGPROBS and result["r1"].held_against == ("r0", "r2")
        assert result["r1"].detail.startswith("chat: token 1 logprob")


def test_alternatives_are_compared_by_their_text() -> None:
    def with_top(value: float) -> Logprobs:
        return answer(alternatives=(("the", -0.1, "a", value), (), (), ()))

    result = compare(peers(with_top(-2.0), with_top(-2.0), with_top(-3.0)), tolerance=0.5, confirmations=1)
    assert result["r2"].kind == LOGPROBS and "alternative 'a'" in result["r2"].detail
    assert result["r2"].largest_difference == pytest.approx(1.0)


def test_a_disagreement_in_answers_counts_once_confirmed_by_fresh_answers() -> None:
    group = peers(answer(), answer(tokens=("a",) * 4), answer())
    first = compare(group, confirmations=3, streaks={}, fresh={"r1": {"chat"}})
    assert (first["r1"].agreement, first["r1"].streak, first["r1"].confirmed, first["r1"].counted) == (False, 1, False, True)
    # Compared again with no new answer from r1 (another member's canary came in): the one noisy answer counts once.
    again = compare(group, confirmations=3, streaks={"r1": 1}, fresh={"r0": {"chat"}})
    assert again["r1"].streak == 1 and not again["r1"].confirmed
    third = compare(group, confirmations=3, streaks={"r1": 2}, fresh={"r1": {"chat"}})
    assert third["r1"].streak == 3 and third["r1"].confirmed and third["r1"].counted is False


def test_a_fresh_answer_elsewhere_does_not_confirm_an_old_noisy_one() -> None:
    group = {"a": Peer(None, {"chat": answer(), "completion": answer()}),
             "b": Peer(None, {"chat": answer(tokens=("x",) * 4), "completion": answer()}),
             "c": Peer(None, {"chat": answer(), "completion": answer()})}
    result = compare(group, confirmations=2, streaks={"b": 1}, fresh={"b": {"completion"}})
    assert (result["b"].agreement, result["b"].streak, result["b"].confirmed) == (False, 1, False)
    assert compare(group, confirmations=2, streaks={"b": 1}, fresh={"b": {"chat"}})["b"].confirmed


def test_a_member_named_by_several_kinds_shows_the_weightiest() -> None:
    group = peers(answer(), answer(tokens=("x",) * 4), answer(), fingerprints=(Q4KM, Q40, Q4KM))
    assert compare(group)["r1"].kind == FINGERPRINT


def test_an_agreeing_answer_ends_a_streak() -> None:
    result = compare(peers(answer(), answer(), answer()), confirmations=3, streaks={"r1": 2}, fresh={"r1": {"chat"}})
    assert result["r1"].streak == 0 and result["r1"].agreement is True


def _entry(text: str, logprob: float, top: list[tuple[str, float]]) -> dict:
    return {"id": 1, "token": text, "logprob": logprob, "top_logprobs": [{"token": t, "logprob": v} for t, v in top]}


def test_a_chat_answer_brings_its_texts_values_and_alternatives() -> None:
    body = {"choices": [{"logprobs": {"content": [_entry("the", -0.1, [("the", -0.1), ("a", -2.5)]),
                                                  _entry(" cat", 0.0, [])]}}]}
    got = classify(read_choice(body)).logprobs
    assert got == Logprobs(("the", " cat"), (-0.1, None), (("the", -0.1, "a", -2.5), ()))


def test_a_post_sampling_answer_brings_logprobs() -> None:
    body = {"completion_probabilities": [{"id": 1, "token": "x", "prob": 0.5, "top_probs": [{"token": "x", "prob": 0.5}]}]}
    got = classify(completion_reader(post_sampling=True)(body)).logprobs
    assert got is not None and got.tokens == ("x",)
    assert got.values[0] == pytest.approx(-0.6931, abs=1e-4) and got.alternatives[0][1] == pytest.approx(-0.6931, abs=1e-4)


def test_a_stream_fill_in_keeps_its_text() -> None:
    events = [{"choices": [{"delta": {"content": "the"}, "logprobs": {"content": [_entry("the", -0.1, [("the", -0.1)])]}}]},
              {"choices": [{"delta": {"content": " cat"}}]}]
    got = classify(stream_reader(CHUNKS[Endpoint.CHAT_STREAM])(events)).logprobs
    assert got == Logprobs(("the", " cat"), (-0.1, None), (("the", -0.1), ()))


def test_the_legacy_completion_shape_brings_texts() -> None:
    body = {"choices": [{"logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25],
                                      "top_logprobs": [{"a": -0.5}, {"b": -0.25, "c": -3.0}]}}]}
    got = classify(read_choice(body)).logprobs
    assert got == Logprobs(("a", "b"), (-0.5, -0.25), (("a", -0.5), ("b", -0.25, "c", -3.0)))


def test_logprobs_of_uses_the_classifiers_fill_in_rule() -> None:
    tokens = [Token(-0.1, 3, text="a"), Token(0.0, 0, text="b"), Token(-0.2, 3, marked=True, text="c"), Token(-0.3, 3, text="d")]
    assert logprobs_of(tokens).values == (-0.1, None, None, -0.3)


def test_the_verdicts_document_shows_a_comparison_counted_only_once_confirmed() -> None:
    from specwatch.core.peers import Comparison
    from specwatch.core.report import peers_entry

    pending = Comparison(False, TOKENS, ("a",), None, streak=1, confirmed=False, detail="chat: token 1 is 'x', 'y' elsewhere")
    shown = peers_entry("gemma", pending, 3)
    assert (shown.agreement, shown.kind, shown.held_against) == (True, None, [])
    assert shown.detail == "unconfirmed (1 of 3 answers): chat: token 1 is 'x', 'y' elsewhere"
    confirmed = peers_entry("gemma", Comparison(False, LOGPROBS, ("a", "b/m"), 0.612345, 3, True, "d"), 3)
    assert (confirmed.agreement, confirmed.kind, confirmed.held_against, confirmed.largest_difference) == (
        False, LOGPROBS, ["a", "b/m"], 0.6123)


def test_the_verdicts_document_reads_back_a_peers_object() -> None:
    from dataclasses import asdict

    from specwatch.core.report import read_verdicts

    model = {"model": "gemma", "status": "loaded", "verdict": "clean", "key": "", "age_seconds": 1.0,
             "poll_age_seconds": 1.0, "max_age_seconds": 9.0, "max_poll_age_seconds": 9.0, "fresh": True,
             "peers": {"group": "gemma", "agreement": False, "kind": "fingerprint", "held_against": ["b", "c"],
                       "largest_difference": None, "detail": "ftype 'Q4_0', the group's 'Q4_K - Medium'"}}
    document = {"specwatch": "0.4", "generated_at": 0.0, "poll_interval_seconds": 15.0, "canary_interval_seconds": 60.0,
                "verdicts": [], "servers": [{"server": "a", "url": "http://a:1", "labels": {}, "router": False, "up": True,
                                             "models": [model]}]}
    read = read_verdicts(document)
    peers_of = read.servers[0].models[0].peers
    assert peers_of is not None and (peers_of.agreement, peers_of.held_against) == (False, ["b", "c"])
    assert asdict(read)["servers"][0]["models"][0]["peers"] == model["peers"]
    del model["peers"]  # a daemon before 0.4 says nothing of peers
    assert read_verdicts(document).servers[0].models[0].peers is None


@pytest.mark.parametrize(("values", "middle"), [
    ([(1.0, 1), (2.0, 1)], 1.5),
    ([(5.0, 1), (1.0, 2)], 1.0),
    ([(1.0, 1), (2.0, 1), (3.0, 1), (10.0, 1)], 2.5),
    ([(2.0, 3), (1.0, 3)], 1.5),
])
def test_the_median_weighs_each_distinct_answer_by_its_members(values: list[tuple[float, int]], middle: float) -> None:
    from specwatch.core.peers import _median

    assert _median(values) == middle


def test_many_alike_replicas_cost_their_distinct_answers() -> None:
    group = {f"r{i}": Peer(Q4KM, {"chat": answer()}) for i in range(200)}
    group["odd"] = Peer(Q4KM, {"chat": answer(values=(-0.1, -0.9, -0.3, -0.4))})
    result = compare(group, confirmations=1)
    assert result["odd"].kind == LOGPROBS and result["odd"].largest_difference == pytest.approx(0.7)
    assert result["odd"].detail == "chat: token 1 logprob -0.900, the group's median -0.200"
    assert result["r0"].agreement is True and result["r0"].largest_difference == 0.0
