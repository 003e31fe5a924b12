"""Routers: every model watched without ever loading one, per-model verdicts, and check on a router."""

from __future__ import annotations

import asyncio

from specwatch.endpoints import Endpoint
from specwatch.gate.check import render_text, run_check
from specwatch.settings.targets import ServerConfig
from tests.support.fakes import fake_fleet
from tests.support.metrics import exposition, parse, value
from tests.support.wire import FakeLlama, FakeRouter


def _router(**kw: object) -> FakeRouter:
    models = {"plain": FakeLlama.plain(tokens=None), "draft": FakeLlama.draft(tokens=None), "cold": FakeLlama.plain(tokens=None)}
    return FakeRouter(models=models, status={"plain": "loaded", "draft": "loaded"}, models_max=2, **kw)


async def test_the_daemon_watches_every_loaded_model_and_loads_none(make_watcher) -> None:
    router = _router()
    watcher = make_watcher({"router": router}, canary_endpoints=["completion", "chat"])
    await watcher.poll("router")
    state = watcher.fleet.get("router")
    assert state.router is True and set(state.models) == {"plain", "draft", "cold"}
    # Even a canary sent straight at the unloaded model (the schedule never sends one) loads nothing.
    await asyncio.gather(*(watcher.canary("router", key) for key in state.models))
    state = watcher.fleet.get("router")
    verdicts = {key: model.decision.verdict.value for key, model in state.models.items()}
    assert verdicts == {"plain": "clean", "draft": "fill_ins", "cold": "unchecked"}
    assert state.models["cold"].decision.summary.startswith("the model is unloaded, not loaded")
    assert router.loads == [] and router.status["cold"] == "unloaded"
    named = [r for r in router.requests if r.query.get("model") or r.method == "POST"]
    assert named and all(r.query.get("autoload") == "false" for r in named)
    canaries = [r.json() for r in router.requests if r.method == "POST"]
    assert {c["model"] for c in canaries} == {"plain", "draft", "cold"}

    samples = parse(exposition(watcher.fleet))
    assert value(samples, "specwatch_verdict", server="router", model="draft", verdict="fill_ins") == 1
    assert value(samples, "specwatch_verdict", server="router", model="plain", verdict="clean") == 1
    assert value(samples, "specwatch_verdict", server="router", model="cold", verdict="unchecked") == 1
    assert value(samples, "specwatch_model_loaded", server="router", model="cold") == 0
    assert value(samples, "specwatch_model_loaded", server="router", model="draft") == 1
    assert value(samples, "specwatch_speculation_enabled", server="router", model="draft", source="slots") == 1
    assert value(samples, "specwatch_canary_placeholder_ratio", server="router", model="draft", endpoint="chat") == 1.0
    assert value(samples, "specwatch_server_info", server="router", model="draft", build="b0-unknown") == 1
    assert value(samples, "specwatch_up", server="router") == 1


async def test_a_routers_models_are_logged_as_found_and_their_verdicts_once_known(make_watcher) -> None:
    import structlog

    router = _router()
    watcher = make_watcher({"router": router}, canary_endpoints=["chat"])
    with structlog.testing.capture_logs() as logs:
        await watcher.poll("router")
        await asyncio.gather(*(watcher.canary("router", key) for key in ("plain", "draft")))
        router.unload("draft")
        await watcher.poll("router")
    lines = [(e["event"], e.get("model"), e.get("status") or e.get("verdict")) for e in logs
             if e["event"] in ("model_status", "verdict_changed")]
    # Found models say their status; none logs "unchecked" before its first canary, as a configured server does not.
    assert lines[:3] == [("model_status", "plain", "loaded"), ("model_status", "draft", "loaded"),
                         ("model_status", "cold", "unloaded")]
    assert sorted(lines[3:5]) == [("verdict_changed", "draft", "fill_ins"), ("verdict_changed", "plain", "clean")]
    assert lines[5:] == [("model_status", "draft", "unloaded"), ("verdict_changed", "draft", "unchecked")]


async def test_a_model_unloaded_between_listing_and_canary_is_a_state_not_a_failure(make_watcher) -> None:
    router = _router()
    watcher = make_watcher({"router": router}, canary_endpoints=["completion"])
    await watcher.poll("router")
    router.unload("plain")  # evicted by traffic right after the poll
    await watcher.canary("router", "plain")
    model = watcher.fleet.get("router").models["plain"]
    assert (model.status, model.decision.verdict.value) == ("unloaded", "unchecked")
    assert dict(model.canary_failures) == {} and router.loads == []
    samples = parse(exposition(watcher.fleet))
    assert value(samples, "specwatch_canaries_total", server="router", model="plain", outcome="failure") == 0


async def test_a_configured_model_watches_that_model_only_and_never_loads_it(make_watcher) -> None:
    router = _router()
    watcher = make_watcher({"router": router}, servers=[
        {"name": "cold", "url": "http://router:8080", "model": "cold"},
        {"name": "draft", "url": "http://router:8080", "model": "draft"},
    ], canary_endpoints=["completion"])
    for name in ("cold", "draft"):
        await watcher.poll(name)
        await watcher.canary(name)
    cold, draft = watcher.fleet.get("cold"), watcher.fleet.get("draft")
    assert set(cold.models) == {"cold"} and set(draft.models) == {"draft"}
    assert cold.model().decision.verdict.value == "unchecked" and draft.model().decision.verdict.value == "fill_ins"
    assert router.loads == []


async def test_the_scheduled_tick_never_canaries_an_unloaded_model(make_watcher) -> None:
    router = _router()
    watcher = make_watcher({"router": router}, canary_endpoints=["completion"])
    await watcher.tick("router")
    await asyncio.gather(*watcher._rounds)
    asked = {r.json()["model"] for r in router.requests if r.method == "POST"}
    assert asked == {"plain", "draft"} and router.loads == []


def _check(router: FakeRouter, **server: object) -> object:
    config = ServerConfig(name="check", url="http://router:8080", **server)
    return asyncio.run(run_check(config, endpoints=[Endpoint.COMPLETION, Endpoint.CHAT], tokens=8, timeout=5,
                                 connect=lambda: fake_fleet({"router": router}).client()))


def test_check_on_a_router_checks_every_loaded_model_and_the_worst_wins() -> None:
    router = _router()
    report = _check(router)
    assert (report.verdict, report.exit_code, report.router) == ("fill_ins", 1, True)
    assert {(m.model, m.status, m.verdict) for m in report.models} == {
        ("plain", "loaded", "clean"), ("draft", "loaded", "fill_ins"), ("cold", "unloaded", "unchecked")}
    assert "model draft" in report.summary and router.loads == []
    text = render_text(report)
    assert text.startswith("FILL_INS:") and "  model cold (unloaded): UNCHECKED:" in text


def test_check_of_an_unloaded_model_is_unchecked_and_leaves_it_unloaded() -> None:
    router = _router()
    report = _check(router, model="cold")
    assert (report.verdict, report.exit_code) == ("unchecked", 2)
    assert "not loaded" in report.summary
    assert router.loads == [] and router.status["cold"] == "unloaded"


def test_check_loads_a_model_only_when_asked() -> None:
    router = _router()
    config = ServerConfig(name="check", url="http://router:8080", model="cold")
    report = asyncio.run(run_check(config, endpoints=[Endpoint.COMPLETION], tokens=8, timeout=5, load=True,
                                   connect=lambda: fake_fleet({"router": router}).client()))
    assert (report.verdict, report.exit_code) == ("clean", 0)
    assert router.loads == ["cold"]


def test_check_on_a_router_with_nothing_loaded_is_unchecked() -> None:
    router = FakeRouter(models={"cold": FakeLlama.plain()})
    report = _check(router)
    assert (report.verdict, report.exit_code) == ("unchecked", 2) and "no model loaded" in report.summary
