"""`check --exporter` and replicas that disagree with their peers: exit 1 naming them, the fill-in verdict unchanged."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from specwatch.daemon import api
from specwatch.daemon.web import WebApp
from specwatch.gate.ask import Exporter, ask, render_text
from tests.support.wire import FakeLlama

POOL = ("eval-a", "eval-b", "eval-c")
AGREES = {"group": "cycle", "agreement": True, "kind": None, "held_against": [], "evidence": 0.0,
          "group_agreement": True, "split": False, "detail": "", "deployment": ""}
DISAGREES = {"group": "cycle", "agreement": False, "kind": "fingerprint", "held_against": ["eval-a", "eval-b"],
             "evidence": 0.0, "group_agreement": False, "split": False, "detail": "ftype 'Q4_0', the group's 'Q8_0'",
             "deployment": ""}


class Exporters:
    """Exporters that serve one watched fleet's verdicts, each with the peers entries it is given."""

    def __init__(self, watcher, clock) -> None:
        self.watcher, self.clock = watcher, clock
        self.apps: list[WebApp] = []

    def serve(self, peers: dict[str, dict | None]) -> str:
        def verdicts(query: dict[str, list[str]]) -> dict:
            document = api.verdicts(self.watcher.fleet.snapshot(), self.watcher.settings, api.parse_selection(query),
                                    self.clock())
            for server in document["servers"]:
                server["models"][0]["peers"] = copy.deepcopy(peers.get(server["server"]))
            return document

        app = WebApp(lambda a, e: None, page=lambda: "", reload=lambda: None, verdicts=verdicts)  # type: ignore[arg-type]
        self.apps.append(app)
        host, port = app.start("127.0.0.1", 0)
        return f"http://{host}:{port}"


@pytest.fixture
async def exporters(make_watcher, clock) -> Iterator[Exporters]:
    fakes = {name: FakeLlama.plain(tokens=8) for name in POOL} | {"draft": FakeLlama.draft(tokens=8)}
    servers = [{"name": n, "url": f"http://{n}:8080", "labels": {"pool": "eval" if n in POOL else "spec"}} for n in fakes]
    watcher = make_watcher(fakes, servers=servers, canary_tokens=8)
    for name in fakes:
        await watcher.poll(name)
        await watcher.canary(name)
    served = Exporters(watcher, clock)
    yield served
    for app in served.apps:
        app.stop()



async def _ask(*urls: str, **kw):
    return await ask([Exporter(u) for u in urls], servers=kw.pop("servers", []), labels=kw.pop("labels", [("pool", "eval")]),
                     model=None, timeout=5)


async def test_a_pool_whose_replica_disagrees_exits_1_naming_it_with_the_verdict_unchanged(exporters: Exporters) -> None:
    url = exporters.serve({"eval-a": AGREES, "eval-b": AGREES, "eval-c": DISAGREES})
    report = await _ask(url)
    assert (report.verdict, report.exit_code, report.disagreeing) == ("clean", 1, ["eval-c"])
    assert report.summary.startswith("1 replica(s) differ from their peer group")  # the refusal first
    assert "eval-c (fingerprint: ftype 'Q4_0', the group's 'Q8_0'; held against eval-a, eval-b)" in report.summary
    text = render_text(report)
    assert text.startswith("REFUSED (replicas differ; fill-in verdict clean): 1 replica(s) differ")
    assert "eval-c: CLEAN" in text and "DIFFERS from its peer group cycle (fingerprint)" in text
    assert report.as_json()["models"][0]["peers"] is not None


async def test_a_pool_that_agrees_or_is_undecided_passes(exporters: Exporters) -> None:
    unconfirmed = {**AGREES, "evidence": 0.4, "detail": "question 2: 0.120 nats from its nearest peers, 4.0 times the "
                                                       "group's noise (0.030)"}
    url = exporters.serve({"eval-a": AGREES, "eval-b": AGREES, "eval-c": unconfirmed})
    report = await _ask(url)
    assert (report.verdict, report.exit_code, report.disagreeing) == ("clean", 0, [])
    # A group of one, or a daemon without the peers object (older): nothing to hold against anyone.
    url = exporters.serve({})
    assert (await _ask(url)).exit_code == 0


async def test_only_the_selection_counts(exporters: Exporters) -> None:
    url = exporters.serve({"eval-a": AGREES, "eval-b": AGREES, "eval-c": DISAGREES})
    assert (await _ask(url, servers=["eval-a"], labels=[])).exit_code == 0
    assert (await _ask(url, servers=["eval-c"], labels=[])).exit_code == 1


async def test_fill_ins_stay_the_verdict_beside_a_disagreement(exporters: Exporters) -> None:
    url = exporters.serve({"draft": DISAGREES})
    report = await _ask(url, labels=[("pool", "spec")])
    assert (report.verdict, report.exit_code, report.disagreeing) == ("fill_ins", 1, ["draft"])
    assert "; the server serves fill-in logprobs" in report.summary


async def test_a_disagreement_one_exporter_of_an_ha_pair_confirmed_is_kept(exporters: Exporters) -> None:
    one = exporters.serve({"eval-a": AGREES, "eval-b": AGREES, "eval-c": DISAGREES})
    twin = exporters.serve({"eval-a": AGREES, "eval-b": AGREES, "eval-c": AGREES})
    for urls in ((one, twin), (twin, one)):
        report = await _ask(*urls)
        assert (report.exit_code, report.disagreeing) == (1, ["eval-c"])
        assert [m.server for m in report.models].count("eval-c") == 1
