"""Peer groups compared as their answers come in: per group, only the groups that changed, each at most so often; each
round counted once its members have all had their turn (core.peers.Comparing keeps the test)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import structlog

from ..core.evidence import MISSED
from ..core.peers import OPT_OUT, Comparing, Comparison, Peer, Reference, Standing, asked, member_name
from ..core.state import Fleet, ModelState
from ..probe.llama import Props
from ..probe.logprobs import Logprobs
from .cadence import round_of

log = structlog.get_logger("specwatch")
SECONDS_PER_MEMBER = 0.04
"""A group is compared at most once per this many seconds per member (a group of 250 every 10 s; larger ones every
poll_interval): the CPU of comparing stays bounded however often its members' answers come in, and no answer is left
out, only batched. A standing changes only when a round is counted, once a canary_interval: at 0.01, comparing groups
of 250 that counted nothing took a tenth of the daemon's CPU at 1,000 servers (bench.benchmark's profile)."""

Member = tuple[str, str]
"""(server name, model key)."""


class PeerBoard:
    """Which group each watched model is in, which groups changed since compared, and the comparing itself."""

    def __init__(self, fleet: Fleet, monotonic: Callable[[], float], clock: Callable[[], float], *, max_gap: float,
                 interval: float, references: Mapping[str, Reference] | None = None,
                 uniform: Collection[str] = ()) -> None:
        self._fleet = fleet
        self._monotonic = monotonic
        self._clock = clock
        self.max_gap = max_gap
        self.interval = interval
        """The canary_interval: one peer probe round per interval."""
        self._tests: dict[str, Comparing[str]] = {}
        """Each group's test, across rounds."""
        self.references: Mapping[str, Reference] = references or {}
        """The groups held to a reference file, by group."""
        self.uniform = frozenset(uniform)
        """The groups declared deployed alike (peer_uniform)."""
        self._groups: dict[str, set[Member]] = {}
        self._by_server: dict[str, dict[str, str]] = {}
        """Each server's models by key, with their group."""
        self._dirty: set[str] = set()
        self._reshaped: set[str] = set()
        """Groups whose members changed other than by answering (joined, left, another file, loaded or not): judged
        afresh at their next comparison, whether or not a round is counted."""
        self._compared_at: dict[str, float] = {}
        self._closed: int | None = None
        """The last round seen closed."""
        self._inputs: dict[Member, _Brought] = {}
        """What each member's last comparison was made of: a poll that changes none of it compares nothing again."""
        self._unpolled: set[str] = set()
        """Servers not polled yet since they were added: until each has answered or failed once, a group may be a part
        of itself (two odd replicas of five, with no majority), and a fingerprint counts at once."""
        self._waiting: set[str] = set()
        """Servers whose model was alone in its group until another joined: their peer probe is due at once."""
        self.configured_only = False
        """Sharded: only groups set in the config, which a shard watches whole (shard.shard_key); a group by model
        name may be split over shards, where a part would hold a good replica against a bad one. Prometheus compares
        those by fingerprint across shards (alerts/specwatch.rules.yml)."""

    def configure(self, *, max_gap: float, interval: float, references: Mapping[str, Reference],
                  uniform: Collection[str] = ()) -> None:
        """Reloaded settings: every group is compared again under them (another interval, another reference, or a
        group declared deployed alike or no longer, starts a group's rounds anew)."""
        uniform = frozenset(uniform)
        for group in list(self._tests):
            if (interval != self.interval or self.references.get(group) is not references.get(group)
                    or (group in uniform) != (group in self.uniform)):
                del self._tests[group]
        self.max_gap, self.interval, self.references, self.uniform = max_gap, interval, references, uniform
        self._dirty.update(self._groups)
        self._reshaped.update(self._groups)
        self._compared_at.clear()
        self._inputs.clear()

    def expect(self, names: set[str]) -> None:
        """Servers just added: no group is compared before each that may join one was polled once."""
        for name in names:
            state = self._fleet.get(name)
            if state is not None and state.config.peer_group != OPT_OUT:
                self._unpolled.add(name)

    def touch(self, name: str) -> None:
        """The server changed (a poll, a canary, a reload): place its models in their groups, mark those for comparing."""
        state = self._fleet.get(name)
        if state is None or state.poll_success is not None:
            self._unpolled.discard(name)
        before = self._by_server.get(name, {})
        now: dict[str, str] = {}
        if state is not None:
            for key, model in state.models.items():
                # A plain server's group comes from what it reports: while it does not answer it stays where it was.
                group = state.peer_group(key) if model.poll is not None or state.router else before.get(key)
                if self.configured_only and not state.config.peer_group:
                    group = None
                if group is not None:
                    now[key] = group
        gone: dict[Member, Standing | None] = {}
        for key, group in before.items():
            if now.get(key) != group:
                self._leave(group, (name, key))
                self._inputs.pop((name, key), None)
                self._forget(group, (name, key))
                gone[(name, key)] = None
        for key, group in now.items():
            member = (name, key)
            members = self._groups.setdefault(group, set())
            if member not in members and len(members) == 1:
                self._waiting |= {server for server, _ in members}  # it had no peer to be asked for until now
            members.add(member)
            model = state.models.get(key) if state is not None else None
            inputs = _Brought.of(group, model)
            before_inputs = self._inputs.get(member)
            if not inputs.same(before_inputs):
                if before_inputs is None or not inputs.same_but_answers(before_inputs):
                    self._reshaped.add(group)
                self._inputs[member] = inputs
                self._dirty.add(group)
        if now:
            self._by_server[name] = now
        else:
            self._by_server.pop(name, None)
        if gone:
            self._fleet.record_peers(gone)

    def waiting(self) -> set[str]:
        """The servers whose model just got its first peer (and forgets them): their peer probe is due now."""
        waiting, self._waiting = self._waiting, set()
        return waiting

    def compared(self, name: str, key: str) -> bool:
        """Whether a watched model has a peer to be compared with: its group has two members or more."""
        group = self._by_server.get(name, {}).get(key)
        return group is not None and len(self._groups.get(group, ())) >= 2

    def forget(self, names: set[str]) -> None:
        """Servers a reload removed: they leave their groups."""
        self._unpolled -= names
        for name in names:
            for key, group in self._by_server.pop(name, {}).items():
                self._leave(group, (name, key))
                self._inputs.pop((name, key), None)
                self._forget(group, (name, key))

    def prompt_for(self, name: str, key: str, question: int) -> int:
        """The pool prompt a member is asked in round `question`: its group's reference's prompts only, if it has one."""
        group = self._by_server.get(name, {}).get(key)
        reference = self.references.get(group) if group is not None else None
        return asked(question, reference)

    def _forget(self, group: str, member: Member) -> None:
        test = self._tests.get(group)
        if test is not None:
            test.forget(member_name(*member))

    def _leave(self, group: str, member: Member) -> None:
        members = self._groups.get(group)
        if members is None:
            return
        members.discard(member)
        self._dirty.add(group)
        self._reshaped.add(group)
        if not members:
            del self._groups[group]
            self._compared_at.pop(group, None)
            self._tests.pop(group, None)
            self._dirty.discard(group)
            self._reshaped.discard(group)

    def settle(self) -> None:
        """Compare every group that changed (or whose round just closed) and was not compared too recently."""
        closed = round_of(self._clock(), self.interval) - 1
        if closed != self._closed:
            self._closed = closed  # a round is over: counted whether or not anything changed since
            self._dirty.update(self._groups)
        if not self._dirty or self._unpolled:
            return
        now = self._monotonic()
        for group in list(self._dirty):
            members = self._groups.get(group, set())
            gap = min(self.max_gap, SECONDS_PER_MEMBER * len(members))
            if now - self._compared_at.get(group, float("-inf")) >= gap:
                self._dirty.discard(group)
                self._compared_at[group] = now
                self._compare(group, members)

    def _compare(self, group: str, members: set[Member]) -> None:
        test = self._tests.get(group)
        if test is None:
            test = self._tests[group] = Comparing(self.references.get(group), uniform=group in self.uniform)
        peers: dict[str, Peer] = {}
        names: dict[str, Member] = {}
        before: dict[Member, Standing | None] = {}
        kept: dict[Member, Standing | None] = {}
        for member in members:
            server = self._fleet.get(member[0])
            model = server.models.get(member[1]) if server is not None else None
            peer = model.peer if model is not None else None
            if model is None or peer is None:
                before[member] = model.peers if model is not None else None
                if (server is not None and model is not None and model.peers is not None and model.peers.group == group
                        and self._unreachable(server.poll_success, server.last_poll_success_timestamp)):
                    # A poll that failed (a busy server's timeout) says nothing of its answers: its standing and its
                    # evidence hold until it has missed the rounds a silent member may, as MISSED says of the probe.
                    kept[member] = model.peers
                continue
            name = member_name(*member)
            peers[name], names[name], before[member] = peer, member, model.peers
            if model.peers is None or model.peers.group != group:
                test.forget(name)  # a new process, or new to the group: its evidence starts afresh
        # A round counts once the next one is over: every member has had its turn at it, slow answers included.
        counted = test.count(peers, before=round_of(self._clock(), self.interval) - 1)
        if not counted and group not in self._reshaped:
            return  # answers came in, none counted yet, nobody joined or changed: every standing is as it was
        self._reshaped.discard(group)
        judgement = test.judge(peers)
        # A group of one compares nothing: it has no standing, as an opted-out server has none.
        standings: dict[Member, Standing | None] = {m: kept.get(m) for m in members}
        if len(peers) >= 2:
            agreement, split = judgement.agreement, judgement.split  # once: each reads every member
            standings.update({names[n]: Standing(group, c, agreement, split)
                              for n, c in judgement.members.items()})
        for member, standing in standings.items():
            _log_change(member, before.get(member), standing)
        self._fleet.record_peers(standings)

    def _unreachable(self, polled: bool | None, last_success: float | None) -> bool:
        """Whether a server's polls fail, and for less than the MISSED rounds after which a silent member is unknown."""
        return polled is False and last_success is not None and self._clock() - last_success < MISSED * self.interval


@dataclass(frozen=True, eq=False)
class _Brought:
    """What a member brings to its group's comparison: a poll that changes none of it compares nothing again."""

    group: str
    loaded: bool | None
    props: Props | None
    meta_for: tuple[object, ...] | None
    answers: Mapping[int, Logprobs] | None
    spreads: tuple[float, ...] | None

    @classmethod
    def of(cls, group: str, model: ModelState | None) -> _Brought:
        if model is None:
            return cls(group, None, None, None, None, None)
        return cls(group, model.loaded, model.poll.props if model.poll is not None else None, model.meta_for,
                   model.peer_answers.answers, model.peer_answers.spreads)

    def same_but_answers(self, other: _Brought) -> bool:
        """Alike but for the answers and the noise: what changes a standing only once a round is counted."""
        return (self.group, self.loaded, self.props, self.meta_for) == (other.group, other.loaded, other.props, other.meta_for)

    def same(self, other: _Brought | None) -> bool:
        """Alike in what is compared by value; the answers and the noise by identity (each answer makes new ones)."""
        return (other is not None and (self.group, self.loaded, self.props, self.meta_for)
                == (other.group, other.loaded, other.props, other.meta_for)
                and self.answers is other.answers and self.spreads is other.spreads)


def _shown(standing: Standing | None) -> tuple[bool | None, str | None]:
    comparison = standing.comparison if standing is not None else Comparison[str](None)
    return comparison.agreement, comparison.kind if comparison.agreement is False else None


def _log_change(member: Member, old: Standing | None, new: Standing | None) -> None:
    """One line when a model's agreement (or the kind of its disagreement) changes, not one per comparison."""
    if _shown(old) == _shown(new) or new is None or new.comparison.agreement is None:
        return
    if new.comparison.agreement and _shown(old)[0] is not False:
        return  # a first comparison that agrees is no news
    where = {"server": member[0], **({"model": member[1]} if member[1] else {}), "peer_group": new.group}
    comparison = new.comparison
    if comparison.agreement is False:
        log.warning("peers_disagree", kind=comparison.kind, held_against=list(comparison.held_against),
                    evidence=round(comparison.evidence.share, 3), detail=comparison.detail, split=new.split, **where)
    else:
        log.info("peers_agree", previous=_shown(old)[1], **where)
