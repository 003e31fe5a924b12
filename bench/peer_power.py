"""Replicas of a real trained model compared: how soon each kind of difference is reported, what it does to an eval's
number, and how often a healthy pool is reported falsely.

Two parts, each on its own with --only:

- collect: real llama-servers of Gemma 3 270M Q4_K_M (tests/support/gemma.py) under one alias: a plain one-slot
  replica, two four-slot replicas kept busy by three other requests decoding at all times, one drafting with itself
  (draft-simple), one under another file name, one under another build string, and the replicas that differ: a
  requantization (Q4_0), the same file with its norm weights changed at three sizes, and one accepting drafts at random
  (synthetic acceptance). Each is asked the peer probe as the daemon asks it: every question, and a burst of copies
  of each, then one question a round in turn; the fill-in canary's plain and chat answers beside it; and 20 ordinary
  questions once, for the eval's number. Every answer is written to answers.jsonl.
- analyse: the answers replayed through specwatch's own comparison (core/peers.compare), in the daemon's order: the
  first round's answers together, then each round's fresh answer counted once. Printed: the batching noise measured,
  false disagreements of the healthy pool, and for each difference the answers (and minutes at the default
  canary_interval) until it is reported, in a pool of four and in a pair; and the same with the fill-in canary's
  answers standing in for the peer probe's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specwatch import loop
from specwatch.core.evidence import Evidence, spread
from specwatch.core.peers import Fingerprint, Peer, compare
from specwatch.endpoints import Endpoint
from specwatch.probe.canary import TABLE
from specwatch.probe.http.client import new_client
from specwatch.probe.http.fetch import Fetcher
from specwatch.probe.logprobs import Logprobs, logprobs_of
from specwatch.probe.peerprobe import BURST, PATH, QUESTIONS, body, read
from tests.support import gemma, llamabuild
from tests.support.traffic import busy

HEALTHY = ("plain", "busy-a", "busy-b", "drafting", "renamed", "other-build")
DIFFERENT = ("requantized", "weights-0.02", "weights-0.03", "weights-0.035", "weights-0.05", "synthetic")
CANARIES = (("completion", Endpoint.COMPLETION, 8), ("chat", Endpoint.CHAT, 32))
CANARY_ROUNDS = 60
"""Rounds in which the canary's answers are recorded too: enough to weigh them against the peer probe's."""
"""The fill-in canary's answers recorded beside the peer probe's: (name, endpoint, tokens) as the daemon asks them."""
EVAL_PROMPTS = tuple(f"Question: {q}\nAnswer:" for q in (
    "What is the capital of France?", "Who wrote Romeo and Juliet?", "How many legs does a spider have?",
    "What is the boiling point of water?", "Which planet is known as the Red Planet?", "What do bees make?",
    "What is the largest ocean on Earth?", "What gas do plants absorb from the air?", "Who painted the Mona Lisa?",
    "What is the square root of 81?", "How many continents are there?", "What is the chemical symbol for gold?",
    "What language is mainly spoken in Brazil?", "What organ pumps blood through the body?",
    "In which country are the pyramids of Giza?", "What is the freezing point of water?",
    "Which animal is known as the king of the jungle?", "What is the tallest mountain in the world?",
    "What is the main ingredient in bread?", "How many days are there in a leap year?"))


@dataclass
class Replica:
    name: str
    model: Path
    parallel: int = 1
    extra: tuple[str, ...] = ()
    binary: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    busy: bool = False


def replicas(work: Path) -> list[Replica]:
    source = gemma.model()
    renamed = work / "renamed" / "gemma-copy.gguf"
    renamed.parent.mkdir(parents=True, exist_ok=True)
    if not renamed.exists():
        renamed.symlink_to(source)
    requantized = work / "gemma-q4_0.gguf"
    if not requantized.exists():
        gemma.requantized(source, requantized)
    # A smaller draft, as a speculating replica has: its drafts are verified in batches (lossless up to ties and the
    # batch's noise), or, with synthetic acceptance, accepted unverified (its text is the draft's, not the model's).
    draft = ("-md", str(requantized), "--spec-type", "draft-simple")
    switches = llamabuild.build_env()  # every upstream PR's behaviour off: build 11434 as released
    return [
        Replica("plain", source),
        Replica("busy-a", source, parallel=4, busy=True),
        Replica("busy-b", source, parallel=4, busy=True),
        Replica("drafting", source, extra=draft),
        Replica("renamed", renamed),
        Replica("other-build", source, binary=gemma.relabelled_build(work), env=switches),
        Replica("requantized", requantized),
        *(Replica(f"weights-{eps:g}", gemma.changed_weights(source, work / f"eps-{eps:g}", eps))
          for eps in (0.02, 0.03, 0.035, 0.05)),
        Replica("synthetic", source, extra=(*draft, "--spec-synth-len", "4")),
    ]


async def _ask(fetcher: Fetcher, url: str, kind: str, question: int) -> Any:
    if kind == "peer":
        return await fetcher.post_json(f"{url}{PATH}", body(question), headers={}, timeout=120)
    _, endpoint, tokens = CANARIES[question]
    spec = TABLE[endpoint]
    return await fetcher.post_json(f"{url}{spec.path}", spec.body(tokens), headers={}, timeout=120)


async def _collect_from(url: str, name: str, rounds: int, out: Any) -> None:
    async with new_client() as client:
        fetcher = Fetcher(client, 1 << 24)

        def write(kind: str, question: int, round_: int, copy: int, answer: Any) -> None:
            out.write(json.dumps({"server": name, "kind": kind, "question": question, "round": round_, "copy": copy,
                                  "t": time.time(), "answer": answer}) + "\n")

        for kind, count in (("peer", len(QUESTIONS)), ("canary", len(CANARIES))):
            for question in range(count):
                write(kind, question, 0, 0, await _ask(fetcher, url, kind, question))
                burst = await asyncio.gather(*(_ask(fetcher, url, kind, question) for _ in range(BURST)))
                for copy, answer in enumerate(burst, start=1):
                    write(kind, question, 0, copy, answer)
        for round_ in range(1, rounds + 1):
            write("peer", round_ % len(QUESTIONS), round_, 0, await _ask(fetcher, url, "peer", round_ % len(QUESTIONS)))
            if round_ <= CANARY_ROUNDS:
                write("canary", round_ % len(CANARIES), round_, 0,
                      await _ask(fetcher, url, "canary", round_ % len(CANARIES)))
        for index, prompt in enumerate(EVAL_PROMPTS):
            answer = await fetcher.post_json(f"{url}/completion", {"prompt": prompt, "n_predict": 24, "n_probs": 3,
                                                                   "temperature": 0.0, "cache_prompt": False},
                                             headers={}, timeout=120)
            write("eval", index, 0, 0, answer)


def collect(work: Path, rounds: int, rounds_different: int, only: Sequence[str]) -> Path:
    from specwatch.demo.llamaserver import LlamaServer

    answers = work / "answers.jsonl"
    wanted = [r for r in replicas(work) if not only or r.name in only]
    with open(answers, "a") as out:
        # One at a time: the machine has two CPUs, and a busy replica's load is its own, not its neighbours'.
        for replica in wanted:
            count = rounds if replica.name in HEALTHY else rounds_different
            started = time.monotonic()
            server = LlamaServer(replica.model, ["-a", gemma.ALIAS, *replica.extra], parallel=replica.parallel,
                                 ctx_size=4096 * replica.parallel, binary=replica.binary, env=replica.env, log_dir=work,
                                 startup_timeout=180)
            with server:
                info = {"server": replica.name, "kind": "props",
                        "answer": json.loads(urllib.request.urlopen(f"{server.url}/props", timeout=10).read()),
                        "models": json.loads(urllib.request.urlopen(f"{server.url}/v1/models", timeout=10).read())}
                out.write(json.dumps(info) + "\n")
                if replica.busy:
                    with busy(server.url, n_predict=96):
                        time.sleep(1.0)  # the other requests decode before the first probe
                        loop.run(_collect_from(server.url, replica.name, count, out))
                else:
                    loop.run(_collect_from(server.url, replica.name, count, out))
            out.flush()
            print(f"  {replica.name}: {count} rounds in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return answers


# Analysis ------------------------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    """One replica's answers: the first round's (solo and burst copies) and each later round's, per question."""

    fingerprint: Fingerprint
    first: dict[int, list[Logprobs]] = field(default_factory=dict)
    rounds: list[tuple[int, Logprobs]] = field(default_factory=list)
    evals: list[float] = field(default_factory=list)
    """The mean logprob of the real tokens of each ordinary question's answer."""


def _logprobs(kind: str, question: int, answer: Any) -> Logprobs:
    if kind == "peer":
        return read(answer)[0]
    return logprobs_of(TABLE[CANARIES[question][1]].read(answer).tokens)


def load(answers: Path, kind: str) -> dict[str, Recorded]:
    found: dict[str, Recorded] = {}
    for line in answers.read_text().splitlines():
        record = json.loads(line)
        name = record["server"]
        if record["kind"] == "props":
            props, meta = record["answer"], record["models"]["data"][0].get("meta", {})
            fingerprint = Fingerprint(build=props.get("build_info", ""), file=Path(props.get("model_path", "")).name,
                                      **{k: str(meta.get(k, "")) for k in ("ftype", "size", "n_params", "n_vocab",
                                                                          "n_ctx_train", "n_embd")})
            found[name] = Recorded(fingerprint)
        elif record["kind"] == "eval":
            values = [p["logprob"] for p in record["answer"].get("completion_probabilities", [])
                      if p.get("top_logprobs")]
            found[name].evals.append(statistics.fmean(values) if values else 0.0)
        elif record["kind"] == kind:
            logprobs = _logprobs(kind, record["question"], record["answer"])
            held = found[name]
            if record["round"] == 0:
                held.first.setdefault(record["question"], []).append(logprobs)
            else:
                held.rounds.append((record["question"], logprobs))
    return found


@dataclass
class Replay:
    """A group's comparisons replayed: per member, the answer after which it was reported differing (None: never)."""

    reported: dict[str, int | None]
    counted: dict[str, int]
    """Answers each member had counted at the end."""
    highest: dict[str, float] = field(default_factory=dict)
    """Each member's highest score (its difference over the group's noise): below the test's allowance, it added
    nothing to the evidence."""


def replay(recorded: dict[str, Recorded], members: Sequence[str], rounds: int | None = None) -> Replay:
    """The daemon's order: the first round's answers together (with the noise of the bursts), then a round at a time."""
    questions = sorted(recorded[members[0]].first)
    peers = {m: Peer(recorded[m].fingerprint, {q: recorded[m].first[q][0] for q in questions},
                     {q: spread(recorded[m].first[q]) for q in questions}) for m in members}
    judgement = compare(peers)
    reported: dict[str, int | None] = {m: None for m in members}
    evidence: dict[str, Evidence] = {m: c.evidence for m, c in judgement.members.items()}
    highest = {m: e.last or 0.0 for m, e in evidence.items()}
    for m, c in judgement.members.items():
        if c.agreement is False:
            reported[m] = c.evidence.answers or 1
    count = min(len(recorded[m].rounds) for m in members) if rounds is None else rounds
    for step in range(count):
        for m in members:
            question, answer = recorded[m].rounds[step]
            peers[m] = Peer(peers[m].fingerprint, {**peers[m].answers, question: answer}, peers[m].noise)
        news = {m: {recorded[m].rounds[step][0]} for m in members}
        judgement = compare(peers, before=evidence, fresh=news)
        evidence = {m: c.evidence for m, c in judgement.members.items()}
        for m, c in judgement.members.items():
            highest[m] = max(highest[m], c.evidence.last or 0.0)
            if c.agreement is False and reported[m] is None:
                reported[m] = c.evidence.answers
    return Replay(reported, {m: e.answers for m, e in evidence.items()}, highest)


def _healthy(recorded: dict[str, Recorded], healthy: list[str]) -> str:
    """False disagreements of the healthy pool, and of every pair of healthy replicas."""
    pool = replay(recorded, healthy)
    answers = sum(pool.counted.values())
    false = sorted(m for m, n in pool.reported.items() if n is not None)
    pairs = [replay(recorded, [a, b]) for i, a in enumerate(healthy) for b in healthy[i + 1:]]
    pair_answers = sum(sum(p.counted.values()) for p in pairs)
    pair_false = sum(1 for p in pairs if any(n is not None for n in p.reported.values()))
    highest = max([*pool.highest.values(), *(s for p in pairs for s in p.highest.values())], default=0.0)
    busy = sum(n for p in [pool, *pairs] for m, n in p.counted.items() if m.startswith("busy"))
    return (f"{answers} answers in the pool of {', '.join(healthy)}: false disagreements {len(false)} {false or ''}; "
            f"{len(pairs)} pairs of them, {pair_answers} answers: pairs falsely reported {pair_false}; "
            f"{busy} of all those answers were a busy replica's; the highest score of a healthy answer {highest:.2f} "
            "(the test adds evidence above 2)")


def _minutes(answers: int | None, first: int) -> str:
    """At the defaults: the first round's answers at once, then one a canary_interval (60 s)."""
    if answers is None:
        return "-"
    return "0" if answers <= first else f"{answers - first}"


def analyse(answers: Path, interval: float = 60.0) -> None:
    for kind, what in (("peer", "the peer probe"), ("canary", "the fill-in canary's answers (completion 8, chat 32)")):
        recorded = load(answers, kind)
        if not recorded:
            continue
        first = len(next(iter(recorded.values())).first)
        print(f"\n## Compared on {what}\n")
        print("| replica | noise measured (nats, largest over questions) | eval mean logprob per token | its effect |")
        print("| --- | --- | --- | --- |")
        reference = statistics.fmean(recorded["plain"].evals) if "plain" in recorded else 0.0
        for name, held in recorded.items():
            noise = max(spread(v) for v in held.first.values()) if held.first else 0.0
            if name in ("drafting", "synthetic"):  # fill-ins on build 11434: an eval reads no number of theirs
                print(f"| {name} | {noise:.3f} | fill-ins | - |")
                continue
            mean = statistics.fmean(held.evals) if held.evals else float("nan")
            print(f"| {name} | {noise:.3f} | {mean:+.3f} | {mean - reference:+.3f} |")
        healthy = [m for m in HEALTHY if m in recorded]
        print(f"\nHealthy: {_healthy(recorded, healthy)}.")
        blind = {name: replace(held, first={q: v[:1] for q, v in held.first.items()}) for name, held in recorded.items()}
        print(f"\nThe same with every burst cut to its first answer (no noise measured anywhere, so the margin is the "
              f"noise): {_healthy(blind, healthy)}.")
        print("\n| difference | in a pool of four: answers until reported | minutes at the defaults | healthy members "
              "reported | in a pair with plain | pair with busy-a |")
        print("| --- | --- | --- | --- | --- | --- |")
        for name in (*DIFFERENT, *[m for m in HEALTHY if m not in ("plain", "busy-a", "busy-b")]):
            if name not in recorded:
                continue
            group = replay(recorded, ["plain", "busy-a", "busy-b", name])
            with_plain = replay(recorded, ["plain", name]).reported[name]
            with_busy = replay(recorded, ["busy-a", name]).reported[name]
            others = [m for m in ("plain", "busy-a", "busy-b") if group.reported[m] is not None]
            print(f"| {name} | {group.reported[name] or '-'} of {group.counted[name]} | "
                  f"{_minutes(group.reported[name], first)} | {', '.join(others) or 'none'} | {with_plain or '-'} | "
                  f"{with_busy or '-'} |")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_power", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="where the models, logs and answers.jsonl go (a new temporary "
                                                  "directory by default; give one to analyse again)")
    parser.add_argument("--rounds", type=int, default=350,
                        help="rounds of one question after the first, for each healthy replica (350)")
    parser.add_argument("--rounds-different", type=int, default=80,
                        help="the same for each replica that differs: it is reported within far fewer (80)")
    parser.add_argument("--only", choices=("collect", "analyse"), help="one part only (both by default)")
    parser.add_argument("--replica", action="append", default=[], help="collect only these replicas (repeatable)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="specwatch-peer-power-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {work}", file=sys.stderr)
    if args.only != "analyse":
        collect(work, args.rounds, args.rounds_different, args.replica)
    if args.only != "collect":
        analyse(work / "answers.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
