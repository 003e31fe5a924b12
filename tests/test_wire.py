"""The llama-server wire model itself: router loading rules, /metrics counters, logprob and stream shapes, the loopback host."""

from __future__ import annotations

import ast
import json
import math
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import builds
from tests.support.loopback import FaultServer
from tests.support.wire import FakeLlama, FakeRouter, Request

NOT_LOADED = {"error": {"code": 400, "message": "model is not loaded", "type": "invalid_request_error"}}
CHAT = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 6, "logprobs": True, "top_logprobs": 3}
COMPLETION = {"prompt": "the cat", "n_predict": 10, "n_probs": 3}


def get(server: Any, path: str, **query: str) -> tuple[int, Any]:
    answer = server.answer(Request("GET", path, query))
    return answer.status, json.loads(answer.body) if answer.content_type.startswith("application/json") else answer.body


def post(server: Any, path: str, body: dict[str, Any], **query: str) -> tuple[int, Any]:
    answer = server.answer(Request("POST", path, query, {"content-type": "application/json"}, json.dumps(body).encode()))
    if answer.streaming:
        return answer.status, [json.loads(c[6:]) if c != b"data: [DONE]\n\n" else "[DONE]" for c in answer.chunks]
    return answer.status, json.loads(answer.body)


def router(**kw: Any) -> FakeRouter:
    models = {name: FakeLlama.plain(model_alias=name) for name in ("a", "b", "c")}
    models["d"] = FakeLlama.draft(model_alias="d")
    return FakeRouter(models=models, **kw)


# ---- router mode --------------------------------------------------------------------------------------------------


def test_router_lists_every_model_with_its_status() -> None:
    fleet = router(status={"a": "loaded", "b": "sleeping", "c": "loading"})
    status, listing = get(fleet, "/models")
    assert status == 200
    assert [(m["id"], m["status"]["value"]) for m in listing["data"]] == [
        ("a", "loaded"), ("b", "sleeping"), ("c", "loading"), ("d", "unloaded")]
    first = listing["data"][0]
    assert {k: first[k] for k in ("object", "owned_by", "aliases", "tags", "source", "can_remove")} == {
        "object": "model", "owned_by": "llamacpp", "aliases": [], "tags": [], "source": "preset", "can_remove": False}
    assert "-md" not in first["status"]["args"] and first["status"]["preset"].startswith("[a]\n")
    draft = listing["data"][3]["status"]
    assert "-md" in draft["args"] and "spec-type = draft-simple" in draft["preset"]
    assert get(fleet, "/v1/models") == (status, listing)
    assert fleet.loads == []


def test_router_props_describe_the_router_and_forward_with_a_model() -> None:
    fleet = router(status={"a": "loaded"}, models_max=2)
    status, props = get(fleet, "/props")
    assert status == 200
    assert props == {"role": "router", "max_instances": 2, "models_autoload": True, "model_alias": "llama-server",
                     "model_path": "none", "default_generation_settings": {"params": None, "n_ctx": 0},
                     "build_info": "b0-unknown"}
    status, child = get(fleet, "/props", model="a", autoload="false")
    assert status == 200 and "role" not in child and child["model_alias"] == "a"
    assert child["default_generation_settings"]["params"]["speculative.types"] == "none"


@pytest.mark.parametrize("method", ["GET /props", "GET /slots", "GET /metrics", "POST /completion", "POST /v1/chat/completions"])
def test_autoload_false_answers_400_and_loads_nothing(method: str) -> None:
    fleet = router(status={"a": "loaded"})
    verb, path = method.split()
    if verb == "GET":
        answer = get(fleet, path, model="d", autoload="false")
    else:
        answer = post(fleet, path, {**COMPLETION, "model": "d"}, autoload="false")
    assert answer == (400, NOT_LOADED)
    assert fleet.loads == [] and fleet.status["d"] == "unloaded" and fleet.resident() == ["a"]
    assert fleet.models["d"].counters.tokens_predicted == 0


def test_a_request_naming_an_unloaded_model_loads_it_and_evicts_the_least_recently_used() -> None:
    fleet = router(status={"a": "loaded", "b": "loaded"}, models_max=2)
    assert get(fleet, "/slots", model="a")[0] == 200  # a is now the most recently used
    status, answer = post(fleet, "/v1/chat/completions", {**CHAT, "model": "d"})
    assert status == 200 and answer["model"] == "d"
    assert fleet.loads == ["d"] and fleet.evictions == ["b"]
    assert fleet.status == {"a": "loaded", "b": "unloaded", "c": "unloaded", "d": "loaded"}
    assert [m["status"]["value"] for m in get(fleet, "/models")[1]["data"]] == ["loaded", "unloaded", "unloaded", "loaded"]
    status, slots = get(fleet, "/slots", model="c")  # a GET loads too, and evicts the next least recently used
    assert status == 200 and slots[0]["speculative"] is False
    assert fleet.loads == ["d", "c"] and fleet.evictions == ["b", "a"] and fleet.resident() == ["d", "c"]


def test_load_endpoint_and_a_router_started_without_autoload() -> None:
    fleet = router(autoload=False)
    assert get(fleet, "/props")[1]["models_autoload"] is False
    assert get(fleet, "/props", model="b") == (400, NOT_LOADED)
    assert post(fleet, "/models/load", {"model": "b"}) == (200, {"success": True})
    assert get(fleet, "/props", model="b")[1]["model_alias"] == "b"
    assert get(fleet, "/props", model="c", autoload="true")[0] == 200
    assert fleet.loads == ["b", "c"]
    assert post(fleet, "/models/load", {"model": "nope"})[0] == 400
    assert get(fleet, "/slots")[0] == 400  # which model's slots: the router cannot tell
    assert post(fleet, "/models/unload", {"model": "b"}) == (200, {"success": True})
    assert fleet.status["b"] == "unloaded" and fleet.resident() == ["c"]


def test_reading_a_sleeping_model_does_not_wake_it_but_work_does() -> None:
    fleet = router(status={"b": "sleeping"})
    assert get(fleet, "/props", model="b", autoload="false")[1]["is_sleeping"] is True
    assert fleet.status["b"] == "sleeping"
    assert post(fleet, "/completion", {**COMPLETION, "model": "b"})[0] == 200
    assert fleet.status["b"] == "loaded" and get(fleet, "/props", model="b")[1]["is_sleeping"] is False
    assert fleet.loads == []


def test_router_health_stays_open_behind_an_api_key() -> None:
    fleet = router(status={"a": "loaded"}, api_key="k")
    with httpx.Client(transport=httpx.MockTransport(fleet), base_url="http://router") as client:
        assert client.get("/health").json() == {"status": "ok"}
        assert client.get("/models").status_code == 401
        assert client.get("/props", params={"model": "a"}, headers={"Authorization": "Bearer k"}).json()["model_alias"] == "a"
    assert [r.path for r in fleet.requests] == ["/health", "/models", "/props"]


# ---- one server ---------------------------------------------------------------------------------------------------


def metrics(server: Any) -> dict[str, float]:
    status, text = get(server, "/metrics")
    assert status == 200
    return {s.name: s.value for f in text_string_to_metric_families(text.decode()) for s in f.samples}


def test_metrics_counters_grow_by_what_completions_generated() -> None:
    draft, plain = FakeLlama.draft(tokens=None), FakeLlama.plain(tokens=None)
    for server in (draft, plain):
        assert metrics(server)["llamacpp:tokens_predicted_total"] == 0
        post(server, "/completion", COMPLETION)
        post(server, "/v1/chat/completions", {**CHAT, "stream": True})
    assert metrics(draft) == {
        "llamacpp:prompt_tokens_total": 98, "llamacpp:tokens_predicted_total": 16, "llamacpp:spec_decode_num_drafts_total": 2,
        "llamacpp:spec_decode_num_draft_tokens_total": 16, "llamacpp:spec_decode_num_accepted_tokens_total": 12,
        "llamacpp:requests_processing": 0, "llamacpp:requests_deferred": 0,
    }
    counted = metrics(plain)
    assert counted["llamacpp:tokens_predicted_total"] == 16
    assert counted["llamacpp:spec_decode_num_draft_tokens_total"] == 0
    assert get(FakeLlama.plain(metrics_enabled=False), "/metrics")[1]["error"]["type"] == "not_supported_error"


def test_a_fixed_token_count_ignores_what_the_request_asks() -> None:
    status, answer = post(FakeLlama.draft(tokens=8), "/completion", COMPLETION)
    assert status == 200 and len(answer["completion_probabilities"]) == 8
    assert answer["timings"]["draft_n"] == 8 and answer["timings"]["draft_n_accepted"] == 6


def test_fill_ins_have_no_alternatives_and_the_first_token_is_real() -> None:
    _, chat = post(FakeLlama.draft(tokens=None), "/v1/chat/completions", CHAT)
    entries = chat["choices"][0]["logprobs"]["content"]
    assert len(entries) == 6 and chat["usage"]["completion_tokens"] == 6
    assert entries[0]["logprob"] == pytest.approx(math.log(0.7)) and len(entries[0]["top_logprobs"]) == 3
    assert all(e["logprob"] == 0.0 and e["top_logprobs"] == [] for e in entries[1:])
    _, post_sampling = post(FakeLlama.draft(tokens=None), "/completion", {**COMPLETION, "post_sampling_probs": True})
    probs = post_sampling["completion_probabilities"]
    assert probs[0]["prob"] == pytest.approx(0.7) and [a["prob"] for a in probs[0]["top_probs"]] == pytest.approx([0.7, 0.2, 0.05])
    assert all(e["prob"] == 1.0 and e["top_probs"] == [] and "logprob" not in e for e in probs[1:])
    _, zero = post(FakeLlama.plain(tokens=4, real_zero_at={2}), "/completion", COMPLETION)
    assert zero["completion_probabilities"][2]["logprob"] == 0.0 and len(zero["completion_probabilities"][2]["top_logprobs"]) == 3
    _, bare = post(FakeLlama.plain(tokens=4), "/completion", {"prompt": "x", "n_predict": 4})
    assert "completion_probabilities" not in bare and bare["content"] == " the cat sat on"


def test_a_speculating_stream_drops_the_logprobs_key_after_the_first_token() -> None:
    status, events = post(FakeLlama.draft(tokens=None), "/v1/chat/completions", {**CHAT, "stream": True})
    assert status == 200 and events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    content = events[1:-2]
    assert [e["choices"][0]["delta"]["content"] for e in content] == [" the", " cat", " sat", " on", " the", " mat"]
    assert "logprobs" in content[0]["choices"][0] and all("logprobs" not in e["choices"][0] for e in content[1:])
    assert events[-2]["choices"][0]["finish_reason"] == "length" and events[-2]["timings"]["draft_n"] == 6
    _, native = post(FakeLlama.draft(tokens=None), "/completion", {**COMPLETION, "stream": True})
    assert native[-1]["stop"] is True and "[DONE]" not in native  # the native stream ends with its stop event
    assert "completion_probabilities" in native[0] and all("completion_probabilities" not in e for e in native[1:])
    _, plain = post(FakeLlama.plain(tokens=None), "/completion", {**COMPLETION, "stream": True})
    assert all(len(e["completion_probabilities"][0]["top_logprobs"]) == 3 for e in plain[:-1])


def test_answers_follow_changes_to_the_server() -> None:
    fake = FakeLlama.draft(tokens=4)
    before = post(fake, "/completion", COMPLETION)[1]["completion_probabilities"]
    fake.fill_ins.clear()
    fake.props_types = "draft-simple"
    fake.model_alias = "renamed.gguf"
    after = post(fake, "/completion", COMPLETION)[1]
    assert [e["top_logprobs"] == [] for e in before] == [False, True, True, True]
    assert all(len(e["top_logprobs"]) == 3 for e in after["completion_probabilities"]) and after["model"] == "renamed.gguf"
    props = get(fake, "/props")[1]
    assert props["default_generation_settings"]["params"]["speculative.types"] == "draft-simple"
    assert props["model_alias"] == "renamed.gguf" and props["model_path"] == "/models/renamed.gguf"


def test_errors_in_llama_server_shapes() -> None:
    locked = FakeLlama.plain(api_key="k")
    assert get(locked, "/health") == (200, {"status": "ok"})
    assert get(locked, "/props") == (401, {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}})
    assert get(FakeLlama.plain(), "/nope") == (404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
    assert get(FakeLlama.plain(slots_enabled=False), "/slots") == (501, {"error": {
        "code": 501, "message": "This server does not support slots endpoint. Start it with `--slots`",
        "type": "not_supported_error"}})
    assert get(FakeLlama.plain(), "/v1/models")[1]["data"][0]["id"] == "tiny.gguf"


# ---- the loopback host --------------------------------------------------------------------------------------------


def test_loopback_streams_chunked_with_llama_server_keep_alive() -> None:
    with FaultServer(FakeLlama.draft(tokens=4), token_delay=0.05) as server, httpx.Client(base_url=server.url) as client:
        started = time.monotonic()
        with client.stream("POST", "/completion", json={**COMPLETION, "stream": True}) as answer:
            lines = [line for line in answer.iter_lines() if line]
            took = time.monotonic() - started
        assert answer.headers["transfer-encoding"] == "chunked" and answer.headers["keep-alive"] == "timeout=5, max=100"
        assert len(lines) == 5 and json.loads(lines[-1][6:])["stop"] is True
        assert took >= 4 * 0.05 * 0.9  # one delay between each of the five events
        assert client.get("/props").json()["model_alias"] == "tiny.gguf"
    assert [s.path for s in server.seen] == ["/completion", "/props"] and server.count("/props") == 1


def test_loopback_closes_an_idle_connection_and_the_hundredth_request() -> None:
    with FaultServer(keepalive_timeout=0.3) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert sock.recv(4096).endswith(b'{"status":"ok"}')
            time.sleep(0.6)
            assert sock.recv(4096) == b""
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
    assert received.count(b"HTTP/1.1 200 OK") == 100
    assert received.count(b"Keep-Alive: timeout=0.3, max=100") == 99 and received.count(b"Connection: close") == 1


def test_nothing_in_tests_imports_bench() -> None:
    found = []
    for path in Path(__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n == "bench" or n.startswith("bench.")]
    assert found == []


# ---- the contract: the wire model answers as the real llama-server does --------------------------------------------


def _skeleton(value: Any) -> Any:
    """A JSON value's shape: objects by key, a list by its first element, scalars by type."""
    if isinstance(value, dict):
        return {key: _skeleton(item) for key, item in value.items()}
    if isinstance(value, list):
        return ["list", _skeleton(value[0]) if value else None]
    if isinstance(value, bool):
        return "bool"
    return "null" if value is None else type(value).__name__


def _drift(real: Any, fake: Any, path: str = "") -> list[str]:
    """Where the fake's shape differs from the real one: a key the real server never sends, or another type. The fake
    may leave out keys specwatch does not read (it answers what specwatch and its tests need)."""
    if isinstance(real, dict) and isinstance(fake, dict):
        found = [f"{path}.{key}: the real server does not send it" for key in fake if key not in real]
        return found + [d for key in fake if key in real for d in _drift(real[key], fake[key], f"{path}.{key}")]
    if isinstance(real, list) and isinstance(fake, list):
        return [] if real[1] is None or fake[1] is None else _drift(real[1], fake[1], f"{path}[]")
    return [] if real == fake else [f"{path}: the real server sends {real}, the fake {fake}"]


def _events(answer: httpx.Response) -> list[Any]:
    return [json.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data:") and "[DONE]" not in line]


def _same(real: httpx.Response, fake: httpx.Response, what: str) -> None:
    assert real.status_code == fake.status_code, what
    assert real.headers["content-type"].split(";")[0] == fake.headers["content-type"].split(";")[0], what
    if real.headers["content-type"].startswith("text/event-stream"):
        real_events, fake_events = _events(real), _events(fake)
        # Framing: as many events, [DONE] or not; each event's shape, first, in the middle and last.
        assert (len(real_events), "[DONE]" in real.text) == (len(fake_events), "[DONE]" in fake.text), what
        for index in (0, len(real_events) // 2, -1):
            assert _drift(_skeleton(real_events[index]), _skeleton(fake_events[index])) == [], f"{what}, event {index}"
        return
    assert _drift(_skeleton(real.json()), _skeleton(fake.json())) == [], what


@pytest.fixture(scope="module")
def contract_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specwatch.demo.tinymodel import write_cycle_model

    return write_cycle_model(tmp_path_factory.mktemp("contract") / "cycle.gguf")


@pytest.mark.real
@pytest.mark.parametrize(("kind", "fake", "extra"), [
    ("plain", lambda: FakeLlama.plain(tokens=None), []),
    ("draft", lambda: FakeLlama.draft(tokens=None), []),
    ("plain", lambda: FakeLlama.plain(tokens=None, slots_enabled=False), ["--no-slots"]),
    ("plain", lambda: FakeLlama.plain(tokens=None, api_key="contract-key"), ["--api-key", "contract-key"]),
], ids=["plain", "draft", "no-slots", "api-key"])
@builds.each
def test_the_wire_model_answers_every_request_specwatch_sends_as_the_real_server_does(contract_model, build, kind, fake,
                                                                                      extra) -> None:
    """On each build: the fake models what both answer, so a shape one build changes fails here under its name."""
    from specwatch.demo.llamaserver import LlamaServer
    from specwatch.probe.canary import TABLE

    # A connection per request: what is compared is each answer, not llama-server's keep-alive race.
    with LlamaServer.of_kind(kind, contract_model, extra, build=builds.get(build)) as server, \
            httpx.Client(base_url=server.url, timeout=60, headers={"Connection": "close"}) as real, \
            httpx.Client(transport=httpx.MockTransport(fake()), base_url="http://fake") as fakes:
        for path in ("/health", "/props", "/v1/models", "/models", "/nothing-here"):
            _same(real.get(path), fakes.get(path), f"GET {path}")
        for endpoint, spec in TABLE.items():
            body = spec.body(8)
            _same(real.post(spec.path, json=body), fakes.post(spec.path, json=body), f"{endpoint} canary")
        # /slots once a slot has run a task: the fake always answers with a task's fields.
        _same(real.get("/slots"), fakes.get("/slots"), "GET /slots")


@pytest.mark.real
def test_the_wire_router_answers_as_the_real_router_does(contract_model, tmp_path: Path) -> None:
    from specwatch.demo.llamaserver import LlamaRouter, router_preset

    preset = router_preset(tmp_path / "preset.ini", {"plain": ["--model", str(contract_model)],
                                                    "cold": ["--model", str(contract_model)]})
    fake = FakeRouter(models={"plain": FakeLlama.plain(tokens=None), "cold": FakeLlama.plain(tokens=None)},
                      status={"plain": "loaded"})
    with LlamaRouter(preset, models_max=2, log_dir=tmp_path) as router, \
            httpx.Client(base_url=router.url, timeout=60, headers={"Connection": "close"}) as real, \
            httpx.Client(transport=httpx.MockTransport(fake), base_url="http://fake") as fakes:
        router.load("plain")
        for path in ("/health", "/props", "/models", "/props?model=plain&autoload=false", "/slots?model=cold&autoload=false"):
            _same(real.get(path), fakes.get(path), f"GET {path}")
        body = {"model": "cold", "prompt": "x", "n_predict": 4, "n_probs": 3}
        _same(real.post("/completion?autoload=false", json=body), fakes.post("/completion?autoload=false", json=body),
              "a canary for a model that is not loaded")
        assert fake.loads == [] and "cold" not in [m["id"] for m in real.get("/models").json()["data"]
                                                   if m["status"]["value"] == "loaded"]
