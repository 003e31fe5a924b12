"""`specwatch check`: the verdict and exit code for each kind of server, including a build that drafts honestly."""

from __future__ import annotations

import json

import httpx
import pytest

from specwatch.core.verdict import Verdict
from specwatch.endpoints import Endpoint
from specwatch.gate.check import render_text, run_check
from specwatch.probe.http.client import Client
from specwatch.settings.targets import ServerConfig
from tests.support import builds
from tests.support.fakes import serving
from tests.support.wire import FakeLlama


async def _check(fake: FakeLlama, **server_kw: object):
    server = ServerConfig(name="check", url="http://srv:8080", **server_kw)
    return await run_check(server, endpoints=list(Endpoint), tokens=16, timeout=5,
                           connect=serving(fake))


async def test_plain_server_is_clean() -> None:
    report = await _check(FakeLlama.plain())
    assert (report.verdict, report.exit_code) == ("clean", Verdict.CLEAN.exit_code)
    assert report.speculation_slots is False
    assert all(e.fill_ins == 0 and e.tokens == 32 for e in report.endpoints)


async def test_draft_server_serves_fill_ins() -> None:
    report = await _check(FakeLlama.draft())
    assert (report.verdict, report.exit_code) == ("fill_ins", Verdict.FILL_INS.exit_code)
    assert {e.endpoint: e.fill_in_ratio for e in report.endpoints} == {e.value: 1.0 for e in Endpoint}
    # The ratio's denominator is in the report, so a consumer dividing the counts gets the ratio: every token after the first.
    assert all(e.judged_tokens == e.tokens - 1 == e.fill_ins for e in report.endpoints)
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


async def test_pre_sampling_numbers_under_post_sampling_keys_are_never_clean() -> None:
    """A revision of the fix fills drafted tokens with pre-sampling values, post_sampling_probs or not."""
    fake = FakeLlama(speculative=True, fill_ins=set(range(1, 32)), drafts=24, fixed_but_post_sampling=True,
                     pre_sampling_under_post=True)
    report = await _check(fake)
    assert (report.verdict, report.exit_code) == ("unchecked", Verdict.UNCHECKED.exit_code)
    by_endpoint = {e.endpoint: e for e in report.endpoints}
    assert by_endpoint["completion_post_sampling"].reason == "not_post_sampling"
    assert all(e.fill_ins == 0 and e.draft_n == 24 for name, e in by_endpoint.items() if name != "completion_post_sampling")
    # The summary says what was served, and where.
    assert report.summary.startswith("could not check every endpoint: completion_post_sampling: not_post_sampling: 31 of 31 "
                                     "tokens after the first carry pre-sampling numbers under prob/top_probs")
    # Asked only where the values are right, the same build is clean.
    server = ServerConfig(name="check", url="http://srv:8080")
    report = await run_check(server, endpoints=[Endpoint.COMPLETION, Endpoint.CHAT], tokens=16, timeout=5,
                             connect=serving(fake))
    assert report.verdict == "clean"


async def test_a_props_list_is_shown_with_the_speculation_it_says() -> None:
    report = await _check(FakeLlama.draft(props_types="none,draft-simple"))
    assert report.speculation_types == "none,draft-simple"
    assert "speculation: /slots on, /props on (none,draft-simple)" in render_text(report)
    assert "speculation: /slots off, /props off\n" in render_text(await _check(FakeLlama.plain()))


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
                             connect=serving(stripped))
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
                             connect=serving(flaky))
    assert report.exit_code != Verdict.CLEAN.exit_code and calls == 3


class Balancer:
    """Replicas behind one address: per request in turn, or per connection (a client) in turn."""

    def __init__(self, *replicas: FakeLlama, per: str = "request") -> None:
        self.replicas, self.per, self.turn = replicas, per, 0

    def connect(self) -> Client:
        if self.per == "connection":
            replica = self.replicas[self.turn % len(self.replicas)]
            self.turn += 1
            return serving(replica)()
        return serving(self._next)()

    def _next(self, request: httpx.Request) -> httpx.Response:
        replica = self.replicas[self.turn % len(self.replicas)]
        self.turn += 1
        return replica(request)


# Per request, the canaries reach both replicas; per connection, all of them reach the first one the check connects to.
@pytest.mark.parametrize(("per", "first", "verdict"), [("request", 0, "fill_ins"), ("request", 1, "fill_ins"),
                                                       ("connection", 0, "unchecked"), ("connection", 1, "fill_ins")])
async def test_a_balancer_in_front_of_a_plain_and_a_draft_server_is_never_clean(per: str, first: int, verdict: str) -> None:
    plain, draft = FakeLlama.plain(), FakeLlama.draft()
    draft.media_marker = "<__media_other_process__>"
    balancer = Balancer(*((plain, draft) if first == 0 else (draft, plain)), per=per)
    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=list(Endpoint), tokens=16, timeout=5,
                             connect=balancer.connect)
    assert (report.verdict, report.exit_code) == (verdict, Verdict(verdict).exit_code), report.summary
    assert report.signs and "answers cannot come from one server" in report.summary and "--exporter" in report.summary
    # Fill-ins in any answer are proof, whichever replica gave them: the verdict follows the table, not the signs.
    assert any(e.fill_ins for e in report.endpoints) is (verdict == "fill_ins")
    assert ("do not score" in report.summary) is (verdict == "fill_ins")


async def test_fill_ins_on_some_endpoints_behind_a_balancer_are_proof_said_beside_the_sign() -> None:
    """The table `check LB_URL` printed: fill-ins on some endpoints, clean answers on the rest, and a sign."""
    plain, draft = FakeLlama.plain(), FakeLlama.draft()
    draft.media_marker = "<__media_other_process__>"
    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=list(Endpoint), tokens=16, timeout=5,
                             connect=Balancer(plain, draft, per="request").connect)
    filled = [e.endpoint for e in report.endpoints if e.fill_ins]
    assert 0 < len(filled) < len(Endpoint), filled
    assert (report.verdict, report.exit_code) == ("fill_ins", 1)
    head, _, beside = report.summary.partition("; answers cannot come from one server: ")
    assert head.startswith("the server serves fill-in logprobs") and all(e in head for e in filled), report.summary
    assert beside.startswith(report.signs[0]) and "at least one of them serves fill-ins" in beside
    assert render_text(report).startswith("FILL_INS: the server serves fill-in logprobs")


async def test_one_server_behind_a_balancer_shows_no_sign() -> None:
    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=list(Endpoint), tokens=16, timeout=5,
                             connect=Balancer(FakeLlama.plain(), FakeLlama.plain(), per="request").connect)
    # Two replicas of one process would share a marker; these do (the wire model's): alike in every answer, clean.
    assert (report.verdict, report.signs) == ("clean", [])


@pytest.mark.parametrize(("change", "sign"), [
    ({"media_marker": "<__media_restarted__>"}, "/props changed between requests"),
    ({"build_info": "b11500-abc"}, "/props changed between requests"),
    ({"model_alias": "other.gguf"}, "/props changed between requests"),
    ({"total_slots": 4}, "/props changed between requests (build b0-unknown, model tiny.gguf, 1 slot, marker <__media_"),
])
async def test_props_that_change_between_requests_are_a_sign(change: dict, sign: str) -> None:
    changed = FakeLlama.plain(**change)
    balancer = Balancer(FakeLlama.plain(), changed, per="connection")
    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=[Endpoint.COMPLETION], tokens=16,
                             timeout=5, connect=balancer.connect)
    assert report.verdict == "unchecked" and any(s.startswith(sign) for s in report.signs), report.signs


@pytest.mark.parametrize(("canaried", "verdict"), [(FakeLlama.future_fixed(), "unchecked"), (FakeLlama.draft(), "fill_ins")])
async def test_slots_off_while_a_canary_drafted_is_a_sign(canaried: FakeLlama, verdict: str) -> None:
    # /props and /slots from a plain replica, the canaries from a speculating one that shares its marker: drafting with
    # real logprobs proves nothing of the replica an eval reaches, fill-ins prove that one of them serves them.
    plain = FakeLlama.plain()

    def route(request: httpx.Request) -> httpx.Response:
        return (canaried if request.method == "POST" else plain)(request)

    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=[Endpoint.CHAT], tokens=16, timeout=5,
                             connect=serving(route))
    assert report.verdict == verdict, report.summary
    assert report.signs == ["/slots says speculation is off, yet a canary drafted (timings.draft_n or fill-ins)"]
    assert "answers cannot come from one server: /slots says speculation is off" in report.summary


async def test_a_canary_answered_by_another_model_is_a_sign() -> None:
    plain, other = FakeLlama.plain(), FakeLlama.plain(model_alias="qwen3-8b.gguf")

    def route(request: httpx.Request) -> httpx.Response:
        return (other if request.method == "POST" else plain)(request)

    report = await run_check(ServerConfig(name="c", url="http://lb:8080"), endpoints=[Endpoint.CHAT], tokens=16, timeout=5,
                             connect=serving(route))
    assert report.verdict == "unchecked"
    assert report.signs == ["a canary was answered by model 'qwen3-8b.gguf' where /props says 'tiny.gguf'"]


def _gateway(fake: FakeLlama):
    """A front end that forwards only /v1/* (LiteLLM-style), and wants the model named."""

    def forward(request: httpx.Request) -> httpx.Response:
        if not request.url.path.startswith("/v1/"):
            return httpx.Response(404, json={"detail": "Not Found"})
        if request.method == "POST" and json.loads(request.content).get("model") != "tiny.gguf":
            return httpx.Response(400, json={"error": {"message": "model is required"}})
        return fake(request)

    return serving(forward)


@pytest.mark.parametrize(("fake", "verdict"), [(FakeLlama.draft(tokens=None), "fill_ins"),
                                               (FakeLlama.plain(tokens=None), "clean"),
                                               (FakeLlama.future_fixed(tokens=None), "clean")])
async def test_an_openai_only_front_end_is_judged_through_its_v1_endpoints(fake: FakeLlama, verdict: str) -> None:
    report = await run_check(ServerConfig(name="c", url="http://gw:4000"), endpoints=list(Endpoint), tokens=48, timeout=5,
                             connect=_gateway(fake))
    assert report.verdict == verdict, report.summary
    assert (report.gateway, report.unreachable) == (True, ["/props", "/slots"])
    assert {e.endpoint for e in report.endpoints} == {"v1_completion", "v1_completion_stream", "chat", "chat_stream"}
    assert "forwards only /v1/*" in report.summary


async def test_a_short_check_through_a_front_end_that_hides_speculation_is_not_clean() -> None:
    fake = FakeLlama(speculative=True, drafts=None, tokens=None)  # say, ngram-mod that did not draft on a short chat
    report = await run_check(ServerConfig(name="c", url="http://gw:4000"), endpoints=[Endpoint.CHAT], tokens=16, timeout=5,
                             connect=_gateway(fake))
    assert report.verdict == "unproven" and "no canary was long enough" in report.summary
    assert "8 tokens or more on a raw-prompt endpoint" in report.summary and "32 tokens or more on a chat" in report.summary
    assert "and it had chat 16;" in report.summary


async def test_a_front_end_that_forwards_no_endpoint_asked_for_is_unchecked() -> None:
    report = await run_check(ServerConfig(name="c", url="http://gw:4000"), endpoints=[Endpoint.COMPLETION], tokens=16,
                             timeout=5, connect=_gateway(FakeLlama.plain()))
    assert report.verdict == "unchecked" and "need /completion" in report.summary


@pytest.mark.parametrize(("key", "phrase"), [(None, "no API key was sent"), ("wrong", "the API key sent was refused")])
async def test_the_report_says_whether_a_key_was_sent(key: str | None, phrase: str, monkeypatch) -> None:
    server = {"api_key_env": "CHECK_KEY"} if key else {}
    if key:
        monkeypatch.setenv("CHECK_KEY", key)
    report = await _check(FakeLlama.plain(api_key="right"), **server)
    assert (report.verdict, report.reason, report.api_key_sent) == ("unchecked", "unauthorized", key is not None)
    assert phrase in report.summary
    assert report.as_json()["reason"] == "unauthorized"


async def test_the_key_hint_names_the_flags_of_the_front_end_that_checks() -> None:
    """`specwatch check` names its flags; the pytest plugin, checking the same way, names its own."""
    from specwatch.gate.options import PLUGIN

    as_check = await _check(FakeLlama.plain(api_key="right"))
    assert as_check.summary.endswith("; no API key was sent: give --api-key-file or --api-key-env")
    as_plugin = await run_check(ServerConfig(name="check", url="http://srv:8080"), endpoints=list(Endpoint), tokens=16,
                                timeout=5, spelling=PLUGIN,
                                connect=serving(FakeLlama.plain(api_key="right")))
    assert as_plugin.summary.endswith("; no API key was sent: give --specwatch-api-key-file or --specwatch-api-key-env")


async def test_each_failed_endpoint_carries_its_closed_set_reason() -> None:
    def failing(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions":
            return httpx.Response(503, json={"error": {"code": 503, "message": "Loading model"}})
        return FakeLlama.plain()(request)

    report = await run_check(ServerConfig(name="c", url="http://s:8080"), endpoints=[Endpoint.CHAT, Endpoint.COMPLETION],
                             tokens=8, timeout=5, connect=serving(failing))
    entries = {e["endpoint"]: e for e in report.as_json()["endpoints"]}
    assert (entries["chat"]["reason"], entries["completion"]["reason"]) == ("loading", None)


# ---- real servers behind a balancer and a gateway ----------------------------------------------------------------


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory: pytest.TempPathFactory):
    """A real plain and a real draft-simple llama-server on the tiny cycle model, of a build: started once per build."""
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.demo.tinymodel import write_cycle_model

    model = write_cycle_model(tmp_path_factory.mktemp("pair") / "cycle.gguf")
    started: dict[str, tuple[LlamaServer, LlamaServer]] = {}

    def pair(build: str) -> tuple[LlamaServer, LlamaServer]:
        if build not in started:
            started[build] = tuple(LlamaServer.of_kind(kind, model, build=builds.get(build)).start()
                                   for kind in ("plain", "draft"))
        return started[build]

    yield pair
    for servers in started.values():
        for server in servers:
            server.close()


def _cli_check(url: str, *args: str) -> tuple[int, dict]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "specwatch", "check", url, "--json", *args], capture_output=True, text=True,
                          timeout=300)
    return done.returncode, json.loads(done.stdout)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("per", ["request", "connection"])
@builds.each
def test_check_through_a_round_robin_balancer_is_never_clean_in_ten_runs(real_pair, build: str, per: str) -> None:
    from tests.support.proxy import Proxy

    plain, draft = real_pair(build)
    with Proxy([plain.url, draft.url], per=per) as proxy:
        outcomes = [_cli_check(proxy.url, "--tokens", "16") for _ in range(10)]
    verdicts = [report["verdict"] for _, report in outcomes]
    assert "clean" not in verdicts, verdicts
    assert all(code != 0 for code, _ in outcomes)
    # Mostly the signs say why: the replicas' /props differ (each process has its own media_marker).
    assert sum(bool(report["signs"]) for _, report in outcomes) >= 8, [r["signs"] for _, r in outcomes]
    # Fill-ins that any canary met are proof, signs or not: fill_ins, exit 1, with the sign beside them.
    proven = [(code, report) for code, report in outcomes if any(e["fill_ins"] for e in report["endpoints"])]
    assert all((code, report["verdict"]) == (1, "fill_ins") for code, report in proven), verdicts
    assert all("answers cannot come from one server" in report["summary"] for _, report in proven if report["signs"])
    if per == "request":  # every run's canaries reach both replicas
        assert len(proven) == len(outcomes), verdicts


@pytest.mark.real
@builds.each
def test_check_through_an_openai_only_gateway(real_pair, build: str) -> None:
    from tests.support.proxy import Proxy

    plain, draft = real_pair(build)
    with Proxy([draft.url], v1_only=True) as gateway:
        code, report = _cli_check(gateway.url)
    assert (code, report["verdict"], report["gateway"]) == (1, "fill_ins", True)
    assert report["unreachable"] == ["/props", "/slots"]
    assert {e["endpoint"] for e in report["endpoints"]} == {"v1_completion", "v1_completion_stream", "chat", "chat_stream"}
    with Proxy([plain.url], v1_only=True) as gateway:
        code, report = _cli_check(gateway.url)
    assert (code, report["verdict"]) == (0, "clean"), report["summary"]
    assert "forwards only /v1/*" in report["summary"]


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "draft"])
@builds.each
def test_a_real_trained_model_is_clean_plain_and_serves_fill_ins_drafting_with_itself(build: str, kind: str) -> None:
    """Gemma 3 270M, not the cycle model: a plain server is clean and one drafting with itself (-md the same file,
    draft-simple) serves fill-ins, on each build. A raw-prompt and a chat canary of 8 tokens each: the fewest that
    prove a server clean where /slots says it does not speculate, and enough to catch every drafted token."""
    from specwatch.demo.llamaserver import LlamaServer
    from tests.support import gemma

    with LlamaServer.of_kind(kind, gemma.model(), build=builds.get(build)) as server:
        code, report = _cli_check(server.url, "--endpoint", "completion", "--endpoint", "chat", "--tokens", "8")
    assert (code, report["verdict"], report["speculation_slots"]) == {
        "plain": (0, "clean", False), "draft": (1, "fill_ins", True)}[kind], report["summary"]
    assert [e["endpoint"] for e in report["endpoints"]] == ["completion", "chat"]
    for entry in report["endpoints"]:
        assert entry["judged_tokens"] == 7, entry
        if kind == "plain":
            assert (entry["fill_ins"], entry["draft_n"]) == (0, None), entry
        else:
            assert entry["fill_ins"] == 7 and entry["draft_n"] > 0, entry
