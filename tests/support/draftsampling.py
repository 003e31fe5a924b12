"""Probabilistic draft acceptance (build 11549) beside greedy acceptance and no drafting, on Gemma 3 270M: what specwatch
reports, what HTTP shows, and what an eval gets at temperature 0 and above. python -m tests.support.draftsampling.

Servers of the prebuilt build 11549 (the xllamacpp wheel), each on one thread and one slot: plain; drafting with
Gemma's Q4_0 requantization (-md, --spec-type draft-simple) under --spec-draft-sampling greedy; the same under
--spec-draft-sampling probabilistic; and a plain server of the Q4_0 file, a control sampled in step 3 only. Measured in
this order, the servers fresh for the first step:

1. `specwatch check URL --json` at its defaults on each; /props, /slots[0] and /metrics of the two drafting servers diffed
   after the same tasks (before any other request).
2. The peer probe's request (peerprobe.body with a pool prompt; pool indices 0..399 only, 400 on are held out) at
   temperature 0: same text, and the same logprob on each real token (one with alternatives) of a shared prefix.
3. Above temperature 0 (/completion, TOKENS tokens, the server's default samplers, a seed per request): with the same
   seed, the same tokens as the plain server? And the distribution of the first tokens, drafting against plain, by a
   chi-square statistic whose p-value is a permutation test's (labels shuffled within each prompt), each drafting sample
   set (and the control's) against a plain set drawn with other seeds (so the two are independent), and the plain set
   of the same seeds as the null.

docs/llama-server-behaviour.md ("Probabilistic draft acceptance (build 11549)") reports a run of this;
tests/test_wire_facts_b11549.py holds, on the cycle model, the part of it that a test can hold.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

DRAFTING = ("-md", "{draft}", "--spec-type", "draft-simple", "--spec-draft-sampling")
KINDS = {"plain": (), "greedy": (*DRAFTING, "greedy"), "probabilistic": (*DRAFTING, "probabilistic")}
"""llama-server's flags of each kind of server ("{draft}" the draft model's file), besides --metrics and the alias."""
CONTROL = "requantized"
"""A plain server of the Q4_0 file under the same alias, sampled as the others above temperature 0: another model, to
show what the distribution test can tell apart with as many samples."""
SAMPLING_PROMPTS = (0, 1, 2, 3)
"""Pool indices of the prompts sampled above temperature 0 (the pool's indices 400 on are held out)."""
TOKENS = 8
NOISY = ("media_marker", "id_task")
"""Fields that differ between any two processes, or with how many requests a server was asked: a start's random marker,
a task counter."""


# ---- HTTP -------------------------------------------------------------------------------------------------------------

def post(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> Any:
    asked = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(asked, timeout=timeout) as answer:
        return json.loads(answer.read())


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=60) as answer:
        raw = answer.read().decode()
    return raw if path.startswith("/metrics") else json.loads(raw)


# ---- what HTTP shows --------------------------------------------------------------------------------------------------

def flat(value: Any, at: str = "") -> dict[str, Any]:
    """Every leaf of a JSON value by its path (.key, [i])."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{at}.{key}").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{at}[{i}]").items()} or {at: []}
    return {at: value}


def differences(a: Any, b: Any, ignore: Iterable[str] = NOISY) -> dict[str, tuple[Any, Any]]:
    """The leaves where two JSON values differ, by path, but for the fields named in `ignore` (a path's last key)."""
    left, right = flat(a), flat(b)
    skipped = tuple(f".{name}" for name in ignore)
    return {path: (left.get(path), right.get(path)) for path in sorted(left.keys() | right.keys())
            if left.get(path) != right.get(path) and not path.endswith(skipped)}


def metric_samples(text: str) -> dict[str, float]:
    """A /metrics page's samples, by name and labels as written."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def metric_differences(a: str, b: str) -> dict[str, tuple[float | None, float | None]]:
    """The samples of two /metrics pages that differ, timings (seconds, per-second averages) left out."""
    left, right = metric_samples(a), metric_samples(b)
    timed = ("_seconds_total", "_seconds")
    return {name: (left.get(name), right.get(name)) for name in sorted(left.keys() | right.keys())
            if left.get(name) != right.get(name) and not name.endswith(timed)}


def check(url: str) -> dict[str, Any]:
    """`specwatch check URL --json` at its defaults, its exit code beside the report."""
    done = subprocess.run([sys.executable, "-m", "specwatch", "check", url, "--json"], capture_output=True, text=True,
                          timeout=600, check=False)
    return {"exit": done.returncode, **json.loads(done.stdout)}


def check_table(report: dict[str, Any]) -> dict[str, Any]:
    return {"verdict": report["verdict"], "exit": report["exit"], "slots": report["speculation_slots"],
            "props": report["speculation_types"],
            "endpoints": {e["endpoint"]: (e["fill_ins"], e["judged_tokens"], e["draft_n"]) for e in report["endpoints"]}}


# ---- temperature 0: the peer probe ------------------------------------------------------------------------------------

def probe(url: str, prompt: str) -> dict[str, Any]:
    """The peer probe's request with a pool prompt, as bench.peer_record asks it."""
    from specwatch.probe.peerprobe import body

    return post(url, "/v1/completions", {**body(0), "prompt": prompt})


def tokens_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    return answer["choices"][0]["logprobs"]["content"]


def compare_probe(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two answers to one prompt: same text; the first token's values the same to the bit (alternatives included); of
    the later real tokens (alternatives given) both have at one position of the shared prefix (the same tokens before
    and at it), how many, how many with the same logprob to the bit, and the largest difference."""
    ta, tb = tokens_of(a), tokens_of(b)
    shared = 0
    while shared < min(len(ta), len(tb)) and ta[shared]["id"] == tb[shared]["id"]:
        shared += 1
    real = [(x, y) for x, y in zip(ta[1:shared], tb[1:shared], strict=True) if x["top_logprobs"] and y["top_logprobs"]]
    return {"same_text": a["choices"][0]["text"] == b["choices"][0]["text"], "shared": shared,
            "first_equal": ta[0] == tb[0], "real": len(real), "equal": sum(x["logprob"] == y["logprob"] for x, y in real),
            "largest": max((abs(x["logprob"] - y["logprob"]) for x, y in real), default=0.0)}


# ---- above temperature 0 ----------------------------------------------------------------------------------------------

def sample(url: str, prompt: str, seed: int, temperature: float, tokens: int = TOKENS) -> dict[str, Any]:
    """One sampled answer: its token ids and what the server drafted."""
    answer = post(url, "/completion", {"prompt": prompt, "n_predict": tokens, "temperature": temperature, "seed": seed,
                                       "cache_prompt": False, "return_tokens": True})
    return {"tokens": answer["tokens"], "draft_n": answer["timings"].get("draft_n", 0),
            "accepted": answer["timings"].get("draft_n_accepted", 0)}


def chi_square(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Pearson's statistic of the 2 x k table of two samples' categories."""
    ca, cb = Counter(a), Counter(b)
    total = len(a) + len(b)
    statistic = 0.0
    for category in ca.keys() | cb.keys():
        column = ca[category] + cb[category]
        for count, n in ((ca[category], len(a)), (cb[category], len(b))):
            expected = n * column / total
            statistic += (count - expected) ** 2 / expected
    return statistic


def permutation_test(groups: Sequence[tuple[Sequence[Any], Sequence[Any]]], rounds: int = 4000,
                     seed: int = 0) -> tuple[float, float]:
    """The sum over strata of chi_square(a, b), and the share of label shuffles (within each stratum) at least as large:
    a p-value that needs no large-count approximation."""
    observed = sum(chi_square(a, b) for a, b in groups)
    draw = random.Random(seed)
    beyond = 0
    for _ in range(rounds):
        total = 0.0
        for a, b in groups:
            pooled = [*a, *b]
            draw.shuffle(pooled)
            total += chi_square(pooled[:len(a)], pooled[len(a):])
        beyond += total >= observed - 1e-9
    return observed, (beyond + 1) / (rounds + 1)


def prefix(answer: dict[str, Any], n: int) -> tuple[int, ...]:
    return tuple(answer["tokens"][:n])


# ---- the run ----------------------------------------------------------------------------------------------------------

def start(threads: int) -> dict[str, Any]:
    from specwatch.demo.llamaserver import LlamaServer, prebuilt_build
    from tests.support import gemma

    build, model, draft = prebuilt_build(), gemma.model(), gemma.q4_0()
    servers = {}
    for kind, (file, flags) in {**{k: (model, f) for k, f in KINDS.items()}, CONTROL: (draft, ())}.items():
        extra = [f.replace("{draft}", str(draft)) for f in flags]
        servers[kind] = LlamaServer(file, [*extra, "--metrics", "-a", gemma.ALIAS], build=build, threads=threads,
                                    startup_timeout=300).start()
    return servers


def each(urls: dict[str, str], work) -> dict[str, Any]:
    """work(kind, url) for every server at once: each server answers one request at a time, as a one-slot server does."""
    with ThreadPoolExecutor(len(urls)) as pool:
        futures = {kind: pool.submit(work, kind, url) for kind, url in urls.items()}
        return {kind: future.result() for kind, future in futures.items()}


def step_http(urls: dict[str, str]) -> dict[str, Any]:
    urls = {kind: urls[kind] for kind in KINDS}
    g, p = urls["greedy"], urls["probabilistic"]
    before = {"props": differences(get(g, "/props"), get(p, "/props")),
              "slots": differences(get(g, "/slots")[0], get(p, "/slots")[0])}
    reports = each(urls, lambda kind, url: check(url))
    after = {"props": differences(get(g, "/props"), get(p, "/props")),
             "slots": differences(get(g, "/slots")[0], get(p, "/slots")[0]),
             "metrics": metric_differences(get(g, "/metrics"), get(p, "/metrics"))}
    same_report = differences({**reports["greedy"], "url": None}, {**reports["probabilistic"], "url": None})
    every = {"props": differences(get(g, "/props"), get(p, "/props"), ignore=()),
             "slots": differences(get(g, "/slots")[0], get(p, "/slots")[0], ignore=())}
    return {"check": {kind: check_table(r) for kind, r in reports.items()}, "check_differences": same_report,
            "before_any_task": before, "after_check": after, "after_check_noisy_fields_too": every,
            "slot_params": get(p, "/slots")[0]["params"].get("speculative.types")}


def step_probe(urls: dict[str, str], prompts: Sequence[int]) -> dict[str, Any]:
    from specwatch.probe.peerprobe import prompts as pool

    answers = each({kind: urls[kind] for kind in KINDS}, lambda kind, url: [probe(url, pool()[i]) for i in prompts])
    pairs = {"plain-greedy": ("plain", "greedy"), "plain-probabilistic": ("plain", "probabilistic"),
             "greedy-probabilistic": ("greedy", "probabilistic")}
    out: dict[str, Any] = {"prompts": f"{prompts[0]}..{prompts[-1]}", "n": len(prompts)}
    for name, (a, b) in pairs.items():
        rows = [compare_probe(x, y) for x, y in zip(answers[a], answers[b], strict=True)]
        out[name] = {"same_text": sum(r["same_text"] for r in rows), "first_token_equal": sum(r["first_equal"] for r in rows),
                     "later_real_tokens": sum(r["real"] for r in rows), "later_equal": sum(r["equal"] for r in rows),
                     "later_largest": round(max(r["largest"] for r in rows), 4),
                     "parting_at": dict(sorted(Counter(r["shared"] for r in rows if not r["same_text"]).items())),
                     "bit_identical_answers": sum(_content(x) == _content(y) for x, y in zip(
                         answers[a], answers[b], strict=True))}
    out["draft_n"] = {kind: sum(a["timings"].get("draft_n", 0) for a in answers[kind]) for kind in answers}
    out["accepted"] = {kind: sum(a["timings"].get("draft_n_accepted", 0) for a in answers[kind]) for kind in answers}
    return out


def _content(answer: dict[str, Any]) -> Any:
    return answer["choices"][0]["text"], answer["choices"][0]["logprobs"]


def step_sampling(urls: dict[str, str], temperature: float, per_prompt: int, null_base: int = 100_000) -> dict[str, Any]:
    from specwatch.probe.peerprobe import prompts as pool

    asked = [(i, seed) for i in SAMPLING_PROMPTS for seed in range(1, per_prompt + 1)]

    def work(kind: str, url: str) -> dict[str, list]:
        got = {"same": [sample(url, pool()[i], seed, temperature) for i, seed in asked]}
        if kind == "plain":  # the same seeds again (is a server reproducible?), then a set independent of every other
            got["again"] = [sample(url, pool()[i], seed, temperature) for i, seed in asked]
            got["other"] = [sample(url, pool()[i], null_base + seed, temperature) for i, seed in asked]
        return got

    runs = each(urls, work)
    plain, other = runs["plain"]["same"], runs["plain"]["other"]
    out: dict[str, Any] = {"temperature": temperature, "prompts": list(SAMPLING_PROMPTS), "per_prompt": per_prompt,
                           "tokens": TOKENS,
                           "plain_again_same_tokens": sum(a["tokens"] == b["tokens"] for a, b in zip(
                               runs["plain"]["again"], plain, strict=True))}
    for kind in ("greedy", "probabilistic", CONTROL):
        mine = runs[kind]["same"]
        first_parting = Counter(next((j for j, (x, y) in enumerate(zip(m["tokens"], q["tokens"], strict=False)) if x != y),
                                     None) for m, q in zip(mine, plain, strict=True))
        out[kind] = {"same_seed_same_tokens": sum(m["tokens"] == q["tokens"] for m, q in zip(mine, plain, strict=True)),
                     "first_token_same": sum(m["tokens"][:1] == q["tokens"][:1] for m, q in zip(mine, plain, strict=True)),
                     "parting_at": {str(k): v for k, v in sorted(first_parting.items(), key=lambda kv: (kv[0] is None, kv[0]))},
                     "draft_n": sum(m["draft_n"] for m in mine), "accepted": sum(m["accepted"] for m in mine)}
    sets = {"plain (same seeds)": plain, **{kind: runs[kind]["same"] for kind in ("greedy", "probabilistic", CONTROL)}}
    tests = {}
    for name, chosen in sets.items():
        for n in (1, 2, 3):
            groups = [([prefix(a, n) for (i, _), a in zip(asked, chosen, strict=True) if i == p],
                       [prefix(a, n) for (i, _), a in zip(asked, other, strict=True) if i == p]) for p in SAMPLING_PROMPTS]
            statistic, p_value = permutation_test(groups)
            tests[f"{name} vs plain (other seeds), first {n}"] = {"chi2": round(statistic, 2), "p": round(p_value, 4),
                                                                  "categories": len({x for g in groups for s in g for x in s})}
    out["distribution"] = tests
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.draftsampling", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100, help="peer-probe prompts, pool indices 0..N-1 (N <= 400)")
    parser.add_argument("--per-prompt", type=int, default=50, help=f"seeds per prompt above temperature 0, of {len(SAMPLING_PROMPTS)} prompts")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", default="http,probe,sampling", help="which steps, comma-separated (default all)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args(argv)
    if not 0 < args.prompts <= 400:
        parser.error("--prompts: 1 to 400 (the pool's indices 400 on are held out)")
    started = time.monotonic()
    servers = start(args.threads)
    try:
        urls = {kind: s.url for kind, s in servers.items()}
        steps = {"http": lambda: step_http(urls), "probe": lambda: step_probe(urls, range(args.prompts)),
                 "sampling": lambda: step_sampling(urls, args.temperature, args.per_prompt)}
        results: dict[str, Any] = {"build": "b11549", "flags": {k: " ".join(v) for k, v in KINDS.items()}}
        for step in args.steps.split(","):
            results[step] = steps[step]()
            print(json.dumps({step: results[step]}, indent=1, default=str), flush=True)
    finally:
        for server in servers.values():
            server.close()
    results["seconds"] = round(time.monotonic() - started)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"done in {results['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
