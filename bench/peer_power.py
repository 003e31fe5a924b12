"""The replica comparison's error rates, measured on a recording of real Gemma 3 270M replicas (bench.peer_record).

Every answer goes through specwatch's own test (core.peers.Comparing), one pool prompt a round, as the daemon asks.

- False decisions (the null): the recording's healthy members (another build, -np 4 kept busy, two threads, a q8_0 KV
  cache, drafting greedily or probabilistically) each answered every prompt twice, minutes apart under whatever load
  then was: each (member, take) is one process. Processes are dealt into disjoint groups of 2, 4 and 16 (each process
  in one group of a size, each answer counted once), asked the prompts in the recording's order. Reported per size:
  member-hours watched (one round a canary_interval, 60 s by default), false decisions seen, and from them, by the rule
  of three where none was seen, the 95% bounds: on the average run length to a false decision in member-hours, on the
  chance of one in a process's first 10 rounds, and on false tickets per group per month with the shipped alert
  (SpecwatchPeerDisagreement pages on a decision that holds 10 minutes; a decision holds 12 rounds at least, so every
  false decision is counted a ticket).
- Power: each changed member (a weight change of a kind, size and seed; a requantization; synthetic acceptance) in a
  group with healthy members of the recording (for 4: the two busy four-slot ones and a plain one), asked its prompts in
  order: the answers until it is reported, as a median and range over seeds per kind and size, and the share reported
  within 10.

A member's own noise (what copies asked at once part by, under its load) is not in the recording: a four-slot member is
given the running mean of how far its two takes of a prompt parted (minutes apart: an upper bound of its batching
noise), a one-slot member none.

    python -m bench.peer_power --recording held.jsonl.gz
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peer_record import read
from specwatch.core.answered import NOISE_SAMPLES
from specwatch.core.evidence import difference
from specwatch.core.peers import Comparing, Fingerprint, Peer
from specwatch.probe.logprobs import Logprobs, logprobs_of
from specwatch.probe.readers import Token

SIZES = (2, 4, 16)
INTERVAL = 60.0
"""The default canary_interval: one peer-probe round a member per interval."""
HOURS_PER_MONTH = 730.0
FIRST = 10
"""A process's first rounds, where a false decision would greet every restart."""
PRINT = Fingerprint(build="b", file="gemma.gguf", ftype="Q4_K - Medium")
"""Every member's fingerprint alike: only the answers can tell them apart, as the weight changes were made."""


def logprobs(answer: dict[str, Any]) -> Logprobs:
    """A recorded answer as the peer probe reads it: a token without a value is a fill-in."""
    tokens = []
    for text, value, top in answer["tokens"]:
        flat = tuple(x for pair in top for x in pair) if value is not None else ()
        tokens.append(Token(value, len(flat) // 2, text=text, top=flat))
    return logprobs_of(tokens)


class Process:
    """One member process of the recording: its answers by prompt, and its own noise as the rounds go."""

    def __init__(self, name: str, header: dict[str, Any], answers: dict[int, Logprobs], other: dict[int, Logprobs]):
        self.name = name
        self.slots = int(header["config"]["parallel"])
        self.answers = answers
        self._other = other
        self._spreads: list[float] = []

    def noise(self, prompt: int) -> float | None:
        """Its own noise after `prompt`: none on one slot, else the running mean of its takes' parting."""
        if self.slots <= 1:
            return 0.0
        if prompt in self._other and prompt in self.answers:
            found = difference(self.answers[prompt], self._other[prompt])
            if not found.nothing:
                self._spreads = [*self._spreads, found.mean][-NOISE_SAMPLES:]
        return statistics.fmean(self._spreads) if self._spreads else None


def processes(headers: dict[str, Any], answers: dict[str, dict[tuple[int, int], Any]], group: str) -> list[Process]:
    found = []
    for name, header in headers.items():
        if header["group"] != group:
            continue
        takes = sorted({take for _, take in answers[name]})
        by_take = {t: {p: logprobs(a) for (p, tk), a in answers[name].items() if tk == t} for t in takes}
        for take in takes:
            other = by_take.get(1 - take, {})
            found.append(Process(f"{name}#{take}", header, by_take[take], other))
    # Dealt take by take: a group mixes deployments (builds, slots, caches), as a rolling pool does.
    return sorted(found, key=lambda p: (p.name.split("#")[1], p.name))


def run(members: Sequence[Process], prompts: Sequence[int], watched: str | None = None,
        scores: dict[str, list[float]] | None = None) -> tuple[list[int], int | None]:
    """The rounds at which any member's decision began (a false one in a healthy group), and the round `watched` was
    first decided at (None if never); each member's score of each round it was scored on goes into `scores`."""
    test: Comparing[str] = Comparing()
    decided: dict[str, bool] = {}
    starts: list[int] = []
    first: int | None = None
    for at, prompt in enumerate(prompts):
        peers = {m.name: Peer(PRINT, {at: m.answers[prompt]} if prompt in m.answers else {}, m.noise(prompt), at)
                 for m in members}
        before = {name: evidence.answers for name, evidence in test.evidence.items()}
        test.count(peers, before=at + 1)
        for name, evidence in test.evidence.items():
            if scores is not None and evidence.answers > before.get(name, 0) and evidence.last is not None:
                scores.setdefault(name, []).append(evidence.last)
            now = evidence.decided
            if now and not decided.get(name, False):
                if watched is None or name != watched:
                    starts.append(at)
                if name == watched and first is None:
                    first = at + 1
            decided[name] = now
    return starts, first


def _bound(events: int, exposure: float) -> float:
    """The 95% upper bound on a rate from `events` seen in `exposure` (exact Poisson: 3.0 / exposure for none)."""
    upper = {0: 3.0, 1: 4.74, 2: 6.30, 3: 7.75, 4: 9.15, 5: 10.51}.get(events, events + 1.96 * math.sqrt(events) + 2)
    return upper / exposure


def resampled(scores: dict[str, list[float]], *, streams: int = 500, rounds: int = 10_000, boots: int = 20,
              seed: int = 1) -> tuple[int, int, float]:
    """The test run on resampled null scores: (decisions, member-rounds) with the scores as measured, and the largest
    decision rate over `boots` bootstrap draws of each member's scores (the data's uncertainty, roughly its 95th
    percentile). Each stream keeps to one member's own scores, drawn with replacement: a member whose deployment sits
    apart (another build, a q8_0 cache) stays apart, but rounds are taken as independent."""
    import numpy as np

    from specwatch.core.evidence import ALLOWANCE, CAP, GROSS, GROSS_ROUNDS, GROSS_WINDOW, THRESHOLD

    rng = np.random.default_rng(seed)
    own = [np.asarray(v, dtype=float) for v in scores.values() if v]

    def decisions(samples: list[np.ndarray]) -> int:
        member = rng.integers(len(samples), size=streams)
        lengths = np.array([len(samples[m]) for m in member])
        pool = np.zeros((streams, int(lengths.max())))
        for row, m in enumerate(member):
            pool[row, :lengths[row]] = samples[m]
        total = np.zeros(streams)
        gross = np.zeros((streams, GROSS_WINDOW), dtype=bool)
        decided = np.zeros(streams, dtype=bool)
        found = 0
        for t in range(rounds):
            score = pool[np.arange(streams), rng.integers(lengths)]
            total = np.clip(total + np.minimum(score, CAP) - ALLOWANCE, 0.0, THRESHOLD)
            gross[:, t % GROSS_WINDOW] = score >= GROSS
            total[(score >= GROSS) & (gross.sum(axis=1) >= GROSS_ROUNDS)] = THRESHOLD
            now = total >= THRESHOLD
            found += int(np.sum(now & ~decided))
            decided = now | (decided & (total > 0.0))
        return found

    seen = decisions(own)
    worst = max(decisions([rng.choice(s, size=len(s)) for s in own]) for _ in range(boots))
    return seen, streams * rounds, worst / (streams * rounds)


def null_rates(null: list[Process], prompts: Sequence[int]) -> list[str]:
    lines = ["| group size | groups (disjoint) | member-hours watched | false decisions | average run length to a false "
             "decision, member-hours | P(false decision in a process's first 10 rounds) | false tickets per group per "
             "month | resampled: member-hours, decisions, average run length (bootstrap bound) | resampled: tickets "
             "per group per month (bound) | scores over the allowance, largest |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for size in SIZES:
        groups = [null[i:i + size] for i in range(0, len(null) - size + 1, size)]
        if not groups:
            lines.append(f"| {size} | too few processes ({len(null)}) | | | | | | | | |")
            continue
        events, early = 0, 0
        scores: dict[str, list[float]] = {}
        for members in groups:
            starts, _ = run(members, prompts, scores=scores)
            events += len(starts)
            early += sum(1 for s in starts if s < FIRST)
        rounds = len(prompts)
        member_hours = len(groups) * size * rounds * INTERVAL / 3600
        group_hours = len(groups) * rounds * INTERVAL / 3600
        processes_started = len(groups) * size
        arl = f"{member_hours / events:.1f}" if events else f"> {1 / _bound(0, member_hours):.1f} (none seen)"
        if events:
            arl += f" (bound > {1 / _bound(events, member_hours):.1f})"
        p_first = f"{early / processes_started:.3f} (bound {min(1.0, _bound(early, processes_started)):.3f})"
        tickets = events / group_hours * HOURS_PER_MONTH
        from specwatch.core.evidence import ALLOWANCE

        every = [x for v in scores.values() for x in v]
        over = f"{sum(1 for x in every if x > ALLOWANCE) / len(every):.1%} of {len(every)}, {max(every):.2f}"
        found, member_rounds, worst = resampled(scores)
        sim_hours = member_rounds * INTERVAL / 3600
        rate = (found or 3.0) / sim_hours  # none seen: the rule of three
        bound_rate = max(worst * 3600 / INTERVAL, _bound(found, sim_hours))
        said = "none" if not found else str(found)
        sim_arl = f"{'> ' if not found else ''}{1 / rate:,.0f}"
        lines.append(f"| {size} | {len(groups)} | {member_hours:.1f} | {events} | {arl} | {p_first} | "
                     f"{tickets:.2f} (bound {_bound(events, group_hours) * HOURS_PER_MONTH:.1f}) | "
                     f"{sim_hours:,.0f}, {said}, {sim_arl} (> {1 / bound_rate:,.0f}) | "
                     f"{size * (found / sim_hours) * HOURS_PER_MONTH:.4f} (bound {size * bound_rate * HOURS_PER_MONTH:.4f}) "
                     f"| {over} |")
    return lines


def power(changed: list[Process], null: list[Process], prompts: Sequence[int]) -> list[str]:
    by_name = {p.name.split("#")[0]: p for p in null if p.name.endswith("#0")}
    pools = {2: ["b11434-np1"], 4: ["b11434-np4-busy-a", "b11434-np4-busy-b", "b11434-np1"],
             16: sorted(by_name)[:15]}
    lines = ["| change | group of 2 | group of 4 (two busy -np 4) | group of 16 | within 10 answers (of 4) |",
             "|---|---|---|---|---|"]
    kinds: dict[str, list[Process]] = {}
    for member in changed:
        base = member.name.split("#")[0]
        kind = base.rsplit("-s", 1)[0] if "-eps" in base else base
        kinds.setdefault(kind, []).append(member)
    for kind, members in sorted(kinds.items()):
        cells, within = [], ""
        for size, names in pools.items():
            healthy = [by_name[n] for n in names if n in by_name]
            if len(healthy) < size - 1:
                cells.append("-")
                continue
            found = [run([*healthy, m], [p for p in prompts if p in m.answers], watched=m.name)[1] for m in members]
            seen = sorted(f for f in found if f is not None)
            missed = len(found) - len(seen)
            text = "never" if not seen else (f"median {statistics.median(seen + [math.inf] * missed):g}, "
                                             f"range {seen[0]}-{'never' if missed else seen[-1]}")
            cells.append(f"{text} ({len(found)} seeds)")
            if size == 4:
                within = f"{sum(1 for f in found if f is not None and f <= 10)}/{len(found)}"
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {within} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_power", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recording", type=Path, required=True, help="a recording of bench.peer_record (gzip JSONL)")
    args = parser.parse_args(argv)
    try:
        run_line, headers, answers = read(args.recording)
    except (OSError, EOFError, ValueError, KeyError) as err:
        parser.error(f"cannot read the recording {args.recording}: {err}")
    null = processes(headers, answers, "null")
    changed = processes(headers, answers, "changed")
    if not null:
        parser.error(f"{args.recording} has no healthy member: record some with bench.peer_record --members null")
    order = sorted({p for m in null for p in m.answers})
    print(f"{args.recording}: {len(null)} healthy processes, {len(changed)} changed members, prompts "
          f"{run_line.get('prompts')} (changed {run_line.get('changed_prompts')}), seeds {run_line.get('seeds')}")
    print("\nFalse decisions of healthy groups (each answer counted once):\n")
    print("\n".join(null_rates(null, order)))
    if changed:
        print("\nAnswers until a changed member is reported (its answers, in order):\n")
        print("\n".join(power(changed, null, sorted({p for m in changed for p in m.answers}))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
