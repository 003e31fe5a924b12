"""Recordings of real Gemma 3 270M replicas answering the peer probe on pool prompts: healthy ones and changed ones.

Each member of the recording is one llama-server process (tests/support/gemma.py's model, alias "gemma", -t 1 unless
its config says otherwise), started, asked and stopped; two run side by side (one per CPU). Every member is first
asked 30 natural questions for an eval's number (/completion, 24 tokens, temperature 0, cache_prompt false: the mean
over questions of the mean logprob of the real tokens), then the pool prompts (specwatch/probe/prompts.json, built by
bench.prompt_pool) exactly as the peer probe asks them (peerprobe.body with the prompt swapped: /v1/completions,
8 tokens, top-5 logprobs, temperature 0, cache_prompt false).

- null members (healthy, must never be reported) answer every prompt of --prompts twice: take 0 for all of them,
  then take 1 for all of them again, minutes later, under whatever load then is;
- changed members (idle, -np 1, build 11434; the weight changes keep the file's name, size, ftype and /v1/models
  meta, so only answers can tell) answer every prompt of --changed-prompts once (take 0).

The output (--out) is gzip JSONL: a "run" line (the pool's hash, the slices, the eval questions, the request), then
per member a "member" line (its config, GET /props, /v1/models data[0].meta and its eval numbers) and one "answer"
line per answer (tokens as [text, logprob or null for a fill-in, [[alternative, logprob], ...]]). Members are
recorded into <out>.parts/ and joined into --out as each one completes, so an interrupted run resumes where it
stopped (a member half recorded is recorded again) and --members records a chunk.

    python -m bench.peer_record --out tune.jsonl.gz --prompts 0:400 --changed-prompts 0:120
    python -m bench.peer_record --calibrate layer          eps of a kind against the eval's number, at seed 0
    python -m bench.peer_record --out tune.jsonl.gz --summary

Prompts from bench.prompt_pool.RESERVED on are held out: a tuning recording must not ask them (--held-out allows it).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gzip
import hashlib
import json
import math
import os
import queue
import statistics
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.prompt_pool import RESERVED

ALIAS = "gemma"
EVAL_TOKENS = 24
EVAL_PROMPTS = tuple(f"Question: {q}\nAnswer:" for q in (
    # bench.peer_power's twenty...
    "What is the capital of France?", "Who wrote Romeo and Juliet?", "How many legs does a spider have?",
    "What is the boiling point of water?", "Which planet is known as the Red Planet?", "What do bees make?",
    "What is the largest ocean on Earth?", "What gas do plants absorb from the air?", "Who painted the Mona Lisa?",
    "What is the square root of 81?", "How many continents are there?", "What is the chemical symbol for gold?",
    "What language is mainly spoken in Brazil?", "What organ pumps blood through the body?",
    "In which country are the pyramids of Giza?", "What is the freezing point of water?",
    "Which animal is known as the king of the jungle?", "What is the tallest mountain in the world?",
    "What is the main ingredient in bread?", "How many days are there in a leap year?",
    # ...and ten more.
    "What is the largest planet in our solar system?", "Who discovered penicillin?", "How many hours are in a day?",
    "What is the hardest natural substance?", "Which country has the largest population?",
    "What do caterpillars turn into?", "What is the longest river in Africa?", "How many strings does a violin have?",
    "What colour do you get by mixing blue and yellow?", "Who was the first person to walk on the Moon?"))
"""Natural questions for the eval's number: the mean over them of the mean logprob of an answer's real tokens."""

EPS: dict[str, tuple[float, ...]] = {"norms": (0.017, 0.033), "layer": (0.44, 1.4), "lowrank": (0.28, 0.59)}
"""Per kind of weight change, the eps that moves the eval's number by about 0.03 nats and the one that moves it by
about 0.06: python -m bench.peer_record --calibrate KIND, at seed 0 (which recordings do not use), 2026-12-06, from
a line fitted to log |shift| over CALIBRATION_GRID (plain -0.4737). Measured shifts at seed 0:
norms 0.005 +0.018, 0.01 +0.007, 0.015 +0.034, 0.02 -0.030, 0.03 -0.038, 0.04 -0.085, 0.06 -0.161 (|shift| ~ 1.91 eps^1.02);
layer 0.1 +0.012, 0.2 +0.036, 0.3 +0.008, 0.5 -0.055, 0.7 -0.041, 1 -0.048, 1.5 -0.059 (0.0488 eps^0.60);
lowrank 0.05 +0.020, 0.1 -0.005, 0.2 +0.009, 0.3 -0.021, 0.5 -0.041, 0.7 -0.116, 1 -0.176 (0.0995 eps^0.95).
Every eps moved every question's number (by 0.04 to 0.2 on average): the sign of the mean is the flips' luck."""
SEEDS = (1, 2, 3, 4, 5)
CALIBRATION_SEED = 0
CALIBRATION_GRID: dict[str, tuple[float, ...]] = {
    "norms": (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06),
    "layer": (0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5),
    "lowrank": (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0),
}
"""The eps tried for each kind when calibrating."""
TARGETS = (0.03, 0.06)
"""The eval shifts (nats, either sign) the two eps of a kind aim at."""


# Members ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    name: str
    group: str
    """"null" (healthy: must never be reported) or "changed"."""
    build: str = "b11434"
    parallel: int = 1
    threads: int = 1
    kv: str = "f16"
    busy: bool = False
    """Three other requests decoding on it at all times (tests/support/traffic.busy)."""
    draft: dict[str, Any] | None = field(default=None, hash=False)
    """Speculation: {"model": "q4_0", "type": "draft-simple", "sampling": ..., "synth_len": ...}; None: none."""
    change: tuple[str, float | None, int | None] | None = None
    """(kind, eps, seed) of a changed member; ("requantized" | "synthetic", None, None) for those two."""

    def model(self) -> Path:
        from tests.support import gemma

        if self.change is None or self.change[0] == "synthetic":
            return gemma.model()
        kind, eps, seed = self.change
        if kind == "requantized":
            return gemma.q4_0()
        assert eps is not None and seed is not None
        return gemma.changed(kind, eps, seed)

    def args(self) -> list[str]:
        from tests.support import gemma

        args = ["-a", ALIAS]
        if self.kv != "f16":
            args += ["-ctk", self.kv, "-ctv", self.kv]
        if self.draft is not None:
            args += ["-md", str(gemma.q4_0()), "--spec-type", self.draft["type"]]
            if self.draft.get("sampling"):
                args += ["--spec-draft-sampling", self.draft["sampling"]]
            if self.draft.get("synth_len") is not None:
                args += ["--spec-synth-len", str(self.draft["synth_len"])]
        return args

    def config(self, model: Path) -> dict[str, Any]:
        change = None if self.change is None else dict(zip(("kind", "eps", "seed"), self.change, strict=True))
        return {"build": self.build, "parallel": self.parallel, "threads": self.threads, "kv": self.kv,
                "busy": self.busy, "draft": self.draft, "change": change, "file": str(model)}


def _draft(sampling: str | None = None, synth_len: float | None = None) -> dict[str, Any]:
    return {"model": "gemma-3-270m-q4_0.gguf", "type": "draft-simple", "sampling": sampling, "synth_len": synth_len}


NULL = (
    Member("b11434-np1", "null"),
    Member("b11434-np1-t2", "null", threads=2),
    Member("b11434-np4-idle", "null", parallel=4),
    Member("b11434-np4-busy-a", "null", parallel=4, busy=True),
    Member("b11434-np4-busy-b", "null", parallel=4, busy=True),
    Member("b11434-np1-kvq8", "null", kv="q8_0"),
    Member("b11549-np1", "null", build="b11549"),
    Member("b11549-np4-busy", "null", build="b11549", parallel=4, busy=True),
    Member("b11434-draft", "null", draft=_draft()),
    Member("b11549-draft-greedy", "null", build="b11549", draft=_draft("greedy")),
    Member("b11549-draft-probabilistic", "null", build="b11549", draft=_draft("probabilistic")),
)
REFERENCE = NULL[0].name
"""The member every other is compared with in the summary: plain, one slot, idle, build 11434."""


def changed_members(eps: dict[str, tuple[float, ...]] = EPS, seeds: Sequence[int] = SEEDS) -> list[Member]:
    weights = [Member(f"{kind}-eps{e:g}-s{seed}", "changed", change=(kind, e, seed))
               for kind, values in eps.items() for e in values for seed in seeds]
    return [*weights, Member("requantized", "changed", change=("requantized", None, None)),
            Member("synthetic", "changed", draft=_draft(synth_len=4), change=("synthetic", None, None))]


def members(seeds: Sequence[int] = SEEDS) -> list[Member]:
    return [*NULL, *changed_members(seeds=seeds)]


def select(wanted: Sequence[str], seeds: Sequence[int] = SEEDS) -> list[Member]:
    """Members by name, glob (b11549-*) or group (null, changed); all of them when none is named."""
    every = members(seeds)
    if not wanted:
        return every
    chosen = [m for m in every if any(w == m.group or fnmatch.fnmatchcase(m.name, w) for w in wanted)]
    unknown = [w for w in wanted if w not in ("null", "changed") and not any(fnmatch.fnmatchcase(m.name, w) for m in every)]
    if unknown:
        raise SystemExit(f"no member named {', '.join(unknown)}; members: {', '.join(m.name for m in every)}")
    return chosen


# Asking -------------------------------------------------------------------------------------------------------------


def pool() -> list[str]:
    from specwatch.probe.peerprobe import prompts

    return list(prompts())


def pool_hash() -> str:
    return hashlib.sha256(json.dumps(pool()).encode()).hexdigest()


def request(prompt: str) -> dict[str, Any]:
    """Exactly what the peer probe sends, with `prompt` in place of its question."""
    from specwatch.probe.peerprobe import body

    return body(prompt)


def _post(url: str, path: str, body: dict[str, Any], timeout: float = 300) -> Any:
    asked = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(asked, timeout=timeout) as answer:
        return json.loads(answer.read())


def _get(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=60) as answer:
        return json.loads(answer.read())


def tokens_of(answer: Any) -> tuple[list[list[Any]], int | None]:
    """The answer's tokens as recorded, [text, logprob or None for a fill-in, [[alternative, logprob], ...]], and its
    timings.draft_n. A fill-in is what the project's classifier calls one (after the first token, no alternatives)."""
    from specwatch.probe.readers import read_choice

    reading = read_choice(answer)
    tokens = []
    for index, token in enumerate(reading.tokens):
        if token.fill_in(index) or token.logprob is None:
            tokens.append([token.text, None, []])
        else:
            tokens.append([token.text, token.logprob, [[token.top[at], token.top[at + 1]] for at in range(0, len(token.top), 2)]])
    return tokens, reading.draft_n


def evaluate(url: str) -> list[float]:
    """Per eval question, the mean logprob of the real tokens of a 24-token answer at temperature 0."""
    from specwatch.probe.readers import completion_reader

    read = completion_reader(post_sampling=False)
    scores = []
    for prompt in EVAL_PROMPTS:
        answer = _post(url, "/completion", {"prompt": prompt, "n_predict": EVAL_TOKENS, "n_probs": 5, "temperature": 0.0,
                                            "cache_prompt": False})
        values = [t.logprob for i, t in enumerate(read(answer).tokens) if not t.fill_in(i) and t.logprob is not None]
        scores.append(statistics.fmean(values) if values else float("nan"))
    return scores


@contextlib.contextmanager
def serving(member: Member, log_dir: Path) -> Iterator[Any]:
    """The member's llama-server, and its other requests when it is a busy one."""
    from specwatch.demo.llamaserver import BUILDS, LlamaServer
    from tests.support.traffic import busy

    server = LlamaServer(member.model(), member.args(), build=BUILDS[member.build](), parallel=member.parallel,
                         ctx_size=2048 * member.parallel, threads=member.threads, log_dir=log_dir, startup_timeout=600)
    _RUNNING.add(server)
    try:
        with server:
            if member.busy:
                with busy(server.url) as answered:
                    time.sleep(1.0)  # the other requests decode before the first question
                    yield server
                print(f"  {member.name}: {answered[0]} other requests answered beside it", file=sys.stderr, flush=True)
            else:
                yield server
    finally:
        _RUNNING.discard(server)


_RUNNING: set[Any] = set()
"""The servers started here, stopped at once on an interrupt."""


# Recording ----------------------------------------------------------------------------------------------------------


class Recording:
    """--out and its parts: one gzip file per completed member, joined into --out (gzip members concatenated)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.parts = out.with_name(out.name + ".parts")
        self.parts.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def part(self, name: str) -> Path:
        return self.parts / f"{name}.jsonl.gz"

    def done(self, name: str) -> bool:
        return self.part(name).is_file()

    def begin(self, run: dict[str, Any]) -> None:
        """The run's line, or a check that this run asks what the recorded one asked."""
        path = self.part("_run")
        if path.is_file():
            with gzip.open(path, "rt") as f:
                before = json.loads(f.readline())
            differs = [k for k in ("pool_sha256", "prompts", "changed_prompts", "eval_prompts", "request")
                       if before.get(k) != run.get(k)]
            if differs:
                raise SystemExit(f"{self.out} was recorded with another {', '.join(differs)}: record to another --out")
            return
        self._write(path, [run])
        self.join()

    def _write(self, path: Path, lines: Sequence[dict[str, Any]]) -> None:
        partial = path.with_name(path.name + ".partial")
        with gzip.open(partial, "wt") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        os.replace(partial, path)

    def writer(self, name: str) -> Any:
        return gzip.open(self.part(name).with_name(self.part(name).name + ".partial"), "wt")

    def commit(self, name: str) -> None:
        partial = self.part(name).with_name(self.part(name).name + ".partial")
        os.replace(partial, self.part(name))
        self.join()

    def join(self) -> None:
        """--out made again from the completed parts, the run's first, then the members in the recorder's order."""
        with self._lock:
            order = {m.name: i for i, m in enumerate(members())}
            names = sorted((p.name.removesuffix(".jsonl.gz") for p in self.parts.glob("*.jsonl.gz")),
                           key=lambda n: (n != "_run", order.get(n, len(order)), n))
            partial = self.out.with_name(self.out.name + ".partial")
            with open(partial, "wb") as out:
                for name in names:
                    out.write(self.part(name).read_bytes())
            os.replace(partial, self.out)


def record_member(member: Member, asked: Sequence[int], takes: int, recording: Recording, log_dir: Path) -> None:
    texts = pool()
    started = time.time()
    with serving(member, log_dir) as server, recording.writer(member.name) as out:
        props = _get(server.url, "/props")
        meta = _get(server.url, "/v1/models")["data"][0].get("meta")
        per_prompt = evaluate(server.url)
        header = {"kind": "member", "member": member.name, "group": member.group, "config": member.config(server.model),
                  "props": props, "meta": meta, "eval": {"prompts": list(range(len(EVAL_PROMPTS))), "per_prompt": per_prompt},
                  "started": started}
        out.write(json.dumps(header) + "\n")
        print(f"  {member.name}: started in {server.start_seconds:.1f} s, eval {statistics.fmean(per_prompt):+.4f}",
              file=sys.stderr, flush=True)
        for take in range(takes):
            for count, index in enumerate(asked, start=1):
                answer = _post(server.url, "/v1/completions", request(texts[index]))
                tokens, draft_n = tokens_of(answer)
                out.write(json.dumps({"kind": "answer", "member": member.name, "prompt": index, "take": take,
                                      "t": time.time(), "tokens": tokens, "draft_n": draft_n}) + "\n")
                if count % 100 == 0:
                    print(f"  {member.name}: take {take}, {count}/{len(asked)}, {time.time() - started:.0f} s",
                          file=sys.stderr, flush=True)
    recording.commit(member.name)
    print(f"  {member.name}: {takes * len(asked)} answers in {time.time() - started:.0f} s", file=sys.stderr, flush=True)


def run(chosen: Sequence[Member], nulls: Sequence[int], changed: Sequence[int], recording: Recording, lanes: int,
        log_dir: Path) -> list[str]:
    """Every chosen member not yet recorded, `lanes` at a time; the names of those that failed."""
    todo: queue.Queue[Member] = queue.Queue()
    # The reference first, then the longest (busy, then other null members), so the lanes end together.
    for member in sorted(chosen, key=lambda m: (m.name != REFERENCE, not m.busy, m.group != "null")):
        if recording.done(member.name):
            print(f"  {member.name}: already recorded", file=sys.stderr)
        else:
            todo.put(member)
    failed: list[str] = []

    def lane() -> None:
        while True:
            try:
                member = todo.get_nowait()
            except queue.Empty:
                return
            null = member.group == "null"
            try:
                record_member(member, nulls if null else changed, 2 if null else 1, recording, log_dir)
            except Exception:  # noqa: BLE001 - one member failing leaves the others to record
                failed.append(member.name)
                print(f"  {member.name}: FAILED\n{traceback.format_exc()}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failed


# Summary ------------------------------------------------------------------------------------------------------------


def read(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, dict[tuple[int, int], dict[str, Any]]]]:
    """The run's line, each member's header and each member's answers by (prompt, take)."""
    run: dict[str, Any] = {}
    headers: dict[str, dict[str, Any]] = {}
    answers: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
    with gzip.open(path, "rt") as f:
        for line in f:
            record = json.loads(line)
            if record["kind"] == "run":
                run = record
            elif record["kind"] == "member":
                headers[record["member"]] = record
                answers.setdefault(record["member"], {})
            elif record["kind"] == "answer":
                answers[record["member"]][(record["prompt"], record["take"])] = record
    return run, headers, answers


def text(answer: dict[str, Any]) -> str:
    return "".join(t[0] or "" for t in answer["tokens"])


def summary(path: Path) -> str:
    _, headers, answers = read(path)
    reference = answers.get(REFERENCE, {})
    base = statistics.fmean(headers[REFERENCE]["eval"]["per_prompt"]) if REFERENCE in headers else None
    lines = [f"{path}: {path.stat().st_size / 1e6:.1f} MB, {len(headers)} members, "
             f"{sum(len(a) for a in answers.values())} answers",
             "| member | group | answers | seconds | answers whose text differs from b11434-np1's take 0 | take 0 differs "
             "from b11434-np1 (prompts) | take 0 differs from its take 1 | fill-in tokens | logprob moved before the texts part "
             "(mean, max) | eval | eval shift |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, header in headers.items():
        held = answers[name]
        times = [a["t"] for a in held.values()]
        seconds = max(times) - header.get("started", min(times)) if times else 0.0
        against = [(a, reference.get((p, 0))) for (p, _), a in held.items()]
        compared = [(a, r) for a, r in against if r is not None]
        differs = sum(text(a) != text(r) for a, r in compared)
        first = {p: a for (p, take), a in held.items() if take == 0}
        shared = [p for p in first if (p, 0) in reference]
        vs_reference = sum(text(first[p]) != text(reference[(p, 0)]) for p in shared)
        again = [p for p in first if (p, 1) in held]
        vs_self = sum(text(first[p]) != text(held[(p, 1)]) for p in again)
        moved = [abs(x[1] - y[1]) for a, r in compared for x, y in _before_parting(a, r) if x[1] is not None and y[1] is not None]
        fills = sum(t[1] is None for a in held.values() for t in a["tokens"])
        every = sum(len(a["tokens"]) for a in held.values())
        evals = statistics.fmean(header["eval"]["per_prompt"])
        shift = f"{evals - base:+.4f}" if base is not None else "-"
        lines.append(f"| {name} | {header['group']} | {len(held)} | {seconds:.0f} | {differs} of {len(compared)} | "
                     f"{_fraction(vs_reference, len(shared))} | {_fraction(vs_self, len(again))} | "
                     f"{fills} of {every} | {_moved(moved)} | {evals:+.4f} | {shift} |")
    return "\n".join(lines)


def _before_parting(a: dict[str, Any], b: dict[str, Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """Two answers' tokens side by side, up to where their texts part."""
    for x, y in zip(a["tokens"], b["tokens"], strict=False):
        if x[0] != y[0]:
            return
        yield x, y


def _moved(values: Sequence[float]) -> str:
    return f"{statistics.fmean(values):.4f}, {max(values):.3f}" if values else "-"


def _fraction(count: int, of: int) -> str:
    return f"{count}/{of} ({count / of:.1%})" if of else "-"


# Calibration --------------------------------------------------------------------------------------------------------


def calibrate(kind: str, grid: Sequence[float], lanes: int, log_dir: Path, out: Path | None) -> dict[str, Any]:
    """The eval's shift for each eps of `grid` (seed CALIBRATION_SEED) against the plain member's, and the eps for each
    of TARGETS. A shift is the difference of two means over 30 greedy answers: once a change flips a few answers' texts
    it moves by a few hundredths either way, so it is not monotone in eps; the eps chosen come from a line fitted to
    log |shift| against log eps over the grid, not from the nearest single point."""
    plain = NULL[0]
    with serving(plain, log_dir) as server:
        base_per_prompt = evaluate(server.url)
    base = statistics.fmean(base_per_prompt)
    print(f"plain: eval {base:+.4f}", file=sys.stderr, flush=True)
    work: queue.Queue[float] = queue.Queue()
    for eps in grid:
        work.put(eps)
    per_prompt: dict[float, list[float]] = {}

    def lane() -> None:
        while True:
            try:
                eps = work.get_nowait()
            except queue.Empty:
                return
            member = Member(f"{kind}-eps{eps:g}-s{CALIBRATION_SEED}", "changed", change=(kind, eps, CALIBRATION_SEED))
            with serving(member, log_dir) as server:
                per_prompt[eps] = evaluate(server.url)
            print(f"  {kind} eps {eps:g}: eval shift {statistics.fmean(per_prompt[eps]) - base:+.4f}", file=sys.stderr,
                  flush=True)

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shifts = {e: statistics.fmean(per_prompt[e]) - base for e in sorted(per_prompt)}
    slope, intercept = fit(shifts)
    chosen = [float(f"{math.exp((math.log(t) - intercept) / slope):.2g}") for t in TARGETS]
    result = {"kind": kind, "seed": CALIBRATION_SEED, "plain": base, "plain_per_prompt": base_per_prompt,
              "shifts": {f"{e:g}": shifts[e] for e in shifts},
              "moved_prompts": {f"{e:g}": sum(abs(a - b) > 1e-6 for a, b in zip(per_prompt[e], base_per_prompt, strict=True))
                                for e in shifts},
              "mean_abs_per_prompt": {f"{e:g}": statistics.fmean(abs(a - b) for a, b in zip(per_prompt[e], base_per_prompt,
                                                                                              strict=True)) for e in shifts},
              "per_prompt": {f"{e:g}": per_prompt[e] for e in shifts}, "fit": {"slope": slope, "intercept": intercept},
              "chosen": chosen, "targets": list(TARGETS)}
    if out is not None:
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


def fit(shifts: dict[float, float]) -> tuple[float, float]:
    """log |shift| = slope * log eps + intercept, least squares over the grid."""
    points = [(math.log(e), math.log(max(abs(s), 1e-4))) for e, s in shifts.items()]
    mean_x, mean_y = statistics.fmean(x for x, _ in points), statistics.fmean(y for _, y in points)
    slope = (sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points))
    return slope, mean_y - slope * mean_x


# Command line -------------------------------------------------------------------------------------------------------


def _slice(text: str) -> range:
    start, _, stop = text.partition(":")
    return range(int(start or 0), int(stop))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # The lanes are blocked in requests to their servers: stop every server started here, then leave at once (a
        # member half recorded stays a .partial, recorded again on the next run).
        for server in list(_RUNNING):
            server.stop()
        print("interrupted", file=sys.stderr, flush=True)
        os._exit(130)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seeds are integers, comma-separated (6,7,8)") from None
    if CALIBRATION_SEED in seeds:
        raise argparse.ArgumentTypeError(f"seed {CALIBRATION_SEED} is the calibration's: take others")
    return seeds


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="the recording (gzip JSONL); its parts go to <out>.parts/")
    parser.add_argument("--prompts", type=_slice, default=_slice("0:400"), help="pool slice A:B the null members answer "
                                                                                "twice (0:400)")
    parser.add_argument("--changed-prompts", type=_slice, default=_slice("0:120"),
                        help="pool slice the changed members answer once (0:120)")
    parser.add_argument("--members", action="append", default=[],
                        help="record only these: names, globs (b11549-*) or a group (null, changed); repeatable")
    parser.add_argument("--lanes", type=int, default=2, help="members recorded side by side (2: one per CPU)")
    parser.add_argument("--held-out", action="store_true",
                        help=f"allow pool prompts from {RESERVED} on (reserved for the held-out recording)")
    parser.add_argument("--summary", action="store_true", help="print the summary of --out and stop")
    parser.add_argument("--list", action="store_true", help="list the members and stop")
    parser.add_argument("--calibrate", choices=tuple(CALIBRATION_GRID), action="append",
                        help="measure the eval's shift of this kind over its grid of eps, at seed 0 (repeatable)")
    parser.add_argument("--grid", help="with --calibrate: the eps to try, comma-separated")
    parser.add_argument("--log-dir", type=Path, help="the servers' logs (<out>.logs/ by default)")
    parser.add_argument("--seeds", type=_seeds, default=SEEDS,
                        help=f"the weight changes' seeds, comma-separated ({','.join(map(str, SEEDS))}; a held-out "
                             f"recording takes others, and never {CALIBRATION_SEED}, the calibration's)")
    args = parser.parse_args(argv)
    if args.list:
        for member in members(args.seeds):
            print(f"{member.name:28s} {member.group:8s} {member.build} -np {member.parallel} -t {member.threads}"
                  f"{' busy' if member.busy else ''} {' '.join(member.args()[2:])}")
        return 0
    if args.calibrate:
        log_dir = args.log_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "specwatch-peer-calibration"
        for kind in args.calibrate:
            grid = [float(e) for e in args.grid.split(",")] if args.grid else CALIBRATION_GRID[kind]
            result = calibrate(kind, grid, args.lanes, log_dir, args.out)
            print(f"{kind}: plain eval {result['plain']:+.4f}; shifts " +
                  ", ".join(f"eps {e}: {s:+.4f} ({result['moved_prompts'][e]} of 30 moved, mean |d| "
                            f"{result['mean_abs_per_prompt'][e]:.3f})" for e, s in result["shifts"].items()) +
                  f"; fitted |shift| = {math.exp(result['fit']['intercept']):.3g} eps^{result['fit']['slope']:.2f}, "
                  f"eps for {TARGETS}: {result['chosen']}")
        return 0
    if args.out is None:
        parser.error("--out is required")
    if args.summary:
        print(summary(args.out))
        return 0
    chosen = select(args.members, args.seeds)
    if any(m.group == "changed" and m.change and m.change[0] in EPS and not EPS[m.change[0]] for m in chosen):
        parser.error("EPS is not calibrated yet: python -m bench.peer_record --calibrate KIND")
    size = len(pool())
    for what, asked in (("--prompts", args.prompts), ("--changed-prompts", args.changed_prompts)):
        if asked.stop > size or asked.start < 0 or not len(asked):
            parser.error(f"{what} {asked.start}:{asked.stop}: the pool has {size} prompts")
        if asked.stop > RESERVED and not args.held_out:
            parser.error(f"{what} {asked.start}:{asked.stop}: prompts from {RESERVED} on are held out (--held-out)")
    recording = Recording(args.out)
    recording.begin({"kind": "run", "pool_sha256": pool_hash(), "pool_size": size,
                     "prompts": [args.prompts.start, args.prompts.stop],
                     "changed_prompts": [args.changed_prompts.start, args.changed_prompts.stop],
                     "eval_prompts": list(EVAL_PROMPTS), "request": request("<prompt>"), "eps": EPS, "seeds": list(args.seeds),
                     "started": time.time()})
    log_dir = args.log_dir or args.out.with_name(args.out.name + ".logs")
    started = time.monotonic()
    print(f"recording {len(chosen)} members into {args.out}, {args.lanes} at a time", file=sys.stderr, flush=True)
    failed = run(chosen, args.prompts, args.changed_prompts, recording, args.lanes, log_dir)
    print(f"done in {time.monotonic() - started:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    print(summary(args.out))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
