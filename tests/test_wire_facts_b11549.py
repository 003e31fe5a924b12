"""Build 11549's probabilistic draft acceptance (--spec-draft-sampling probabilistic) against greedy acceptance, on the
prebuilt server and the cycle model: what docs/llama-server-behaviour.md's section "Probabilistic draft acceptance
(build 11549)" says a test holds. The flag is new in build 11549, so every test runs on that build alone ([b11549]);
what needs a trained model (Gemma 3 270M) was measured once by `python -m tests.support.draftsampling`.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from itertools import pairwise

import pytest

from specwatch.demo.llamaserver import LlamaServer
from specwatch.demo.tinymodel import cycle_text, write_cycle_model
from specwatch.endpoints import Endpoint
from specwatch.gate.check import run_check
from specwatch.gate.options import DEFAULT_TOKENS
from specwatch.settings.targets import ServerConfig
from tests.support import builds, markdown
from tests.support.builds import PREBUILT
from tests.support.draftsampling import differences, get, metric_differences, post

pytestmark = pytest.mark.real

DRAFT = ["--spec-type", "draft-simple", "--spec-draft-sampling"]
KINDS = {"plain": [], "greedy": [*DRAFT, "greedy"], "probabilistic": [*DRAFT, "probabilistic"]}
"""Each kind's flags besides `-md MODEL` (the cycle model drafting for itself) and --metrics."""
PROMPT = cycle_text(repeats=3).strip()
UNTRUNCATED = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}
"""Samplers that keep the whole distribution: with the defaults (min_p 0.05) the cycle model's successor (p 0.7) is the
only candidate left at any temperature, and every kind of server answers the cycle."""
P_NEXT = 0.7
"""The cycle model's probability of the successor, at temperature 1 (write_cycle_model's p_next)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_cycle_model(tmp_path_factory.mktemp("model") / "cycle.gguf")


def start(kind: str, model) -> LlamaServer:
    drafting = ["-md", str(model)] if kind != "plain" else []
    return LlamaServer(model, [*drafting, *KINDS[kind], "--metrics"], build=builds.get(PREBUILT)).start()


@pytest.fixture(scope="module")
def servers(model):
    started = {kind: start(kind, model) for kind in KINDS}
    yield started
    for server in started.values():
        server.close()


def _check(server: LlamaServer):
    return asyncio.run(run_check(ServerConfig(name="check", url=server.url), endpoints=list(Endpoint),
                                 tokens=DEFAULT_TOKENS, timeout=60))


@builds.only(PREBUILT)
def test_probabilistic_acceptance_serves_fill_ins_and_http_reads_as_greedy(model, build):
    """Fresh servers, the same requests: `check` says fill_ins on every endpoint with the same report as greedy's, and
    /props, /slots[0] and /metrics (timings aside) read the same, before a task and after the check."""
    greedy, probabilistic = start("greedy", model), start("probabilistic", model)
    try:
        pair = (greedy.url, probabilistic.url)
        assert differences(*(get(url, "/props") for url in pair), ignore=["media_marker"]) == {}
        assert differences(*(get(url, "/slots")[0] for url in pair), ignore=[]) == {}
        reports = [_check(server) for server in (greedy, probabilistic)]
        report = reports[1]
        assert (report.verdict, report.exit_code, report.speculation_slots, report.speculation_types) == (
            "fill_ins", 1, True, "none")
        assert {(e.endpoint, e.fill_ins, e.judged_tokens) for e in report.endpoints} == {
            (e.value, DEFAULT_TOKENS - 1, DEFAULT_TOKENS - 1) for e in Endpoint}
        assert all(e.draft_n for e in report.endpoints)
        assert differences(*({**r.as_json(), "url": None} for r in reports), ignore=[]) == {}
        assert differences(*(get(url, "/props") for url in pair), ignore=["media_marker"]) == {}
        slots = [get(url, "/slots")[0] for url in pair]
        assert differences(*slots, ignore=[]) == {} and slots[1]["params"]["speculative.types"] == "none,draft-simple"
        assert not any(re.search("probabilistic|rejection|draft.?sampling", key) for key in slots[1]["params"])
        metrics = [get(url, "/metrics") for url in pair]
        assert metric_differences(*metrics) == {} and "llamacpp:spec_decode_num_accepted_tokens_total" in metrics[1]
    finally:
        greedy.close()
        probabilistic.close()


@builds.only(PREBUILT)
def test_at_temperature_0_probabilistic_acceptance_answers_as_greedy_to_the_bit(servers, build):
    """At temperature 0 build 11549 verifies by matching whatever --spec-draft-sampling says: the same text, values and
    fill-ins as the greedy server on /completion, /v1/completions and chat."""
    asked = [("/completion", {"prompt": PROMPT, "n_predict": 24, "n_probs": 3}),
             ("/completion", {"prompt": "the dog ran", "n_predict": 24, "n_probs": 3, "post_sampling_probs": True}),
             ("/v1/completions", {"prompt": PROMPT, "max_tokens": 24, "logprobs": 3}),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
                                       "logprobs": True, "top_logprobs": 3})]
    for path, body in asked:
        greedy, probabilistic = (post(servers[kind].url, path, {**body, "temperature": 0, "seed": 7})
                                 for kind in ("greedy", "probabilistic"))
        for answer in (greedy, probabilistic):
            answer.pop("timings"), answer.pop("created", None), answer.pop("id", None)
        assert greedy == probabilistic, path


def _samples(server: LlamaServer, seeds: range, **sampling) -> list[list[int]]:
    return [post(server.url, "/completion", {"prompt": PROMPT, "n_predict": 16, "seed": seed, "cache_prompt": False,
                                             "return_tokens": True, **sampling})["tokens"] for seed in seeds]


@builds.only(PREBUILT)
def test_above_temperature_0_greedy_acceptance_keeps_the_samples_and_probabilistic_their_distribution(servers, build):
    """At temperature 1 with a seed per request: the greedy-draft server gives the plain server's tokens, request for
    request; the probabilistic one other tokens, drawn from the same distribution (the successor's share of every
    token after the first is the model's 0.7 on all three)."""
    sampling = {"temperature": 1.0, **UNTRUNCATED}
    seeds = range(1, 201)
    drawn = {kind: _samples(server, seeds, **sampling) for kind, server in servers.items()}
    assert all(len(tokens) == 16 for answers in drawn.values() for tokens in answers)
    same = {kind: sum(a == b for a, b in zip(drawn[kind], drawn["plain"], strict=True)) for kind in ("greedy", "probabilistic")}
    assert same["greedy"] == len(seeds) and same["probabilistic"] < len(seeds) // 4, same
    pieces = post(servers["plain"].url, "/tokenize", {"content": cycle_text(), "with_pieces": True})["tokens"]
    cycle = [piece["id"] for piece in pieces if piece["piece"].strip()]  # the words, not a leading " "
    successor = {token: cycle[(i + 1) % len(cycle)] for i, token in enumerate(cycle)}
    for kind, answers in drawn.items():
        hits = Counter(after == successor.get(before, cycle[0]) for tokens in answers
                       for before, after in pairwise(tokens))
        share, n = hits[True] / (hits[True] + hits[False]), hits[True] + hits[False]
        # 3,000 pairs: a standard error of 0.0084; 0.04 is about five of them.
        assert n == 15 * len(seeds) and abs(share - P_NEXT) < 0.04, (kind, share)
    # The default samplers leave the successor alone: every kind answers the cycle, the same tokens for every seed.
    defaults = {kind: _samples(server, range(1, 21), temperature=1.0) for kind, server in servers.items()}
    assert defaults["probabilistic"] == defaults["greedy"] == defaults["plain"]


def test_the_doc_section_names_these_tests():
    section = markdown.section(markdown.DOCS / "llama-server-behaviour.md", "Probabilistic draft acceptance (build 11549)")
    named = set(re.findall(r"`(test_\w+)", section))
    here = {name for name in globals() if name.startswith("test_")}
    assert named == here, (named, here)
