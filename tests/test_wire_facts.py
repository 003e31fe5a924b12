"""Check the llama-server behaviour specwatch relies on against the real binary."""

from __future__ import annotations

import json
import os
import subprocess
import time
import types
import urllib.error
import urllib.request

import pytest

from specwatch.demo.llamaserver import SERVER_KINDS, LlamaServer, LlamaServerError, find_llama_server
from specwatch.demo.tinymodel import cycle_text, write_cycle_model, write_mtp_cycle_model
from tests.support.net import free_port
from tests.support.process import _stop_group

pytestmark = pytest.mark.real

N_TOKENS = 48
# N-gram speculation drafts only once the text repeats, so the prompt repeats.
PROMPT = cycle_text(repeats=3).strip()
API_KEY = "specwatch-test-key"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("model") / "cycle.gguf")


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("q8") / "cycle-q8_0.gguf", tensor_type="Q8_0")


@pytest.fixture(scope="module")
def server(model):
    """Start each kind of server once for the whole module, on first use."""
    started: dict[str, LlamaServer] = {}

    def get(kind: str) -> LlamaServer:
        if kind not in started:
            started[kind] = LlamaServer.of_kind(kind, model).start()
        return started[kind]

    yield get
    for s in started.values():
        s.close()


def request(server, method, path, body=None, *, key=None):
    """Return (status, parsed JSON body) without raising on HTTP errors."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def stream(server, path, body):
    """Return the parsed data events of a streaming request."""
    req = urllib.request.Request(
        server.url + path,
        data=json.dumps({**body, "stream": True}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    events = []
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:"):].strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events


def chat(server, **extra):
    status, body = request(server, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": N_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        **extra,
    })
    assert status == 200, body
    return body


def completion(server, **extra):
    status, body = request(server, "POST", "/completion", {
        "prompt": PROMPT,
        "n_predict": N_TOKENS,
        "temperature": 0,
        "n_probs": 3,
        **extra,
    })
    assert status == 200, body
    return body


def is_fill_in(tok, alt_key="top_logprobs", value_key="logprob", value=0.0):
    return tok[value_key] == value and tok[alt_key] == []


def check_fill_ins(kind, toks, alt_key="top_logprobs", value_key="logprob", value=0.0, n_alts=3):
    """Fill-ins carry the fixed value and an empty list of alternatives."""
    assert len(toks) == N_TOKENS
    first, rest = toks[0], toks[1:]
    assert len(first[alt_key]) == n_alts, "the first token is always real"
    fills = sum(is_fill_in(t, alt_key, value_key, value) for t in rest)
    if kind == "plain":
        assert fills == 0
        assert all(len(t[alt_key]) == n_alts for t in rest)
    elif kind == "draft":
        assert fills == len(rest)
    else:
        # ngram-mod keeps its n-gram table across requests, so how many tokens
        # it drafts depends on what the server generated before.
        assert fills > 0
    for t in toks:
        if not is_fill_in(t, alt_key, value_key, value):
            assert len(t[alt_key]) == n_alts
            assert t[alt_key][0]["token"] == t["token"]


def check_stream_gaps(kind, chunks, key):
    """After the first content chunk, a speculated token's chunk has no `key` at all."""
    missing = sum(key not in c for c in chunks[1:])
    if kind == "plain":
        assert missing == 0
    elif kind == "draft":
        assert missing == len(chunks) - 1
    else:
        assert missing > 0


KINDS = list(SERVER_KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_props_reports_no_speculation_on_every_server(server, kind):
    status, props = request(server(kind), "GET", "/props")
    assert status == 200
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"


@pytest.mark.parametrize("kind", KINDS)
def test_slots_report_speculation(server, kind):
    status, slots = request(server(kind), "GET", "/slots")
    assert status == 200
    assert isinstance(slots, list) and len(slots) == 1
    assert slots[0]["speculative"] is (kind != "plain")


@pytest.mark.parametrize("kind", KINDS)
def test_model_repeats_its_cycle(server, kind):
    body = completion(server(kind), n_probs=0)
    assert cycle_text(repeats=2) in body["content"]


@pytest.mark.parametrize("kind", KINDS)
def test_chat_logprobs_fill_ins(server, kind):
    body = chat(server(kind))
    assert cycle_text(repeats=2).strip() in body["choices"][0]["message"]["content"]
    check_fill_ins(kind, body["choices"][0]["logprobs"]["content"])
    real = body["choices"][0]["logprobs"]["content"][0]
    assert -0.5 < real["logprob"] < -0.2


@pytest.mark.parametrize("kind", KINDS)
def test_completion_n_probs_fill_ins(server, kind):
    body = completion(server(kind))
    check_fill_ins(kind, body["completion_probabilities"])
    if kind != "plain":
        assert body["timings"]["draft_n"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_completion_post_sampling_probs_fill_ins(server, kind):
    body = completion(server(kind), post_sampling_probs=True)
    # Greedy sampling leaves one candidate, so a real token here also has
    # prob 1.0: only the empty list tells a fill-in apart.
    check_fill_ins(kind, body["completion_probabilities"], "top_probs", "prob", 1.0, n_alts=1)


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_chat_drops_logprobs_after_first_chunk(server, kind):
    events = stream(server(kind), "/v1/chat/completions", {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": N_TOKENS,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    })
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content) >= N_TOKENS // 2
    assert content[0]["choices"][0].get("logprobs")
    check_stream_gaps(kind, [e["choices"][0] for e in content], "logprobs")


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_completion_drops_probabilities_after_first_chunk(server, kind):
    events = stream(server(kind), "/completion", {
        "prompt": PROMPT, "n_predict": N_TOKENS, "temperature": 0, "n_probs": 3,
    })
    content = [e for e in events if e.get("content")]
    assert len(content) >= N_TOKENS // 2
    assert content[0].get("completion_probabilities")
    check_stream_gaps(kind, content, "completion_probabilities")


def v1_completion_body(**extra):
    return {"prompt": PROMPT, "max_tokens": N_TOKENS, "temperature": 0, "logprobs": 3, **extra}


def stream_payloads(server, path, body):
    """Every `data:` payload of a streaming request, `[DONE]` included, parsed where it is JSON."""
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        lines = [raw.decode().strip() for raw in resp]
    payloads = [line[len("data:"):].strip() for line in lines if line.startswith("data:")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


@pytest.mark.parametrize("kind", KINDS)
def test_v1_completions_answer_the_chat_logprob_shape_with_fill_ins(server, kind):
    status, body = request(server(kind), "POST", "/v1/completions", v1_completion_body())
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == str(server(kind).model)
    choice = body["choices"][0]
    assert cycle_text(repeats=2).strip() in choice["text"] and set(choice["logprobs"]) == {"content"}
    check_fill_ins(kind, choice["logprobs"]["content"])
    assert ("draft_n" in body["timings"]) is (kind != "plain")


@pytest.mark.parametrize("kind", KINDS)
def test_streaming_v1_completions_send_null_logprobs_for_fill_ins_and_timings_last(server, kind):
    payloads = stream_payloads(server(kind), "/v1/completions", v1_completion_body())
    assert payloads[-1] == "[DONE]"
    events, last = payloads[:-2], payloads[-2]
    assert last["choices"][0]["text"] == "" and last["choices"][0]["finish_reason"] == "length"
    assert last["choices"][0]["logprobs"] is None and "usage" in last
    assert all("timings" not in e for e in events) and ("draft_n" in last["timings"]) is (kind != "plain")
    choices = [e["choices"][0] for e in events]
    assert len(choices) == N_TOKENS and all(c["text"] for c in choices)
    assert len(choices[0]["logprobs"]["content"]) == 1
    # Unlike a chat stream, the key stays: a fill-in's chunk says "logprobs": null.
    assert all("logprobs" in c for c in choices)
    nulls = sum(c["logprobs"] is None for c in choices[1:])
    if kind == "plain":
        assert nulls == 0
    elif kind == "draft":
        assert nulls == N_TOKENS - 1
    else:
        assert nulls > 0


@pytest.mark.parametrize("kind", ["plain", "draft"])
def test_v1_responses_never_return_logprobs(server, kind):
    body = {"input": PROMPT, "max_output_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3,
            "include": ["message.output_text.logprobs"]}
    status, answer = request(server(kind), "POST", "/v1/responses", body)
    assert status == 200, answer
    (text,) = answer["output"][0]["content"]
    assert text["type"] == "output_text" and text["text"] and text["logprobs"] == []
    status, refused = request(server(kind), "POST", "/v1/responses", {**body, "logprobs": False})
    assert (status, refused["error"]["message"]) == (400, "top_logprobs requires logprobs to be set to true")


def test_props_media_marker_is_new_at_every_start(model):
    with LlamaServer(model) as s:
        first = request(s, "GET", "/props")[1]["media_marker"]
        s.restart()
        second = request(s, "GET", "/props")[1]["media_marker"]
    assert first.startswith("<__media_") and second.startswith("<__media_") and first != second


@pytest.mark.parametrize("with_key", [False, True])
def test_a_loading_server_answers_503_everywhere_before_any_key_check(tmp_path, with_key):
    fifo = tmp_path / "never-written.gguf"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: the model never finishes loading
    port = free_port()
    command = [str(find_llama_server()), "-m", str(fifo), "--host", "127.0.0.1", "--port", str(port), "-t", "1"]
    if with_key:
        command += ["--api-key", API_KEY]
    with (tmp_path / "server.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    loading = types.SimpleNamespace(url=f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = request(loading, "GET", "/health")
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, "llama-server never listened"
                time.sleep(0.05)
        expected = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
        assert (status, body) == (503, expected)
        for path in ("/props", "/slots", "/metrics"):
            assert request(loading, "GET", path) == (503, expected)
            assert request(loading, "GET", path, key="wrong") == (503, expected)
        assert request(loading, "POST", "/v1/completions", v1_completion_body()) == (503, expected)
    finally:
        _stop_group(proc, 5)


def test_slots_wakes_a_sleeping_server_and_props_does_not(model):
    # Two idle seconds leave room between the wake-up and the look at /props that follows it.
    with LlamaServer(model, ["--sleep-idle-seconds", "2"]) as s:
        def sleeping():
            return request(s, "GET", "/props")[1]["is_sleeping"]

        deadline = time.monotonic() + 10
        while not sleeping():
            assert time.monotonic() < deadline, "the server never fell asleep"
            time.sleep(0.2)
        assert request(s, "GET", "/health") == (200, {"status": "ok"})
        assert sleeping()
        assert request(s, "GET", "/slots")[0] == 200
        assert not sleeping()


@pytest.mark.parametrize("kind", KINDS)
def test_a_q8_0_model_runs_the_quantized_kernels_and_serves_fill_ins_like_f32(q8_model, kind):
    with LlamaServer.of_kind(kind, q8_model) as s:
        status, props = request(s, "GET", "/props")
        assert (status, props["model_ftype"]) == (200, "Q8_0")
        body = completion(s)
        assert cycle_text(repeats=2) in body["content"]
        check_fill_ins(kind, body["completion_probabilities"])
        # Quantization moves the successor's probability by about a thousandth, not the cycle.
        assert -0.5 < body["completion_probabilities"][0]["logprob"] < -0.2
        if kind != "plain":
            assert body["timings"]["draft_n"] > 0


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    return write_mtp_cycle_model(tmp_path_factory.mktemp("mtp") / "cycle-mtp.gguf")


def test_mtp_heads_draft_and_serve_fill_ins_like_a_draft_model(mtp_model):
    with LlamaServer(mtp_model, ["--spec-type", "draft-mtp"]) as s:
        assert request(s, "GET", "/slots")[1][0]["speculative"] is True
        body = completion(s)
        assert cycle_text(repeats=2) in body["content"]
        check_fill_ins("draft", body["completion_probabilities"])
        assert body["timings"]["draft_n"] > 0 and body["timings"]["draft_n_accepted"] == body["timings"]["draft_n"]
        # Once a slot has run a task, its params name the speculation types, unlike /props.
        assert request(s, "GET", "/slots")[1][0]["params"]["speculative.types"] == "none,draft-mtp"
        assert request(s, "GET", "/props")[1]["default_generation_settings"]["params"]["speculative.types"] == "none"
    with LlamaServer(mtp_model) as plain:
        check_fill_ins("plain", completion(plain)["completion_probabilities"])


def test_draft_mtp_on_a_model_without_mtp_heads_does_not_start(model):
    server = LlamaServer(model, ["--spec-type", "draft-mtp"], startup_timeout=30)
    try:
        with pytest.raises(LlamaServerError, match="exited with code 1"):
            server.start()
        assert "model doesn't contain MTP layers" in server.log_path.read_text()
    finally:
        server.close()


def test_api_key_guards_props_but_not_health(model):
    with LlamaServer(model, ["--api-key", API_KEY]) as s:
        assert request(s, "GET", "/health")[0] == 200
        status, body = request(s, "GET", "/props")
        assert status == 401
        assert body["error"]["type"] == "authentication_error"
        assert request(s, "GET", "/props", key="wrong")[0] == 401
        assert request(s, "GET", "/props", key=API_KEY)[0] == 200
        assert request(s, "GET", "/slots")[0] == 401
        assert request(s, "GET", "/slots", key=API_KEY)[0] == 200


def test_no_slots_answers_501(model):
    with LlamaServer(model, ["--no-slots"]) as s:
        status, body = request(s, "GET", "/slots")
        assert status == 501
        assert body["error"]["type"] == "not_supported_error"
        assert request(s, "GET", "/props")[0] == 200


def test_restart_keeps_url(model):
    with LlamaServer(model) as s:
        url = s.url
        pid = s._proc.pid
        s.restart()
        assert s.url == url and s._proc.pid != pid
        assert request(s, "GET", "/health")[0] == 200
    assert not s.running


def test_no_request_field_switches_speculation_off(server):
    body = completion(server("draft"), **{"speculative.n_max": 0, "speculative.n_min": 0})
    check_fill_ins("draft", body["completion_probabilities"])
    assert body["timings"]["draft_n"] > 0


def test_draft_timings_only_where_the_server_drafted(server):
    assert completion(server("draft"))["timings"]["draft_n"] > 0
    assert "draft_n" not in completion(server("plain"))["timings"]


def test_idle_connections_are_announced_to_close_after_five_seconds(server):
    # The exporter gives up idle connections a second earlier, so a reuse never races the close.
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server("plain").port, timeout=10)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        assert response.getheader("Keep-Alive", "").split(",")[0] == "timeout=5"
    finally:
        connection.close()


def test_ngram_map_k_drafts_only_if_its_first_request_is_a_completion(model):
    """Why the canary asks /completion first: a fresh ngram-map-k server whose first request is a chat never drafts."""
    from specwatch.endpoints import Endpoint
    from specwatch.probe.canary import TABLE

    completion, chat = TABLE[Endpoint.COMPLETION], TABLE[Endpoint.CHAT]
    drafted = {}
    for first in (completion, chat):
        with LlamaServer(model, ["--spec-type", "ngram-map-k"]) as fresh:
            request(fresh, "POST", first.path, first.body(8))
            status, body = request(fresh, "POST", completion.path, completion.body(8))
            assert status == 200, body
            drafted[first.endpoint] = body["timings"].get("draft_n")
    assert drafted[Endpoint.COMPLETION] and drafted[Endpoint.COMPLETION] > 0
    assert drafted[Endpoint.CHAT] is None


def test_a_model_query_and_autoload_are_ignored_by_a_server_that_is_not_a_router(server):
    """specwatch adds ?model=...&autoload=false whenever it names a model; a plain server must answer as usual."""
    status, props = request(server("plain"), "GET", "/props?model=anything&autoload=false")
    assert status == 200 and "role" not in props and props["default_generation_settings"]["params"] is not None
