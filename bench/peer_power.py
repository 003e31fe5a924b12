"""The replica comparison's error rates, measured on a recording of real Gemma 3 270M replicas (bench.peer_record).

Every answer goes through specwatch's own test (core.peers.Comparing), one pool prompt a round, as the daemon asks.

- False decisions (the null): the recording's healthy members (another build, -np 4 kept busy, two threads, a q8_0 KV
  cache, drafting greedily or probabilistically) each answered every prompt twice, minutes apart under whatever load
  then was: each (member, take) is one process. Processes are dealt into disjoint groups of 2, 4 and 16 (each process
  in one group of a size, each answer counted once), asked the prompts in the recording's order. Reported per size:
  member-hours watched (one round a canary_interval, 60 s by default), false decisions seen, and from them, by the rule
  of three where none was seen, the 95% bounds: on the average run length to a false decision in member-hours, on the
  chance of one in a process's first 10 rounds, and on false tickets per group per month. A ticket is what the shipped
  SpecwatchReplicasDisagree would open, its windows read from alerts/specwatch.rules.yml: a member differs while it was
  decided within min_over_time's range, and the group's ticket fires once some member has differed for its `for:`
  (--for counts at other durations too). The same figures from the members' scores resampled (512 streams, 10,000
  rounds unless --rounds says, rounds and members taken as independent) give the rates no recording is long enough
  to see.
- Power: each changed member (a weight change of a kind, size and seed; a requantization; synthetic acceptance) in a
  group with healthy members of the recording (for 4: the two busy four-slot ones and a plain one), asked its prompts in
  order: the answers until it is reported, as a median and range over seeds per kind and size, the share reported
  within 10, and the answers until its ticket fires.
- --uniform: the same for groups declared deployed alike (peer_uniform), whose healthy members are those deployed as the
  plain replica is, in groups of one build; the q8_0 KV cache replica is then one to report.

A member's own noise (what copies asked at once part by, under its load) is not in the recording: a four-slot member is
given the running mean of how far its two takes of a prompt parted (minutes apart: an upper bound of its batching
noise), a one-slot member none.

    python -m bench.peer_power --recording held.jsonl.gz
    python -m bench.peer_power --recording tune.jsonl.gz --floor 0.09 --allowance 1.1 --cap 1.6 --threshold 2
    python -m bench.peer_power --recording held.jsonl.gz --uniform
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.peer_record import read
from specwatch.core.answered import NOISE_SAMPLES
from specwatch.core.evidence import FLOOR, GROSS, GROSS_ROUNDS, GROSS_WINDOW, SHIPPED, UNIFORM_FLOOR, Shape, difference
from specwatch.core.peers import Comparing, Fingerprint, Peer
from specwatch.probe.logprobs import Logprobs, logprobs_of
from specwatch.probe.readers import Token

SIZES = (2, 4, 16)
RULES = Path(__file__).resolve().parents[1] / "alerts" / "specwatch.rules.yml"
TICKET = "SpecwatchReplicasDisagree"
"""The alert a member's decision opens, one ticket per group: its windows are read from the shipped rules."""
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
        config = header["config"]
        self.slots = int(config["parallel"])
        self.build = str(config.get("build", ""))
        self.alike = config.get("kv", "f16") == "f16" and config.get("draft") is None
        """Deployed as the plain replica is (f16 KV cache, no drafting), whatever its build, slots, threads and load:
        what a group declared deployed alike (peer_uniform) may hold."""
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


@dataclass(frozen=True)
class Tried:
    """The test as run: the shipped constants, unless a bench tries others on a tuning recording."""

    floor: float = FLOOR
    uniform: float | None = None
    """The floor of a group declared deployed alike (peer_uniform); None: the group is not."""
    shape: Shape = SHIPPED

    def comparing(self) -> Comparing[str]:
        return Comparing(floor=self.floor, uniform=self.uniform is not None,
                         uniform_floor=UNIFORM_FLOOR if self.uniform is None else self.uniform, shape=self.shape)


def run(members: Sequence[Process], prompts: Sequence[int], watched: str | None = None,
        scores: dict[str, list[float]] | None = None,
        states: dict[str, list[bool]] | None = None, *, tried: Tried = Tried()) -> tuple[list[int], int | None]:
    """The rounds at which any member's decision began (a false one in a healthy group), and the round `watched` was
    first decided at (None if never); each member's score of each round it was scored on goes into `scores`, and
    whether it stood decided after each round into `states`."""
    test = tried.comparing()
    decided: dict[str, bool] = {}
    starts: list[int] = []
    first: int | None = None
    prints = {m.name: replace(PRINT, build=m.build) for m in members}
    for at, prompt in enumerate(prompts):
        peers = {m.name: Peer(prints[m.name], {at: m.answers[prompt]} if prompt in m.answers else {}, m.noise(prompt), at)
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
        if states is not None:
            for member in members:
                states.setdefault(member.name, []).append(decided.get(member.name, False))
    return starts, first


@dataclass(frozen=True)
class Alert:
    """The shipped ticket's windows, in rounds: a member counts as differing while it was decided in the last `window`
    rounds (min_over_time), and the group's ticket fires once that has held `hold` rounds in a row (for:)."""

    window: int
    hold: int
    text: str

    @classmethod
    def shipped(cls, hold: float | None = None) -> Alert:
        """SpecwatchReplicasDisagree as alerts/specwatch.rules.yml ships it (or with another `for:`, in seconds)."""
        import yaml

        from specwatch.durations import format_duration, parse_duration

        groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
        rule = next(r for g in groups for r in g["rules"] if r.get("alert") == TICKET)
        window = re.search(r"min_over_time\(specwatch_peer_agreement\[(\w+)\]\)", rule["expr"])
        if window is None:
            raise ValueError(f"{TICKET} in {RULES} no longer reads min_over_time(specwatch_peer_agreement[...])")
        seconds = parse_duration(window.group(1))
        held = parse_duration(rule["for"]) if hold is None else hold
        return cls(math.ceil(seconds / INTERVAL), math.ceil(held / INTERVAL),
                   f"min_over_time [{format_duration(seconds)}], for: {format_duration(held)}")

    def tickets(self, states: Sequence[Sequence[bool]]) -> list[int]:
        """The rounds at which one group's ticket fires, from each member's decided state after each round."""
        rounds = max((len(s) for s in states), default=0)
        last = -math.inf
        run_length, fired = 0, []
        for t in range(rounds):
            if any(t < len(s) and s[t] for s in states):
                last = t
            run_length = run_length + 1 if t - last < self.window else 0
            if run_length == self.hold:
                fired.append(t)
        return fired


def _bound(events: int, exposure: float) -> float:
    """The 95% upper bound on a rate from `events` seen in `exposure` (exact Poisson: 3.0 / exposure for none)."""
    upper = {0: 3.0, 1: 4.74, 2: 6.30, 3: 7.75, 4: 9.15, 5: 10.51}.get(events, events + 1.96 * math.sqrt(events) + 2)
    return upper / exposure


def resampled(scores: dict[str, list[float]], alerts: Sequence[Alert], size: int, *, streams: int = 512,
              rounds: int = 10_000, boots: int = 20, seed: int = 1,
              shape: Shape = SHIPPED) -> tuple[int, int, list[int], list[float]]:
    """The test run on resampled null scores: (decisions, member-rounds, tickets per alert) with the scores as
    measured, and the largest ticket rate per group-round of each alert over `boots` bootstrap draws of each member's
    scores (the data's uncertainty, roughly its 95th percentile). Each stream keeps to one member's own scores, drawn
    with replacement: a member whose deployment sits apart (another build, a q8_0 cache) stays apart, but rounds are
    taken as independent, and so are the members of a group (in a pair the two scores move together, so a pair's
    tickets are counted high). Streams are dealt into groups of `size`, each ticket counted once per group."""
    import numpy as np

    rng = np.random.default_rng(seed)
    own = [np.asarray(v, dtype=float) for v in scores.values() if v]

    groups = streams // size

    def decisions(samples: list[np.ndarray]) -> tuple[int, list[int]]:
        member = rng.integers(len(samples), size=streams)
        lengths = np.array([len(samples[m]) for m in member])
        pool = np.zeros((streams, int(lengths.max())))
        for row, m in enumerate(member):
            pool[row, :lengths[row]] = samples[m]
        total = np.zeros(streams)
        gross = np.zeros((streams, GROSS_WINDOW), dtype=bool)
        decided = np.zeros(streams, dtype=bool)
        last = np.full(streams, -10**9)
        run_length = np.zeros((len(alerts), groups), dtype=int)
        fired = [0] * len(alerts)
        found = 0
        for t in range(rounds):
            score = pool[np.arange(streams), rng.integers(lengths)]
            total = np.clip(total + np.minimum(score, shape.cap) - shape.allowance, 0.0, shape.threshold)
            gross[:, t % GROSS_WINDOW] = score >= GROSS
            total[(score >= GROSS) & (gross.sum(axis=1) >= GROSS_ROUNDS)] = shape.threshold
            now = total >= shape.threshold
            found += int(np.sum(now & ~decided))
            decided = now | (decided & (total > 0.0))
            last[decided] = t
            for a, alert in enumerate(alerts):
                differing = (t - last[:groups * size] < alert.window).reshape(groups, size).any(axis=1)
                run_length[a] = np.where(differing, run_length[a] + 1, 0)
                fired[a] += int(np.sum(run_length[a] == alert.hold))
        return found, fired

    seen, tickets = decisions(own)
    worst = [0] * len(alerts)
    for _ in range(boots):
        _, drawn = decisions([rng.choice(s, size=len(s)) for s in own])
        worst = [max(w, d) for w, d in zip(worst, drawn, strict=True)]
    return seen, streams * rounds, tickets, [w / (groups * rounds) for w in worst]


def dealt(null: Sequence[Process], size: int, *, by_build: bool = False) -> list[list[Process]]:
    """The healthy processes dealt into disjoint groups of `size` in order; with `by_build`, each group of one build
    (a group declared deployed alike runs one build, but while a rollout goes through it)."""
    lists = [[p for p in null if p.build == b] for b in dict.fromkeys(p.build for p in null)] if by_build else [null]
    return [members[i:i + size] for members in lists for i in range(0, len(members) - size + 1, size)]


def null_rates(null: list[Process], prompts: Sequence[int], alerts: Sequence[Alert],
               resampled_rounds: int = 10_000, *, tried: Tried = Tried()) -> list[str]:
    """The healthy groups' false decisions, and the tickets the alert would have opened on them, by group size. A size
    the recording holds no group of (a group declared alike is of one build) is resampled from the scores of the
    largest size it holds."""
    lines = ["| group size | groups (disjoint) | member-hours watched | false decisions | average run length to a false "
             "decision, member-hours | P(false decision in a process's first 10 rounds) | resampled: member-hours, "
             "decisions, average run length | scores over the allowance, largest |",
             "|---|---|---|---|---|---|---|---|"]
    ticket_lines = ["| group size | alert | tickets seen (group-hours) | false tickets per group per month (95% bound) "
                    "| resampled: tickets, false tickets per group per month (bootstrap bound) |",
                    "|---|---|---|---|---|"]
    shape = tried.shape
    largest: tuple[int, dict[str, list[float]]] | None = None
    for size in SIZES:
        groups = dealt(null, size, by_build=tried.uniform is not None)
        if not groups:
            if largest is None:
                lines.append(f"| {size} | too few processes ({len(null)}) | | | | | | |")
                continue
            sim_text, sim_cells = _resampled_cells(largest[1], size, alerts, resampled_rounds, shape)
            lines.append(f"| {size} | none of one build: resampled from groups of {largest[0]} | | | | | {sim_text} | |")
            ticket_lines += [f"| {size} | {alert.text} | | | {cell} |" for alert, cell in zip(alerts, sim_cells, strict=True)]
            continue
        events, early = 0, 0
        scores: dict[str, list[float]] = {}
        seen_tickets = [0] * len(alerts)
        for members in groups:
            states: dict[str, list[bool]] = {}
            starts, _ = run(members, prompts, scores=scores, states=states, tried=tried)
            events += len(starts)
            early += sum(1 for s in starts if s < FIRST)
            for a, alert in enumerate(alerts):
                seen_tickets[a] += len(alert.tickets(list(states.values())))
        largest = (size, scores)
        rounds = len(prompts)
        member_hours = len(groups) * size * rounds * INTERVAL / 3600
        group_hours = len(groups) * rounds * INTERVAL / 3600
        processes_started = len(groups) * size
        arl = f"{member_hours / events:.1f}" if events else f"> {1 / _bound(0, member_hours):.1f} (none seen)"
        if events:
            arl += f" (bound > {1 / _bound(events, member_hours):.1f})"
        p_first = f"{early / processes_started:.3f} (bound {min(1.0, _bound(early, processes_started)):.3f})"
        every = [x for v in scores.values() for x in v]
        over = f"{sum(1 for x in every if x > shape.allowance) / len(every):.1%} of {len(every)}, {max(every):.2f}"
        sim_text, sim_cells = _resampled_cells(scores, size, alerts, resampled_rounds, shape)
        lines.append(f"| {size} | {len(groups)} | {member_hours:.1f} | {events} | {arl} | {p_first} | {sim_text} | "
                     f"{over} |")
        for a, alert in enumerate(alerts):
            per_month = seen_tickets[a] / group_hours * HOURS_PER_MONTH
            bound = _bound(seen_tickets[a], group_hours) * HOURS_PER_MONTH
            ticket_lines.append(f"| {size} | {alert.text} | {seen_tickets[a]} ({group_hours:.1f}) | {per_month:.2f} "
                                f"({bound:.1f}) | {sim_cells[a]} |")
    return [*lines, "", "Tickets the alert would have opened on them (one per group, however many members differ):", "",
            *ticket_lines]


def _resampled_cells(scores: dict[str, list[float]], size: int, alerts: Sequence[Alert], rounds: int,
                     shape: Shape) -> tuple[str, list[str]]:
    """The resampled null of groups of `size`: member-hours, decisions and run length; and per alert, tickets and false
    tickets per group per month (bootstrap bound)."""
    found, member_rounds, tickets, worst = resampled(scores, alerts, size, rounds=rounds, shape=shape)
    sim_hours = member_rounds * INTERVAL / 3600
    sim_group_hours = sim_hours / size
    rate = (found or 3.0) / sim_hours  # none seen: the rule of three
    text = f"{sim_hours:,.0f}, {found}, {'> ' if not found else ''}{1 / rate:,.0f}"
    cells = []
    for a in range(len(alerts)):
        sim = tickets[a] / sim_group_hours * HOURS_PER_MONTH
        sim_bound = max(worst[a] * 3600 / INTERVAL, _bound(tickets[a], sim_group_hours)) * HOURS_PER_MONTH
        cells.append(f"{tickets[a]}, {sim:.3f} ({sim_bound:.3f})")
    return text, cells


def _spread(found: list[int | None]) -> str:
    seen = sorted(f for f in found if f is not None)
    missed = len(found) - len(seen)
    if not seen:
        return "never"
    middle = statistics.median(seen + [math.inf] * missed)
    shown = "never" if math.isinf(middle) else f"{middle:g}"  # most seeds never reported
    return f"median {shown}, range {seen[0]}-{'never' if missed else seen[-1]}"


def power(changed: list[Process], null: list[Process], prompts: Sequence[int], alert: Alert, *,
          tried: Tried = Tried()) -> list[str]:
    by_name = {p.name.split("#")[0]: p for p in null if p.name.endswith("#0")}
    pools = {2: ["b11434-np1"], 4: ["b11434-np4-busy-a", "b11434-np4-busy-b", "b11434-np1"],
             16: sorted(by_name)[:15]}
    if tried.uniform is not None:  # a group deployed alike runs one build
        pools[16] = sorted(n for n, p in by_name.items() if p.build == "b11434")[:15]
    lines = ["| change | group of 2 | group of 4 (two busy -np 4) | group of 16 | within 10 answers (of 4) | group of "
             "4: answers until its ticket |", "|---|---|---|---|---|---|"]
    kinds: dict[str, list[Process]] = {}
    for member in changed:
        base = member.name.split("#")[0]
        kind = base.rsplit("-s", 1)[0] if "-eps" in base else base
        kinds.setdefault(kind, []).append(member)
    for kind, members in sorted(kinds.items()):
        cells, within, ticketed = [], "", "-"
        for size, names in pools.items():
            healthy = [by_name[n] for n in names if n in by_name]
            if len(healthy) < size - 1:
                cells.append("-")
                continue
            found: list[int | None] = []
            tickets: list[int | None] = []
            for m in members:
                states: dict[str, list[bool]] = {}
                found.append(run([*healthy, m], [p for p in prompts if p in m.answers], watched=m.name,
                                 states=states, tried=tried)[1])
                fired = alert.tickets([states.get(m.name, [])])
                tickets.append(fired[0] + 1 if fired else None)
            cells.append(f"{_spread(found)} ({len(found)} seeds)")
            if size == 4:
                within = f"{sum(1 for f in found if f is not None and f <= 10)}/{len(found)}"
                ticketed = _spread(tickets)
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {within} | {ticketed} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_power", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recording", type=Path, required=True, help="a recording of bench.peer_record (gzip JSONL)")
    parser.add_argument("--for", dest="holds", default="",
                        help=f"other `for:` durations of {TICKET} to count tickets at besides the shipped one, "
                             "comma-separated (20m,30m)")
    parser.add_argument("--rounds", type=int, default=10_000,
                        help="rounds of the resampled null (default 10,000): the rule of three bounds a rate seen "
                             "nowhere at 3 per the exposure, so a group of 16's bound of 0.1 tickets a month asks "
                             "for about 41,000")
    parser.add_argument("--floor", type=float,
                        help="score against this noise floor instead of the shipped core.evidence.FLOOR (nats a "
                             "token): how the floor was chosen, on a tuning recording")
    parser.add_argument("--uniform", nargs="?", const="shipped", metavar="FLOOR",
                        help="groups declared deployed alike (peer_uniform): the healthy are the members deployed as "
                             "the plain replica is (f16 KV cache, no drafting), dealt into groups of one build, held to "
                             f"the shipped core.evidence.UNIFORM_FLOOR ({UNIFORM_FLOOR:g}) or to FLOOR where given; the "
                             "q8_0 KV cache replica is then one that differs")
    parser.add_argument("--allowance", type=float, help="what each answer takes off the sum, in noise (the shipped "
                        f"{SHIPPED.allowance:g} unless given): how the test's shape was chosen, on a tuning recording")
    parser.add_argument("--cap", type=float, help=f"the most one answer adds, in noise (the shipped {SHIPPED.cap:g})")
    parser.add_argument("--threshold", type=float, help=f"the sum that decides (the shipped {SHIPPED.threshold:g})")
    args = parser.parse_args(argv)
    from specwatch.durations import parse_duration

    if args.rounds < 100:
        parser.error(f"--rounds {args.rounds}: the resampled null needs 100 rounds at least (10,000 by default)")
    floor = FLOOR if args.floor is None else args.floor
    if not 0.0 < floor < 10.0:
        parser.error(f"--floor {args.floor}: a noise floor is a positive number of nats a token, under 10")
    try:
        uniform = UNIFORM_FLOOR if args.uniform == "shipped" else None if args.uniform is None else float(args.uniform)
    except ValueError:
        parser.error(f"--uniform {args.uniform}: a noise floor is a number of nats a token (or none: the shipped one)")
    if uniform is not None and not 0.0 < uniform < 10.0:
        parser.error(f"--uniform {args.uniform}: a noise floor is a positive number of nats a token, under 10")
    tried = {"allowance": args.allowance, "cap": args.cap, "threshold": args.threshold}
    shape = replace(SHIPPED, **{name: value for name, value in tried.items() if value is not None})
    if not 0.0 < shape.allowance < shape.cap:
        parser.error(f"--allowance {shape.allowance:g}, --cap {shape.cap:g}: the allowance is positive and under the "
                     "cap, or no answer ever adds to the sum")
    if shape.threshold <= 0.0:
        parser.error(f"--threshold {shape.threshold:g}: the sum that decides is positive")

    try:
        alerts = [Alert.shipped(), *(Alert.shipped(parse_duration(h)) for h in args.holds.split(",") if h.strip())]
    except (OSError, ValueError, KeyError, StopIteration) as err:
        parser.error(f"cannot read {TICKET}'s windows: {err}")
    try:
        run_line, headers, answers = read(args.recording)
    except (OSError, EOFError, ValueError, KeyError) as err:
        parser.error(f"cannot read the recording {args.recording}: {err}")
    null = processes(headers, answers, "null")
    changed = processes(headers, answers, "changed")
    if uniform is not None:
        # Declared alike: the healthy are those deployed as the plain replica is; one of its build deployed otherwise
        # (a q8_0 KV cache) is what such a group reports.
        changed += [p for p in null if not p.alike and p.build == "b11434" and "draft" not in p.name
                    and p.name.endswith("#0")]
        null = [p for p in null if p.alike]
    if not null:
        parser.error(f"{args.recording} has no healthy member: record some with bench.peer_record --members null")
    order = sorted({p for m in null for p in m.answers})
    print(f"{args.recording}: {len(null)} healthy processes, {len(changed)} changed members, prompts "
          f"{run_line.get('prompts')} (changed {run_line.get('changed_prompts')}), seeds {run_line.get('seeds')}, "
          f"noise floor {floor}{'' if args.floor is None else ' (--floor)'}"
          f"{'' if uniform is None else f', deployed alike: floor {uniform:g} while one build answers'}, allowance "
          f"{shape.allowance:g}, cap {shape.cap:g}, threshold {shape.threshold:g}{'' if shape == SHIPPED else ' (tried)'}")
    test = Tried(floor, uniform, shape)
    print("\nFalse decisions of healthy groups (each answer counted once):\n")
    print("\n".join(null_rates(null, order, alerts, args.rounds, tried=test)))
    if changed:
        print("\nAnswers until a changed member is reported (its answers, in order), and until its ticket fires "
              f"({alerts[0].text}):\n")
        asked = sorted({p for m in changed for p in m.answers})
        print("\n".join(power(changed, null, asked, alerts[0], tried=test)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
