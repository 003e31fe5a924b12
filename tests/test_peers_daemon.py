"""Replicas compared by the daemon: fingerprints asked once per process, answers compared per group, shown everywhere."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import structlog

from specwatch.core.peers import compare
from specwatch.core.state import Fleet
from specwatch.daemon.api import Selection, verdicts
from specwatch.daemon.exposition.samples import ExporterStatus
from specwatch.daemon.exposition.text import TextRenderer
from specwatch.daemon.landing import render, rows
from specwatch.daemon.watch import Watcher
from specwatch.probe.http.fetch import Fetcher
from specwatch.settings.schema import Settings
from tests.conftest import FakeClock
from tests.support.fakes import fake_fleet
from tests.support.metrics import find, parse
from tests.support.wire import FakeLlama, FakeRouter

Build = Callable[..., Watcher]


@pytest.fixture
async def watcher_of(clock: FakeClock) -> AsyncIterator[Build]:
    """Watchers whose monotonic clock moves on at every look, so no comparison waits for the real time to pass."""
    clients: list[httpx.AsyncClient] = []

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


async def _rounds(watcher: Watcher, clock: FakeClock, times: int = 1) -> None:
    """Every server polled (its meta asked when due) and canaried on every endpoint, `times` over."""
    for _ in range(times):
        clock.advance(60)
        for state in watcher.fleet.snapshot():
            await watcher.poll(state.config.name)
            await watcher.ask_meta(state.config.name)
            for key in watcher.fleet.get(state.config.name).models:
                await watcher.canary(state.config.name, key)
        watcher.peers.settle()


def _text(watcher: Watcher) -> str:
    return TextRenderer(watcher.fleet, lambda: ExporterStatus(15.0, 60.0)).text().decode()


def value(text: str, name: str, **labels: str) -> float | None:
    return find(parse(text), name, **labels)


def _document(watcher: Watcher, clock: FakeClock) -> dict[str, dict]:
    document = verdicts(watcher.fleet.snapshot(), watcher.settings, Selection(), clock())
    return {f"{s['server']}/{m['key']}".rstrip("/"): m["peers"] for s in document["servers"] for m in s["models"]}


def _pool(**odd: object) -> dict[str, FakeLlama | FakeRouter]:
    return {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None), "c": FakeLlama.plain(tokens=None, **odd)}


async def test_another_quantization_under_the_same_name_disagrees_at_once_by_fingerprint(watcher_of: Build,
                                                                                        clock: FakeClock) -> None:
    watcher = watcher_of(_pool(ftype="Q4_0"))
    with structlog.testing.capture_logs() as logs:
        await _rounds(watcher, clock)
        await _rounds(watcher, clock)
    text = _text(watcher)
    assert value(text, "specwatch_peer_agreement", server="c", peer_group="tiny") == 0
    assert value(text, "specwatch_peer_agreement", server="a", peer_group="tiny") == 1
    assert value(text, "specwatch_model_fingerprint_info", server="c", ftype="Q4_0", file="tiny.gguf", n_vocab="320") == 1
    peers = _document(watcher, clock)
    assert peers["c"] == {"group": "tiny", "agreement": False, "kind": "fingerprint", "held_against": ["a", "b"],
                          "largest_difference": 0.0, "detail": "ftype 'Q4_0', the group's 'Q4_K - Medium'"}
    assert peers["a"]["agreement"] is True and peers["a"]["kind"] is None
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


async def test_another_text_counts_only_once_confirmed_by_fresh_answers(watcher_of: Build, clock: FakeClock) -> None:
    watcher = watcher_of(_pool(cycle_shift=1), peer_confirmations=3, canary_endpoints=["chat"])
    await _rounds(watcher, clock)
    text = _text(watcher)
    assert value(text, "specwatch_peer_agreement", server="c", peer_group="tiny") == 1  # one answer proves nothing
    first = _document(watcher, clock)["c"]
    assert first["agreement"] is True and first["detail"].startswith("unconfirmed (1 of 3 answers): chat: token 0")
    # Comparing again without a new answer from c does not count its old one again.
    await watcher.canary("a")
    watcher.peers.settle()
    assert watcher.fleet.get("c").model().peers.comparison.streak == 1
    await _rounds(watcher, clock, times=2)
    peers = _document(watcher, clock)["c"]
    assert (peers["agreement"], peers["kind"], peers["held_against"]) == (False, "tokens", ["a", "b"])
    assert value(_text(watcher), "specwatch_peer_agreement", server="c", peer_group="tiny") == 0
    assert "specwatch_peer_largest_difference{peer_group=\"tiny\",server=\"c\"}" not in _text(watcher)


async def test_logprobs_beyond_the_tolerance_disagree_within_it_agree(watcher_of: Build, clock: FakeClock) -> None:
    watcher = watcher_of(_pool(token_probability=0.3), peer_confirmations=1)  # log 0.7 - log 0.3 = 0.85
    await _rounds(watcher, clock)
    peers = _document(watcher, clock)["c"]
    assert (peers["agreement"], peers["kind"], peers["largest_difference"]) == (False, "logprobs", 0.8473)
    watcher = watcher_of(_pool(token_probability=0.65), peer_confirmations=1)  # 0.074: batching noise
    await _rounds(watcher, clock)
    assert _document(watcher, clock)["c"]["agreement"] is True
    assert value(_text(watcher), "specwatch_peer_largest_difference", server="c", peer_group="tiny") == 0.0741


async def test_a_speculating_replica_is_held_to_its_plain_peers_tokens(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None), "d": FakeLlama.draft(tokens=None)}
    watcher = watcher_of(fakes, peer_confirmations=1)
    await _rounds(watcher, clock)
    assert {k: p["agreement"] for k, p in _document(watcher, clock).items()} == {"a": True, "b": True, "d": True}
    fakes["d"].cycle_shift = 2
    await _rounds(watcher, clock)
    assert _document(watcher, clock)["d"]["kind"] == "tokens"


async def test_a_group_of_one_and_an_opted_out_server_compare_nothing(watcher_of: Build, clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None), "b": FakeLlama.plain(tokens=None, ftype="Q4_0"),
             "solo": FakeLlama.plain(tokens=None, model_alias="other.gguf")}
    servers = [{"name": "a", "url": "http://a:8080"}, {"name": "b", "url": "http://b:8080", "peer_group": "none"},
               {"name": "solo", "url": "http://solo:8080"}]
    watcher = watcher_of(fakes, servers=servers)
    await _rounds(watcher, clock)
    assert _document(watcher, clock) == {"a": None, "b": None, "solo": None}
    text = _text(watcher)
    assert "specwatch_peer_agreement{" not in text
    assert value(text, "specwatch_model_fingerprint_info", server="b", peer_group="", ftype="Q4_0") == 1
    assert value(text, "specwatch_model_fingerprint_info", server="solo", peer_group="other") == 1
    page = render([row for state in watcher.fleet.snapshot() for row in rows(state, clock())])
    assert "group other: no peer to compare with" in page and "group tiny: no peer to compare with" in page


async def test_a_configured_group_joins_servers_of_other_names_and_a_reload_moves_them(watcher_of: Build,
                                                                                      clock: FakeClock) -> None:
    fakes = {"a": FakeLlama.plain(tokens=None, model_alias="one", model_path="/m/tiny.gguf"),
             "b": FakeLlama.plain(tokens=None, model_alias="two", model_path="/m/tiny.gguf")}
    servers = [{"name": n, "url": f"http://{n}:8080", "peer_group": "pool"} for n in fakes]
    watcher = watcher_of(fakes, servers=servers, peer_confirmations=1)
    await _rounds(watcher, clock)
    peers = _document(watcher, clock)
    assert peers["a"]["group"] == "pool" and peers["a"]["agreement"] is True
    settings = Settings(servers=[{"name": n, "url": f"http://{n}:8080"} for n in fakes], canary_endpoints=["chat"])
    watcher.apply(settings, list(settings.servers))
    watcher.peers.settle()
    assert _document(watcher, clock) == {"a": None, "b": None}  # now each a group of one


async def test_a_router_model_is_a_peer_of_a_plain_server_of_the_same_model(watcher_of: Build, clock: FakeClock) -> None:
    router = FakeRouter(models={"tiny": FakeLlama.plain(tokens=None), "big": FakeLlama.plain(tokens=None)},
                        status={"tiny": "loaded", "big": "loaded"})
    fakes = {"router": router, "plain": FakeLlama.plain(tokens=None, model_alias="tiny", cycle_shift=3)}
    watcher = watcher_of(fakes, peer_confirmations=1)
    await _rounds(watcher, clock)
    peers = _document(watcher, clock)
    assert peers["router/big"] is None
    assert (peers["plain"]["agreement"], peers["plain"]["kind"], peers["plain"]["held_against"]) == (
        False, "tokens", ["router/tiny"])
    assert peers["router/tiny"]["held_against"] == ["plain"]  # a group of two: each is named
    assert value(_text(watcher), "specwatch_peer_agreement", server="router", model="tiny", peer_group="tiny") == 0


async def test_a_poll_that_changes_nothing_compares_nothing(watcher_of: Build, clock: FakeClock,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.daemon import peering

    compared: list[set[str]] = []

    def counted(peers, **kw):
        compared.append(set(peers))
        return compare(peers, **kw)

    monkeypatch.setattr(peering, "compare", counted)
    fakes = _pool()
    watcher = watcher_of(fakes)
    await _rounds(watcher, clock)
    assert compared
    compared.clear()
    for name in fakes:
        await watcher.poll(name)
    watcher.peers.settle()
    assert compared == []
    fakes["c"].build_info = "b9-other"  # an upgrade, seen at the next poll: compared at once
    await watcher.poll("c")
    watcher.peers.settle()
    assert compared == [{"a", "b", "c"}]
    assert watcher.fleet.get("c").model().peers.comparison.kind == "fingerprint"


async def test_a_restart_with_the_same_setup_is_not_held_to_the_old_process_answers(watcher_of: Build,
                                                                                   clock: FakeClock) -> None:
    fakes = _pool(cycle_shift=1)
    watcher = watcher_of(fakes, peer_confirmations=1, canary_endpoints=["chat"])
    await _rounds(watcher, clock)
    assert _document(watcher, clock)["c"]["kind"] == "tokens"
    # Restarted on the right weights, same file name, build and slots: the fill-in verdict stands, the answers go.
    fakes["c"].cycle_shift, fakes["c"].media_marker = 0, "<__media_restarted__>"
    await watcher.poll("c")
    watcher.peers.settle()
    peers = _document(watcher, clock)["c"]
    assert (peers["agreement"], peers["kind"]) == (True, None)
    assert watcher.fleet.get("c").model().canaries  # the fill-in verdict of the same setup is kept
    await _rounds(watcher, clock)
    assert _document(watcher, clock)["c"]["agreement"] is True


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
    assert {n: peers[n]["agreement"] for n in fakes} == {"a": True, "b": False, "c": False, "d": True, "e": True}
