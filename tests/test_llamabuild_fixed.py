"""The patched llama-server of tests/llama/upstream-prs.patch: inert with its switches off, real speculative logprobs with
#27196's on."""

from __future__ import annotations

import json

import httpx
import pytest

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import cycle_text, write_cycle_model
from tests.support.llamabuild import FILL_PROBS_ENV, FILL_PROBS_ON, SWITCHES, build_env
from tests.support.process import check_json

pytestmark = pytest.mark.real

N_TOKENS = 48
N_PROBS = 3
PROMPT = cycle_text(repeats=3).strip()
FILL_PROBS_OFF = build_env()
"""Explicitly off, whatever the environment the tests run in says: only "1" switches a behaviour on."""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("model") / "cycle.gguf")


@pytest.fixture(scope="module")
def servers(model, fixed_llama_binary):
    """Each server once per module, on first use: the pip build and the patched one, drafting with the model itself."""
    builds = {
        "pip": {},
        "off": {"binary": fixed_llama_binary, "env": FILL_PROBS_OFF},
        "on": {"binary": fixed_llama_binary, "env": FILL_PROBS_ON},
    }
    started: dict[tuple[str, str], LlamaServer] = {}

    def get(build: str, kind: str = "draft") -> LlamaServer:
        if (build, kind) not in started:
            started[build, kind] = LlamaServer.of_kind(kind, model, **builds[build]).start()
        return started[build, kind]

    yield get
    for server in started.values():
        server.close()


def post(server: LlamaServer, path: str, body: dict) -> dict:
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def stream(server: LlamaServer, path: str, body: dict) -> list[dict]:
    """The parsed data events of a streaming request, up to [DONE]."""
    events = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line.removeprefix("data:").strip()
            if payload == "[DONE]":
                break
            events.append(json.loads(payload))
    return events


def completion_body(**extra) -> dict:
    return {"prompt": PROMPT, "n_predict": N_TOKENS, "temperature": 0, "n_probs": N_PROBS, **extra}


def chat_body(**extra) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": N_TOKENS, "temperature": 0,
            "logprobs": True, "top_logprobs": N_PROBS, **extra}


def v1_completion_body(**extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": N_TOKENS, "temperature": 0, "logprobs": N_PROBS, **extra}


def fill_ins(tokens: list[dict], value_key: str = "logprob", alt_key: str = "top_logprobs", value: float = 0.0) -> int:
    """Tokens after the first with the placeholder value and no alternatives although alternatives were asked for."""
    return sum(t[value_key] == value and t[alt_key] == [] for t in tokens[1:])


def assert_real(tokens: list[dict]) -> None:
    """Every token carries the target's own distribution: the greedy token tops its alternatives, with its own logprob."""
    assert len(tokens) == N_TOKENS
    for i, token in enumerate(tokens):
        alternatives = token["top_logprobs"]
        assert len(alternatives) == N_PROBS, (i, token)
        # With a wrong batch index the top alternative would be the successor of the emitted token, not the token.
        assert alternatives[0]["id"] == token["id"], (i, token)
        assert token["logprob"] == pytest.approx(alternatives[0]["logprob"]), (i, token)
        assert -5.0 < token["logprob"] < 0.0, (i, token)


def drafted(answer: dict) -> int:
    return answer["timings"].get("draft_n", 0)


def test_switch_off_serves_the_same_fill_ins_as_the_pip_build(servers):
    pip, off = servers("pip"), servers("off")
    assert not any(name in off.log_path.read_text() for name in SWITCHES)
    for path, body, tokens_of in [
        ("/completion", completion_body(), lambda a: a["completion_probabilities"]),
        ("/v1/chat/completions", chat_body(), lambda a: a["choices"][0]["logprobs"]["content"]),
    ]:
        want, got = post(pip, path, body), post(off, path, body)
        want_tokens, got_tokens = tokens_of(want), tokens_of(got)
        assert fill_ins(got_tokens) == fill_ins(want_tokens) == N_TOKENS - 1, path
        # same source, compiler and flags: token for token and bit for bit the same answer
        assert got_tokens == want_tokens, path
        assert drafted(got) > 0 and drafted(want) > 0, path


def test_switch_on_is_announced_in_the_log(servers):
    assert f"{FILL_PROBS_ENV}=1" in servers("on").log_path.read_text()


def test_switch_on_completion_has_real_logprobs_equal_to_unspeculated_decoding(servers):
    answer = post(servers("on"), "/completion", completion_body())
    tokens = answer["completion_probabilities"]
    assert_real(tokens)
    assert drafted(answer) > 0
    plain = post(servers("on", "plain"), "/completion", completion_body())["completion_probabilities"]
    assert "draft_n" not in post(servers("on", "plain"), "/completion", completion_body())["timings"]
    assert [t["id"] for t in tokens] == [t["id"] for t in plain]
    assert [t["logprob"] for t in tokens] == pytest.approx([t["logprob"] for t in plain], abs=1e-4)
    assert [[a["id"] for a in t["top_logprobs"]] for t in tokens] == [[a["id"] for a in t["top_logprobs"]] for t in plain]


def test_switch_on_completion_stream_has_logprobs_on_every_chunk(servers):
    events = stream(servers("on"), "/completion", completion_body())
    content = [e for e in events if e.get("content")]
    assert len(content) == N_TOKENS
    assert all(len(e["completion_probabilities"]) == 1 for e in content)
    assert_real([e["completion_probabilities"][0] for e in content])
    assert drafted(events[-1]) > 0


def test_switch_on_chat_has_real_logprobs(servers):
    answer = post(servers("on"), "/v1/chat/completions", chat_body())
    assert_real(answer["choices"][0]["logprobs"]["content"])
    assert drafted(answer) > 0


def test_switch_on_chat_stream_has_logprobs_on_every_chunk(servers):
    events = stream(servers("on"), "/v1/chat/completions", chat_body())
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content) == N_TOKENS
    assert_real([t for e in content for t in e["choices"][0]["logprobs"]["content"]])
    assert drafted(events[-1]) > 0


def test_switch_on_v1_completion_has_real_logprobs(servers):
    answer = post(servers("on"), "/v1/completions", v1_completion_body())
    assert_real(answer["choices"][0]["logprobs"]["content"])
    assert drafted(answer) > 0


def test_switch_on_v1_completion_stream_has_logprobs_on_every_chunk(servers):
    events = stream(servers("on"), "/v1/completions", v1_completion_body())
    content = [e for e in events if e["choices"] and e["choices"][0].get("text")]
    assert len(content) == N_TOKENS
    assert_real([t for e in content for t in e["choices"][0]["logprobs"]["content"]])
    assert drafted(events[-1]) > 0


def test_switch_on_post_sampling_probs_keep_the_placeholders(servers):
    answer = post(servers("on"), "/completion", completion_body(post_sampling_probs=True))
    tokens = answer["completion_probabilities"]
    assert len(tokens) == N_TOKENS
    assert tokens[0]["top_probs"], "the first token is sampled outside the speculative path"
    assert fill_ins(tokens, "prob", "top_probs", 1.0) == N_TOKENS - 1
    assert drafted(answer) > 0


FIXED_ENDPOINTS = ["completion", "completion_stream", "chat", "chat_stream", "v1_completion", "v1_completion_stream"]


def test_check_on_the_fixed_build_clean_where_fixed_fill_ins_where_not(servers):
    fixed = servers("on")
    code, report = check_json(fixed.url)
    assert (code, report["verdict"]) == (1, "fill_ins")
    by_endpoint = {e["endpoint"]: e for e in report["endpoints"]}
    for endpoint in FIXED_ENDPOINTS:
        assert by_endpoint[endpoint]["fill_ins"] == 0 and by_endpoint[endpoint]["draft_n"] > 0, by_endpoint[endpoint]
    assert by_endpoint["completion_post_sampling"]["fill_ins"] == 47
    # The summary names what serves fill-ins, and only that.
    assert "completion_post_sampling 47/47" in report["summary"] and "chat " not in report["summary"]
    code, report = check_json(fixed.url, "--endpoint", "chat")
    assert (code, report["verdict"]) == (0, "clean")
    assert report["summary"] == "the server drafted and still returned real logprobs with alternatives"
    assert report["endpoints"][0]["draft_n"] > 0


def test_the_daemon_on_the_fixed_build(servers, tmp_path):
    """A fleet on the fixed build: the verdict names the endpoint with fill-ins; a daemon asking only fixed ones says clean."""
    import yaml

    from specwatch.endpoints import Endpoint
    from tests.support.metrics import find, scrape
    from tests.support.process import ExporterProcess
    from tests.support.waiting import wait_until

    fixed, b11434 = servers("on"), servers("pip")
    for endpoints, verdict in ((None, "fill_ins"), (FIXED_ENDPOINTS, "clean")):
        config = {"servers": [{"name": "fixed", "url": fixed.url}, {"name": "b11434", "url": b11434.url}],
                  "poll_interval": "1s", "poll_timeout": "900ms", "canary_interval": "2s"}
        if endpoints:
            config["canary_endpoints"] = endpoints
        path = tmp_path / f"{verdict}.yml"
        path.write_text(yaml.safe_dump(config))
        with ExporterProcess("--config", str(path)) as exporter:
            exporter.wait_started()

            asked = endpoints or [e.value for e in Endpoint]

            def settled(asked: list[str] = asked) -> dict | None:
                # Every endpoint canaried: fill-ins decide a verdict before the last endpoint has answered.
                samples = scrape(exporter.url() + "/metrics")
                done = all(find(samples, "specwatch_canary_success", server=s, endpoint=e) == 1
                           for s in ("fixed", "b11434") for e in asked)
                return samples if done else None

            samples = wait_until("both verdicts", settled, timeout=60)
            assert find(samples, "specwatch_verdict", server="fixed", verdict=verdict) == 1
            assert find(samples, "specwatch_verdict", server="b11434", verdict="fill_ins") == 1
            for endpoint in FIXED_ENDPOINTS:
                assert find(samples, "specwatch_canary_placeholder_tokens", server="fixed", endpoint=endpoint) == 0
                assert find(samples, "specwatch_canary_draft_tokens", server="fixed", endpoint=endpoint) > 0
            page = httpx.get(exporter.url() + "/").text
            assert "drafted" in page and "logprobs real" in page
            if endpoints is None:
                assert find(samples, "specwatch_canary_placeholder_tokens", server="fixed",
                            endpoint="completion_post_sampling") > 0
                assert "completion_post_sampling: fill-ins" in page
                verdicts = httpx.get(exporter.url() + "/api/v1/verdicts", params={"server": "fixed"}).json()
                assert "completion_post_sampling" in verdicts["servers"][0]["models"][0]["summary"]
