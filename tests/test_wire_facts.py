"""Check the llama-server behaviour specwatch relies on against the real server, compiled (b11434) and prebuilt (b11549)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import subprocess
import time
import types
import urllib.error
import urllib.request

import pytest

from specwatch.demo.llamaserver import SERVER_KINDS, LlamaRouter, LlamaServer, LlamaServerError, router_preset
from specwatch.demo.tinymodel import cycle_text, write_cycle_model, write_mtp_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.gate.check import run_check
from specwatch.gate.options import DEFAULT_TOKENS
from specwatch.settings.targets import ServerConfig
from tests.support import builds, markdown
from tests.support.builds import PREBUILT, SOURCE
from tests.support.net import free_port
from tests.support.process import _stop_group

pytestmark = pytest.mark.real

N_TOKENS = 48
# N-gram speculation drafts only once the text repeats, so the prompt repeats.
PROMPT = cycle_text(repeats=3).strip()
API_KEY = "specwatch-test-key"
"""/slots[i].params["speculative.types"] once a slot ran a task, for `--spec-type T`: llama-server adds T to its default
list ("none"); the prebuilt launcher (specwatch.demo.prebuilt) sets the list to T alone (the doc's side-by-side table)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("model") / "cycle.gguf")


@pytest.fixture(scope="module")
def q8_model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("q8") / "cycle-q8_0.gguf", tensor_type="Q8_0")


@pytest.fixture(scope="module")
def server(model):
    """Start each kind of server on each build once for the whole module, on first use."""
    started: dict[tuple[str, str], LlamaServer] = {}

    def get(kind: str, build: str) -> LlamaServer:
        if (kind, build) not in started:
            started[kind, build] = LlamaServer.of_kind(kind, model, build=builds.get(build)).start()
        return started[kind, build]

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
@builds.each
def test_props_reports_no_speculation_on_every_server(server, build, kind):
    status, props = request(server(kind, build), "GET", "/props")
    assert status == 200
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_slots_report_speculation(server, build, kind):
    status, slots = request(server(kind, build), "GET", "/slots")
    assert status == 200
    assert isinstance(slots, list) and len(slots) == 1
    assert slots[0]["speculative"] is (kind != "plain")


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_model_repeats_its_cycle(server, build, kind):
    body = completion(server(kind, build), n_probs=0)
    assert cycle_text(repeats=2) in body["content"]


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_chat_logprobs_fill_ins(server, build, kind):
    body = chat(server(kind, build))
    assert cycle_text(repeats=2).strip() in body["choices"][0]["message"]["content"]
    check_fill_ins(kind, body["choices"][0]["logprobs"]["content"])
    real = body["choices"][0]["logprobs"]["content"][0]
    assert -0.5 < real["logprob"] < -0.2


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_completion_n_probs_fill_ins(server, build, kind):
    body = completion(server(kind, build))
    check_fill_ins(kind, body["completion_probabilities"])
    if kind != "plain":
        assert body["timings"]["draft_n"] > 0


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_completion_post_sampling_probs_fill_ins(server, build, kind):
    body = completion(server(kind, build), post_sampling_probs=True)
    # Greedy sampling leaves one candidate, so a real token here also has
    # prob 1.0: only the empty list tells a fill-in apart.
    check_fill_ins(kind, body["completion_probabilities"], "top_probs", "prob", 1.0, n_alts=1)


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_streaming_chat_drops_logprobs_after_first_chunk(server, build, kind):
    events = stream(server(kind, build), "/v1/chat/completions", {
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
@builds.each
def test_streaming_completion_drops_probabilities_after_first_chunk(server, build, kind):
    events = stream(server(kind, build), "/completion", {
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
@builds.each
def test_v1_completions_answer_the_chat_logprob_shape_with_fill_ins(server, build, kind):
    status, body = request(server(kind, build), "POST", "/v1/completions", v1_completion_body())
    assert status == 200, body
    assert body["object"] == "text_completion" and body["model"] == str(server(kind, build).model)
    choice = body["choices"][0]
    assert cycle_text(repeats=2).strip() in choice["text"] and set(choice["logprobs"]) == {"content"}
    check_fill_ins(kind, choice["logprobs"]["content"])
    assert ("draft_n" in body["timings"]) is (kind != "plain")


@pytest.mark.parametrize("kind", KINDS)
@builds.each
def test_streaming_v1_completions_send_null_logprobs_for_fill_ins_and_timings_last(server, build, kind):
    payloads = stream_payloads(server(kind, build), "/v1/completions", v1_completion_body())
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
@builds.each
def test_v1_responses_never_return_logprobs(server, build, kind):
    body = {"input": PROMPT, "max_output_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3,
            "include": ["message.output_text.logprobs"]}
    status, answer = request(server(kind, build), "POST", "/v1/responses", body)
    assert status == 200, answer
    (text,) = answer["output"][0]["content"]
    assert text["type"] == "output_text" and text["text"] and text["logprobs"] == []
    status, refused = request(server(kind, build), "POST", "/v1/responses", {**body, "logprobs": False})
    assert (status, refused["error"]["message"]) == (400, "top_logprobs requires logprobs to be set to true")


@builds.each
def test_props_media_marker_is_new_at_every_start(model, build):
    with LlamaServer(model, build=builds.get(build)) as s:
        first = request(s, "GET", "/props")[1]["media_marker"]
        s.restart()
        second = request(s, "GET", "/props")[1]["media_marker"]
    assert first.startswith("<__media_") and second.startswith("<__media_") and first != second


@pytest.mark.parametrize("with_key", [False, True])
@builds.each
def test_a_loading_server_answers_503_everywhere_before_any_key_check(tmp_path, build, with_key):
    fifo = tmp_path / "never-written.gguf"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer comes: the model never finishes loading
    port = free_port()
    command = [*builds.get(build).launcher, "-m", str(fifo), "--host", "127.0.0.1", "--port", str(port), "-t", "1"]
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
        # The prebuilt server holds SIGTERM until its model has loaded, which this one never does: SIGKILL it soon.
        _stop_group(proc, 1)


@builds.each
def test_slots_wakes_a_sleeping_server_and_props_does_not(model, build):
    # Two idle seconds leave room between the wake-up and the look at /props that follows it.
    with LlamaServer(model, ["--sleep-idle-seconds", "2"], build=builds.get(build)) as s:
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
@builds.each
def test_a_q8_0_model_runs_the_quantized_kernels_and_serves_fill_ins_like_f32(q8_model, build, kind):
    with LlamaServer.of_kind(kind, q8_model, build=builds.get(build)) as s:
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


@builds.each
def test_mtp_heads_draft_and_serve_fill_ins_like_a_draft_model(mtp_model, build):
    with LlamaServer(mtp_model, ["--spec-type", "draft-mtp"], build=builds.get(build)) as s:
        assert request(s, "GET", "/slots")[1][0]["speculative"] is True
        body = completion(s)
        assert cycle_text(repeats=2) in body["content"]
        check_fill_ins("draft", body["completion_probabilities"])
        assert body["timings"]["draft_n"] > 0 and body["timings"]["draft_n_accepted"] == body["timings"]["draft_n"]
        # Once a slot has run a task, its params name the speculation types, unlike /props.
        assert request(s, "GET", "/slots")[1][0]["params"]["speculative.types"] == "none,draft-mtp"
        assert request(s, "GET", "/props")[1]["default_generation_settings"]["params"]["speculative.types"] == "none"
    with LlamaServer(mtp_model, build=builds.get(build)) as plain:
        check_fill_ins("plain", completion(plain)["completion_probabilities"])


@builds.each
def test_draft_mtp_on_a_model_without_mtp_heads_does_not_start(model, build):
    server = LlamaServer(model, ["--spec-type", "draft-mtp"], build=builds.get(build), startup_timeout=30)
    try:
        with pytest.raises(LlamaServerError, match="exited with code 1"):
            server.start()
        assert "model doesn't contain MTP layers" in server.log_path.read_text()
    finally:
        server.close()


@builds.each
def test_api_key_guards_props_but_not_health(model, build):
    with LlamaServer(model, ["--api-key", API_KEY], build=builds.get(build)) as s:
        assert request(s, "GET", "/health")[0] == 200
        status, body = request(s, "GET", "/props")
        assert status == 401
        assert body["error"]["type"] == "authentication_error"
        assert request(s, "GET", "/props", key="wrong")[0] == 401
        assert request(s, "GET", "/props", key=API_KEY)[0] == 200
        assert request(s, "GET", "/slots")[0] == 401
        assert request(s, "GET", "/slots", key=API_KEY)[0] == 200


@builds.each
def test_no_slots_answers_501(model, build):
    with LlamaServer(model, ["--no-slots"], build=builds.get(build)) as s:
        status, body = request(s, "GET", "/slots")
        assert status == 501
        assert body["error"]["type"] == "not_supported_error"
        assert request(s, "GET", "/props")[0] == 200


@builds.each
def test_restart_keeps_url(model, build):
    with LlamaServer(model, build=builds.get(build)) as s:
        url = s.url
        pid = s.pid
        s.restart()
        assert s.url == url and s.pid != pid
        assert request(s, "GET", "/health")[0] == 200
    assert not s.running


@builds.each
def test_no_request_field_switches_speculation_off(server, build):
    body = completion(server("draft", build), **{"speculative.n_max": 0, "speculative.n_min": 0})
    check_fill_ins("draft", body["completion_probabilities"])
    assert body["timings"]["draft_n"] > 0


@builds.each
def test_draft_timings_only_where_the_server_drafted(server, build):
    assert completion(server("draft", build))["timings"]["draft_n"] > 0
    assert "draft_n" not in completion(server("plain", build))["timings"]


@builds.each
def test_idle_connections_are_announced_to_close_after_five_seconds(server, build):
    # The exporter gives up idle connections a second earlier, so a reuse never races the close.
    assert (_keep_alive(server("plain", build)) or "").split(",")[0] == "timeout=5"


@builds.each
def test_ngram_map_k_drafts_only_if_its_first_request_is_a_completion(model, build):
    """Why the canary asks /completion first: a fresh ngram-map-k server whose first request is a chat never drafts."""
    from specwatch.endpoints import Endpoint
    from specwatch.probe.canary import TABLE

    completion, chat = TABLE[Endpoint.COMPLETION], TABLE[Endpoint.CHAT]
    drafted = {}
    for first in (completion, chat):
        with LlamaServer(model, ["--spec-type", "ngram-map-k"], build=builds.get(build)) as fresh:
            request(fresh, "POST", first.path, first.body(8))
            status, body = request(fresh, "POST", completion.path, completion.body(8))
            assert status == 200, body
            drafted[first.endpoint] = body["timings"].get("draft_n")
    assert drafted[Endpoint.COMPLETION] and drafted[Endpoint.COMPLETION] > 0
    assert drafted[Endpoint.CHAT] is None


@builds.each
def test_a_model_query_and_autoload_are_ignored_by_a_server_that_is_not_a_router(server, build):
    """specwatch adds ?model=...&autoload=false whenever it names a model; a plain server must answer as usual."""
    status, props = request(server("plain", build), "GET", "/props?model=anything&autoload=false")
    assert status == 200 and "role" not in props and props["default_generation_settings"]["params"] is not None


# ---- the two builds side by side: docs/llama-server-behaviour.md's table, measured ------------------------------------

DOC = markdown.DOCS / "llama-server-behaviour.md"
SIDE_BY_SIDE = "Build 11434 and build 11549 side by side"


def _help_port(build: str) -> int:
    """The port llama-server listens on with no --port, as its --help says (only a compiled build has one)."""
    done = subprocess.run([*builds.get(build).launcher, "--help"], capture_output=True, text=True, timeout=60, check=False)
    found = re.search(r"--port PORT\s+port to listen \(default: (\d+)\)", done.stdout + done.stderr)
    assert found, (done.returncode, done.stdout[-800:], done.stderr[-800:])
    return int(found.group(1))


def _source_port(build: str) -> int:
    """The prebuilt build's port with no --port, as its source sets it (common.h; the launcher's DEFAULT_PORT), held to
    what the wheel's compiled code says: its --server-base help names 'http://localhost:PORT' (b11434's names 8080)."""
    import importlib.util
    import mmap

    (package,) = importlib.util.find_spec("xllamacpp").submodule_search_locations
    (library,) = pathlib.Path(package).glob("xllamacpp*.so")
    with library.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = data.find(b"example: 'http://localhost:")
        named = re.match(rb"example: 'http://localhost:(\d+)'", data[at:at + 40]) if at >= 0 else None
    assert named and int(named.group(1)) == builds.get(build).default_port, named
    return builds.get(build).default_port


def _router(build: str, model, directory) -> str:
    """Whether the build runs as a router: a --models-preset and no model."""
    preset = router_preset(directory / f"preset-{build}.ini", {"plain": ["--model", str(model)]})
    if build == PREBUILT:  # launcher or not, the wheel itself refuses; measured on the wheel
        return f"no: `{builds.prebuilt_router(preset)}`"
    with LlamaRouter(preset, build=builds.get(build), log_dir=directory) as router:
        role = request(router, "GET", "/props")[1]["role"]
    return f"yes: `/props` `role` `{role}`"


def _check(server: LlamaServer):
    return asyncio.run(run_check(ServerConfig(name="check", url=server.url), endpoints=list(Endpoint),
                                 tokens=DEFAULT_TOKENS, timeout=60))


def _fill_in_chunk(server: LlamaServer, path: str, body: dict, key: str) -> str:
    """What the stream's second token chunk (a fill-in on a drafting server) says of its logprobs."""
    chunks = [e["choices"][0] if "choices" in e else e for e in stream(server, path, body)]
    tokens = [c for c in chunks if c.get("text") or c.get("content") or (c.get("delta") or {}).get("content")]
    second = tokens[1]
    if key not in second:
        return f"no `{key}` key"
    return f"`\"{key}\": {json.dumps(second[key])}`"


def _side_by_side(server, build: str, model, directory) -> dict[str, str]:
    """Every fact of the doc's table, measured on `build`."""
    kinds = {kind: server(kind, build) for kind in KINDS}
    props = {kind: request(s, "GET", "/props")[1] for kind, s in kinds.items()}
    draft = kinds["draft"]
    answer = completion(draft)  # a task run: /slots now has params
    reports = {kind: _check(s) for kind, s in kinds.items()}
    with LlamaServer(model, ["--api-key", API_KEY], build=builds.get(build)) as locked, \
            LlamaServer(model, ["--no-slots"], build=builds.get(build)) as slotless:
        health, (props_status, refused) = request(locked, "GET", "/health")[0], request(locked, "GET", "/props")
        no_slots_status, no_slots = request(slotless, "GET", "/slots")
    responses = request(draft, "POST", "/v1/responses", {"input": PROMPT, "max_output_tokens": 8, "temperature": 0,
                                                          "logprobs": True, "top_logprobs": 3})[1]
    by_endpoint = {kind: {e.endpoint: e for e in report.endpoints} for kind, report in reports.items()}
    facts = {
        "`/props` `build_info`": f"`{props['plain']['build_info']}`",
        "port with no `--port`": (f"`{_help_port(build)}` (`--help`)" if build == SOURCE
                                  else f"`{_source_port(build)}` (`common/common.h`)"),
        "router mode (`--models-preset`, no `-m`)": _router(build, model, directory),
        "`/props` `speculative.types`: plain, draft, ngram": ", ".join(
            f"`{p['default_generation_settings']['params']['speculative.types']}`" for p in props.values()),
        "`/slots[0].speculative`: plain, draft, ngram": ", ".join(
            f"`{json.dumps(request(s, 'GET', '/slots')[1][0]['speculative'])}`" for s in kinds.values()),
        "`/slots[0].params[\"speculative.types\"]` once the draft server ran a task":
            f"`{request(draft, 'GET', '/slots')[1][0]['params']['speculative.types']}`",
        "`/completion` (48 tokens, `n_probs` 3) on the draft server: first token's `logprob`, `timings.draft_n`, "
        "`draft_n_accepted`": (f"{answer['completion_probabilities'][0]['logprob']:.4f}, {answer['timings']['draft_n']}, "
                               f"{answer['timings']['draft_n_accepted']}"),
        "`specwatch check` verdict: plain, draft, ngram": ", ".join(f"**{r.verdict}**" for r in reports.values()),
        **{f"`{e.value}`: fill-ins after the first token, plain, draft": ", ".join(
            f"{by_endpoint[kind][e.value].fill_ins}/{by_endpoint[kind][e.value].judged_tokens}"
            for kind in ("plain", "draft")) for e in Endpoint},
        "a fill-in's chunk, chat stream": _fill_in_chunk(draft, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 8, "temperature": 0, "logprobs": True,
            "top_logprobs": 3}, "logprobs"),
        "a fill-in's chunk, `/completion` stream": _fill_in_chunk(draft, "/completion", {
            "prompt": PROMPT, "n_predict": 8, "temperature": 0, "n_probs": 3}, "completion_probabilities"),
        "a fill-in's chunk, `/v1/completions` stream": _fill_in_chunk(draft, "/v1/completions",
                                                                     v1_completion_body(max_tokens=8), "logprobs"),
        "`/v1/responses` with `logprobs: true`: `logprobs`": f"`{json.dumps(responses['output'][0]['content'][0]['logprobs'])}`",
        "`--api-key`: `/health`, `/props` without the key": f"{health}, {props_status} `{refused['error']['type']}`",
        "`--no-slots`: `/slots`": f"{no_slots_status} `{no_slots['error']['type']}`",
        "`Keep-Alive` announced": f"`{_keep_alive(kinds['plain'])}`",
    }
    return facts


def _keep_alive(server: LlamaServer) -> str | None:
    """The Keep-Alive header of an answer on a connection that asked for none."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        response.read()
        return response.getheader("Keep-Alive")
    finally:
        connection.close()


def _doc_table() -> list[list[str]]:
    lines = [line for line in markdown.section(DOC, SIDE_BY_SIDE).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))] for line in lines]


def test_the_doc_table_of_the_two_builds_is_what_each_answered(server, model, tmp_path):
    measured = {build: _side_by_side(server, build, model, tmp_path) for build in builds.NAMES}
    rows = [[fact, *(measured[build][fact] for build in builds.NAMES)] for fact in measured[SOURCE]]
    table = _doc_table()
    assert table[0] == ["fact", *builds.NAMES]
    assert table[2:] == rows
