"""Replicas compared by the daemon: fingerprints asked once per process, the peer probe asked of groups of two or more
(one pool prompt a round, the same for every member), each round counted once it is over, the standing shown on
/metrics, the verdicts document, the landing page and in the log."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import pytest
import structlog

from specwatch.core.evidence import ALLOWANCE, FLOOR, MISSED, UNIFORM_FLOOR
from specwatch.core.peers import Comparing
from specwatch.core.state import Fleet
from specwatch.daemon.api import Selection, verdicts
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.text import TextRenderer
from specwatch.daemon.landing import render, rows
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.client import Client
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.peerprobe import COPIES, PATH, prompts
from specwatch.settings.schema import Settings
from tests.conftest import FakeClock
from tests.support.fakes import fake_fleet, intervals
from tests.support.metrics import find, parse
from tests.support.wire import FakeLlama, FakeRouter

Build = Callable[..., Watcher]


@pytest.fixture
async def watcher_of(clock: FakeClock) -> AsyncIterator[Build]:
    """Watchers whose monotonic clock moves on at every look, so no comparison waits for the real time to pass."""
    clients: list[Client] = []

    def build(fakes: dict[str, FakeLlama | FakeRouter], servers: list[dict] | None = None, **kw: object) -> Watcher:
        settings = Settings(servers=servers or [{"name": n, "url": f"http://{n}:8080"} for n in fakes],
                            canary_endpoints=kw.pop("canary_endpoints", ["chat", "completion"]), **kw)
        client = fake_fleet(fakes).client()
        clients.append(client)
        ticks = itertools.count()
        return Watcher(settings, Fleet(settings.servers, settings.canary_endpoints),
                       Fetcher(client, settings.max_response_bytes), clock=clock, monotonic=lambda: float(next(ticks)))

    yield build
    for client in clients:
        await client.aclose()


_rounds = intervals


def _text(watcher: Watcher) -> str:
    return TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0)).text().decode()


def value(text: str, name: str, **labels: str) -> float | None:
    return find(parse(text), name, **labels)


def _document(watcher: Watcher, clock: FakeClock) -> dict[str, dict]:
    document = verdicts(watcher.fleet.snapshot(), watcher.settings, Selection(), clock())
    return {f"{s['server']}/{m['key']}".rstrip("/"): m["peers"] for s in document["servers"] for m in s["models"]}


def _pool(**odd: object) -> dict[str, FakeLlama | FakeRouter]:
    return {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None), "c": FakeLlama.plain(tokens=None, **odd)}


def _asked(fake: FakeLlama) -> list[str]:
    """The peer-probe prompts a look-alike was asked, in order."""
    pool = set(prompts())
    return [r.json()["prompt"] for r in fake.requests if r.path == PATH and r.json().get("prompt") in pool]


async def test_another_quantization_under_the_same_name_differs_at_once_by_fingerprint(watcher_of: Build,
                                                                                      clock: FakeClock) -> None:
    watcher = watcher_of(_pool(ftype="Q4_0"))
    with structlog.testing.capture_logs() as logs:
        await _rounds(watcher, clock, times=3)  # a and b agree once a round of theirs is counted
    text = _text(watcher)
    assert value(text, "specwatch_peer_agreement", server="c", peer_group="tiny") == 0
    assert value(text, "specwatch_peer_agreement", server="a", peer_group="tiny") == 1
    assert value(text, "specwatch_model_fingerprint_info", server="c", ftype="Q4_0", file="tiny.gguf", n_vocab="320") == 1
    peers = _document(watcher, clock)
    assert peers["c"] == {"group": "tiny", "agreement": False, "kind": "fingerprint", "held_against": ["a", "b"],
                          "evidence": 0.0, "group_agreement": False, "split": False,
                          "detail": "ftype 'Q4_0', the group's 'Q4_K - Medium'", "deployment": "", "noisy": False,
                          "missed_rounds": 0}
    assert (peers["a"]["agreement"], peers["a"]["kind"], peers["a"]["group_agreement"]) == (True, None, False)
    said = [(e["event"], e["server"], e.get("kind")) for e in logs if e["event"].startswith("peers_")]
    assert said == [("peers_disagree", "c", "fingerprint")]  # once, not at every comparison
    assert "disagrees with group tiny (fingerprint)" in render(rows(watcher.fleet.get("c"), clock()))


async def test_meta_is_asked_once_per_process(watcher_of: Build, clock: FakeClock) -> None:
    fakes = _pool()
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=3)

    def asked() -> int:
        return sum(1 for r in fakes["a"].requests if r.path == "/v1/models")

    assert asked() == 1
    fakes["a"].media_marker = "<__media_restarted__>"  # the process restarted
    await _rounds(watcher, clock)
    assert asked() == 2


async def test_the_peer_probe_asks_one_prompt_a_round_the_same_of_every_member(watcher_of: Build,
                                                                                clock: FakeClock) -> None:
    fakes = _pool(total_slots=4)
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=4)
    asked = {name: _asked(fake) for name, fake in fakes.items()}
    assert asked["a"] == asked["b"] and len(asked["a"]) >= 3  # one slot: one copy a round
    assert len(set(asked["a"])) == len(asked["a"])  # a new prompt every round
    assert asked["c"] == [p for p in asked["a"] for _ in range(COPIES)]  # four slots: copies at once, for its noise
    text = _text(watcher)
    assert value(text, "specwatch_peer_noise_nats", server="c") == 0.0  # a look-alike's copies answer alike
    assert value(text, "specwatch_peer_noise_nats", server="a") == 0.0  # one slot never batches
    assert value(text, "specwatch_peer_probes_total", server="a", outcome="success") == len(asked["a"])
    assert value(text, "specwatch_peer_probes_total", server="c", outcome="success") == len(asked["c"])
    assert value(text, "specwatch_peer_probes_total", server="a", outcome="failure") == 0
    assert value(text, "specwatch_peer_missed_rounds", server="a", peer_group="tiny") == 0
    assert value(text, "specwatch_peer_noisy", server="c", peer_group="tiny") == 0


async def test_the_prompts_are_this_process_own_draw_from_the_pool(watcher_of: Build, clock: FakeClock,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.probe import peerprobe

    seen = []
    for salt in (1, 2):
        monkeypatch.setattr(peerprobe, "SALT", salt)
        fakes = _pool()
        watcher = watcher_of(fakes)
        await _rounds(watcher, clock, times=3)
        seen.append(_asked(fakes["a"]))
    assert seen[0] and not set(seen[0]) & set(seen[1])  # a gateway that learnt one process's prompts knows none of the next


async def test_answers_that_differ_are_reported_once_the_test_decides(watcher_of: Build, clock: FakeClock) -> None:
    watcher = watcher_of(_pool(token_probability=0.3))  # log 0.7 - log 0.3 = 0.847 a token, 8.5 times the floor
    with structlog.testing.capture_logs() as logs:
        await _rounds(watcher, clock, times=8)
    peers = _document(watcher, clock)
    assert (peers["c"]["agreement"], peers["c"]["kind"], peers["c"]["held_against"], peers["c"]["evidence"]) == (
        False, "answers", ["a", "b"], 1.0)
    assert f" 0.847 nats from its group, {0.847 / FLOOR:.1f} times the noise ({FLOOR:.3f})" in peers["c"]["detail"]
    assert (peers["a"]["agreement"], peers["a"]["evidence"]) == (True, 0.0)
    text = _text(watcher)
    assert (value(text, "specwatch_peer_agreement", server="c", peer_group="tiny"),
            value(text, "specwatch_peer_evidence", server="c", peer_group="tiny")) == (0, 1.0)
    said = [(e["event"], e["server"], e.get("kind")) for e in logs if e["event"].startswith("peers_")]
    assert said == [("peers_disagree", "c", "answers")]


async def test_a_member_that_stops_answering_becomes_unknown_and_the_rest_go_on(watcher_of: Build,
                                                                                clock: FakeClock) -> None:
    fakes = _pool()
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=3)
    assert {k: p["agreement"] for k, p in _document(watcher, clock).items()} == {"a": True, "b": True, "c": True}
    fakes["c"].tokens = 0  # empty answers (#27572): no token to compare, so no "agrees"
    await _rounds(watcher, clock, times=MISSED + 2)  # a round counts once the next is over
    peers = _document(watcher, clock)
    assert peers["c"]["agreement"] is None and "did not answer the last" in peers["c"]["detail"]
    assert (peers["a"]["agreement"], peers["b"]["agreement"]) == (True, True)
    text = _text(watcher)
    assert value(text, "specwatch_peer_agreement", server="c", peer_group="tiny") is None
    assert value(text, "specwatch_peer_missed_rounds", server="c", peer_group="tiny") >= MISSED
    assert value(text, "specwatch_peer_probe_failures_total", server="c", reason="no_logprobs") >= MISSED
    fakes["c"].tokens = None
    await _rounds(watcher, clock, times=3)
    assert _document(watcher, clock)["c"]["agreement"] is True  # answering again, agreeing again


async def test_a_member_whose_polls_fail_keeps_its_standing_and_evidence_until_it_has_missed_its_rounds(
        watcher_of: Build, clock: FakeClock) -> None:
    fakes = _pool(token_probability=0.3)
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=8)
    decided = _document(watcher, clock)["c"]
    assert (decided["agreement"], decided["evidence"]) == (False, 1.0)
    fakes["c"].api_key = "another"  # every request refused: a poll fails, as a busy server's times out
    await _rounds(watcher, clock)
    assert watcher.fleet.get("c").poll_success is False
    assert (_document(watcher, clock)["c"]["agreement"], _document(watcher, clock)["c"]["evidence"]) == (False, 1.0)
    assert value(_text(watcher), "specwatch_peer_agreement", server="c", peer_group="tiny") == 0
    fakes["c"].api_key = None
    await _rounds(watcher, clock)
    assert (_document(watcher, clock)["c"]["agreement"], _document(watcher, clock)["c"]["evidence"]) == (False, 1.0)
    fakes["c"].api_key = "another"
    await _rounds(watcher, clock, times=MISSED + 1)
    assert _document(watcher, clock)["c"] is None  # silent for longer than a member may be: no standing at all
    assert value(_text(watcher), "specwatch_peer_agreement", server="c", peer_group="tiny") is None
    assert (_document(watcher, clock)["a"]["agreement"], _document(watcher, clock)["b"]["agreement"]) == (True, True)


async def test_a_difference_below_the_margin_agrees(watcher_of: Build, clock: FakeClock) -> None:
    watcher = watcher_of(_pool(token_probability=0.699))  # 0.0014 a token: no eval's number moves
    await _rounds(watcher, clock, times=4)
    assert {k: p["agreement"] for k, p in _document(watcher, clock).items()} == {"a": True, "b": True, "c": True}


async def test_a_group_declared_deployed_alike_is_held_to_its_floor_while_one_build_answers(watcher_of: Build,
                                                                                              clock: FakeClock) -> None:
    slight = 0.633  # log 0.7 - log 0.633 = 0.1006 a token: under the allowance at FLOOR, over it at UNIFORM_FLOOR
    assert 0.1006 / FLOOR < ALLOWANCE < 0.1006 / UNIFORM_FLOOR
    alike = watcher_of(_pool(token_probability=slight), peer_uniform=["tiny"])
    mixed = watcher_of(_pool(token_probability=slight, build_info="b9-other"), peer_uniform=["tiny"])
    undeclared = watcher_of(_pool(token_probability=slight))
    for watcher in (alike, mixed, undeclared):
        await _rounds(watcher, clock, times=10)
    assert _document(alike, clock)["c"]["agreement"] is False
    assert f"times the noise ({UNIFORM_FLOOR:.3f})" in _document(alike, clock)["c"]["detail"]
    assert value(_text(alike), "specwatch_peer_floor_nats", server="a", peer_group="tiny") == UNIFORM_FLOOR
    # A rollout (another build answering) or no declaration: the usual floor, under which it agrees.
    for watcher in (mixed, undeclared):
        assert {k: p["agreement"] for k, p in _document(watcher, clock).items()} == {"a": True, "b": True, "c": True}
        assert value(_text(watcher), "specwatch_peer_floor_nats", server="c", peer_group="tiny") == FLOOR


async def test_a_speculating_replica_is_held_to_its_plain_peers_texts(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None), "d": FakeLlama.draft(tokens=None)}
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=3)
    assert {k: p["agreement"] for k, p in _document(watcher, clock).items()} == {"a": True, "b": True, "d": True}
    fakes["d"].cycle_shift = 2  # its text is not the model's
    fakes["d"].media_marker = "<__media_restarted__>"
    await _rounds(watcher, clock, times=6)
    assert _document(watcher, clock)["d"]["kind"] == "answers"


async def test_a_group_of_one_and_an_opted_out_server_are_not_asked_or_compared(watcher_of: Build,
                                                                                clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None, ftype="Q4_0"),
             "solo": FakeLlama.plain(tokens=None, model_alias="other.gguf")}
    servers = [{"name": "a", "url": "http://a:8080"}, {"name": "b", "url": "http://b:8080", "peer_group": "none"},
               {"name": "solo", "url": "http://solo:8080"}]
    watcher = watcher_of(fakes, servers=servers)
    await _rounds(watcher, clock)
    assert _document(watcher, clock) == {"a": None, "b": None, "solo": None}
    assert [_asked(f) for f in fakes.values()] == [[], [], []]  # the peer probe costs a lone server nothing
    text = _text(watcher)
    assert "specwatch_peer_agreement{" not in text and "specwatch_peer_probes_total{" not in text
    assert value(text, "specwatch_model_fingerprint_info", server="b", peer_group="", ftype="Q4_0") == 1
    assert value(text, "specwatch_model_fingerprint_info", server="solo", peer_group="other") == 1
    page = render([row for state in watcher.fleet.snapshot() for row in rows(state, clock())])
    assert "group other: no peer to compare with" in page and "group tiny: no peer to compare with" in page


async def test_a_configured_group_joins_servers_of_other_names_and_a_reload_moves_them(watcher_of: Build,
                                                                                      clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None, model_alias="one", model_path="/m/tiny.gguf"),
             "b": FakeLlama.plain(tokens=None, model_alias="two", model_path="/m/tiny.gguf")}
    servers = [{"name": n, "url": f"http://{n}:8080", "peer_group": "pool"} for n in fakes]
    watcher = watcher_of(fakes, servers=servers)
    await _rounds(watcher, clock, times=3)
    peers = _document(watcher, clock)
    assert peers["a"]["group"] == "pool" and peers["a"]["agreement"] is True
    settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080"} for n in fakes], canary_endpoints=["chat"])
    watcher.apply(settings, list(settings.servers))
    watcher.peers.settle()
    assert _document(watcher, clock) == {"a": None, "b": None}  # now each a group of one


async def test_a_pair_that_differs_is_said_once_for_the_group_without_a_majority(watcher_of: Build,
                                                                                 clock: FakeClock) -> None:
    router = FakeRouter(models={"tiny": FakeLlama.plain(tokens=None), "big": FakeLlama.plain(tokens=None)},
                        status={"tiny": "loaded", "big": "loaded"})
    fakes = {"router": router, "plain": FakeLlama.plain(tokens=None, model_alias="tiny", cycle_shift=3)}
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=6)
    peers = _document(watcher, clock)
    assert peers["router/big"] is None
    assert (peers["plain"]["agreement"], peers["plain"]["kind"], peers["plain"]["held_against"], peers["plain"]["split"]) == (
        False, "answers", ["router/tiny"], True)
    assert (peers["router/tiny"]["held_against"], peers["router/tiny"]["split"]) == (["plain"], True)
    assert value(_text(watcher), "specwatch_peer_agreement", server="router", model="tiny", peer_group="tiny") == 0
    assert "which has no majority" in render(rows(watcher.fleet.get("plain"), clock()))


async def test_a_build_or_file_name_of_its_own_is_shown_never_counted(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None, build_info="b9-other"),
             "c": FakeLlama.plain(tokens=None, model_path="/elsewhere/tiny-copy.gguf")}
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock, times=3)
    peers = _document(watcher, clock)
    assert {k: p["agreement"] for k, p in peers.items()} == {"a": True, "b": True, "c": True}
    assert peers["b"]["deployment"] == "build 'b9-other', the group's 'b0-unknown'"
    assert peers["c"]["deployment"] == "file 'tiny-copy.gguf', the group's 'tiny.gguf'"
    assert "deployed otherwise: build &#x27;b9-other&#x27;" in render(rows(watcher.fleet.get("b"), clock()))


async def test_a_poll_that_changes_nothing_compares_nothing(watcher_of: Build, clock: FakeClock,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[set[str]] = []
    judge = Comparing.judge

    def counted(self, peers):
        compared.append(set(peers))
        return judge(self, peers)

    monkeypatch.setattr(Comparing, "judge", counted)
    fakes = _pool()
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock)
    assert compared
    compared.clear()
    for name in fakes:
        await watcher.poll(name)
    watcher.peers.settle()
    assert compared == []
    fakes["c"].ftype = "Q8_0"  # another file, seen once its process is asked /v1/models again
    fakes["c"].media_marker = "<__media_restarted__>"
    await watcher.poll("c")
    await watcher.ask_meta("c")
    watcher.peers.settle()
    assert compared == [{"a", "b", "c"}]
    assert watcher.fleet.get("c").model().peers.comparison.kind == "fingerprint"


async def test_a_restart_is_held_to_its_own_answers_with_its_evidence_begun_anew(watcher_of: Build,
                                                                                clock: FakeClock) -> None:
    fakes = _pool(cycle_shift=1)
    watcher = watcher_of(fakes, canary_endpoints=["chat"])
    await _rounds(watcher, clock, times=6)
    assert _document(watcher, clock)["c"]["kind"] == "answers"
    # Restarted on the right weights, same file name, build and slots: the fill-in verdict stands, the answers go.
    fakes["c"].cycle_shift, fakes["c"].media_marker = 0, "<__media_restarted__>"
    await watcher.poll("c")
    watcher.peers.settle()
    assert _document(watcher, clock)["c"]["agreement"] is None  # nothing of the new process to compare yet
    assert watcher.fleet.get("c").model().canaries  # the fill-in verdict of the same setup is kept
    await _rounds(watcher, clock, times=3)
    peers = _document(watcher, clock)["c"]
    assert (peers["agreement"], peers["evidence"]) == (True, 0.0)  # its old process's evidence is not its own


async def test_no_group_is_judged_before_every_server_was_polled_once(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None, ftype="Q4_0"),
             "c": FakeLlama.plain(tokens=None, ftype="Q8_0"), "d": FakeLlama.plain(tokens=None),
             "e": FakeLlama.plain(tokens=None)}
    watcher = watcher_of(fakes)
    # The three that differ answer first: compared alone they have no majority, and a fingerprint counts at once.
    for name in ("a", "b", "c"):
        await watcher.poll(name)
        await watcher.ask_meta(name)
    watcher.peers.settle()
    assert all(watcher.fleet.get(n).model().peers is None for n in fakes)
    for name in ("d", "e"):
        await watcher.poll(name)
        await watcher.ask_meta(name)
    watcher.peers.settle()
    peers = _document(watcher, clock)
    # Another file's content differs at once; the same file is no proof of the same weights: no answer counted yet.
    assert {n: peers[n]["agreement"] for n in fakes} == {"a": None, "b": False, "c": False, "d": None, "e": None}


async def test_a_round_counts_once_it_is_over_with_every_member_answer_in_it(watcher_of: Build,
                                                                             clock: FakeClock) -> None:
    from specwatch.daemon.cadence import round_of

    fakes = _pool(token_probability=0.3)
    watcher = watcher_of(fakes)
    for name in fakes:
        await watcher.poll(name)
        await watcher.ask_meta(name)
    now = round_of(clock(), watcher.settings.canary_interval)
    for name in ("a", "c"):  # b has not had its turn yet: c is not held against a alone
        await watcher.peer_round(name, "", (now,))
    watcher.peers.settle()
    assert {k: p["evidence"] for k, p in _document(watcher, clock).items()} == {"a": None, "b": None, "c": None}
    clock.advance(watcher.settings.canary_interval / 2)
    await watcher.peer_round("b", "", (now,))  # its turn came late in the round: every member has had one
    test = watcher.peers._tests["tiny"]
    assert test.through == now and {k: e.answers for k, e in test.evidence.items()} == {"a": 1, "b": 1, "c": 1}
    await watcher.peer_round("a", "", (now + 1,))
    clock.advance(watcher.settings.canary_interval * 3)  # b and c never had their turn at the next: it closes anyway
    watcher.peers.settle()
    assert test.through == now + 1 and test.evidence["b"].missed == 1 and test.evidence["a"].missed == 0


async def test_a_pair_held_to_its_reference_names_the_odd_member(watcher_of: Build, clock: FakeClock) -> None:
    from specwatch.core.peers import Reference

    healthy = watcher_of({"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None)})
    await _rounds(healthy, clock, times=3)
    answer = next(iter(healthy.fleet.get("a").model().peer_answers.answers.values()))
    held = Reference(dict.fromkeys(range(len(prompts())), answer))  # a look-alike answers every prompt alike
    fakes = {"a": FakeLlama.plain(tokens=None), "c": FakeLlama.plain(tokens=None, token_probability=0.3)}
    alone = watcher_of(fakes)
    await _rounds(alone, clock, times=8)
    assert _document(alone, clock)["c"]["split"]  # a pair alone cannot say which of the two is off
    watcher = watcher_of(fakes)
    watcher.apply(watcher.settings, list(watcher.settings.servers), references={"tiny": held})
    await _rounds(watcher, clock, times=8)
    peers = _document(watcher, clock)
    assert {k: p["agreement"] for k, p in peers.items()} == {"a": True, "c": False}
    assert not peers["c"]["split"] and "nats from the reference" in peers["c"]["detail"]


async def test_a_speculating_several_slot_server_that_answers_empty_is_never_clean_nor_agrees(watcher_of: Build,
                                                                                             clock: FakeClock) -> None:
    # Upstream #27572: MTP speculation with several slots returning empty answers; the canary and the peer probe alike.
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None),
             "mtp": FakeLlama.draft(tokens=0, total_slots=4)}
    watcher = watcher_of(fakes)
    with structlog.testing.capture_logs() as logs:
        await _rounds(watcher, clock, times=MISSED + 3)
    model = watcher.fleet.get("mtp").model()
    assert model.decision.verdict.value != "clean"
    peers = _document(watcher, clock)
    assert peers["mtp"]["agreement"] is None and (peers["a"]["agreement"], peers["b"]["agreement"]) == (True, True)
    text = _text(watcher)
    assert value(text, "specwatch_peer_agreement", server="mtp", peer_group="tiny") is None
    assert value(text, "specwatch_peer_probe_failures_total", server="mtp", reason="no_logprobs") >= MISSED
    said = {e.get("detail") for e in logs if e["event"] in ("canary_failed", "peer_probe_failed") and e["server"] == "mtp"}
    assert said == {"the answer carries no tokens"}


def test_the_landing_page_says_a_member_that_stopped_answering_is_unknown() -> None:
    from specwatch.core.report import PeersEntry
    from specwatch.daemon.landing import peer_words

    lapsed = PeersEntry(group="tiny", agreement=None, missed_rounds=MISSED)
    assert peer_words(lapsed) == f"group tiny: UNKNOWN, it did not answer the last {MISSED} peer-probe rounds its group answered"
    assert peer_words(PeersEntry(group="tiny", agreement=None)) == "group tiny: nothing to compare yet"
    assert peer_words(PeersEntry(group="tiny", agreement=True, noisy=True)).endswith("its own noise stands far over its group's")
