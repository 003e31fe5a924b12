"""`specwatch check URL URL ...`: every server checked, then the models that report one name compared as replicas with
the daemon's test (core.peers.Comparing), round after round of the peer probe until the test settles, within a bound."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.evidence import Cusum
from ..core.peers import Comparing, Judgement, Peer, Reference, Standing, asked, member_name
from ..core.report import PeersEntry, peers_entry
from ..core.runner import Runner
from ..core.verdict import Decision, Disagreement, Verdict, among_peers, worst
from ..endpoints import Endpoint
from ..probe.http.client import Client, new_client
from ..probe.http.fetch import Fetcher
from ..probe.peerprobe import COPIES
from ..settings.targets import ServerConfig
from .check import CHECKED, CheckReport, checked, render_text
from .options import CHECK, Spelling

ROUNDS = 16
"""Peer-probe rounds at most: the test decides within them, or the check says undecided (exit 2, never clean)."""
SETTLED = 6
"""Rounds a member must have answered, its evidence back at nothing, to be told apart as agreeing."""


@dataclass
class ChecksReport:
    """`specwatch check URL URL ...`: each server's check, and the servers compared with their peers among them."""

    verdict: str = Verdict.UNCHECKED.value
    """The fill-in verdict: the worst of the servers checked."""
    exit_code: int = Verdict.UNCHECKED.exit_code
    summary: str = ""
    disagreeing: list[str] = field(default_factory=list)
    """The servers (a router's model after a slash) that differ from their peer group: exit 1."""
    undecided: list[str] = field(default_factory=list)
    """The servers the test could not decide on within its bound: exit 2 (never clean), unless one differs."""
    peers: dict[str, PeersEntry] = field(default_factory=dict)
    """Each compared server's standing; a server alone in its group (by model name) is compared with nothing."""
    servers: list[CheckReport] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Member:
    runner: Runner
    server: ServerConfig
    key: str

    @property
    def peer(self) -> Peer | None:
        state = self.runner.fleet.get(CHECKED)
        model = state.models.get(self.key) if state is not None else None
        return model.peer if model is not None else None

    @property
    def copies(self) -> int:
        state = self.runner.fleet.get(CHECKED)
        model = state.models.get(self.key) if state is not None else None
        slots = model.poll.props.total_slots if model is not None and model.poll is not None else None
        return COPIES if slots is None or slots > 1 else 1


async def run_checks(servers: list[ServerConfig], *, endpoints: list[Endpoint], tokens: int, timeout: float,
                     max_bytes: int = 4 * 1024 * 1024, connect: Callable[[], Client] = new_client,
                     load: bool = False, spelling: Spelling = CHECK, reference: Reference | None = None,
                     uniform: bool = False) -> ChecksReport:
    """Check every server, then compare the models that report one name, as the daemon compares a peer group (and each
    of them with `reference`, where given: a model alone is compared then too; as a peer_uniform group where declared
    `uniform`)."""
    reports: list[CheckReport] = []
    groups: dict[str, dict[str, _Member]] = {}
    for server in servers:
        report, runner = await checked(server, endpoints=endpoints, tokens=tokens, timeout=timeout, max_bytes=max_bytes,
                                       connect=connect, load=load, spelling=spelling, meta=True)
        reports.append(report)
        state = runner.fleet.get(CHECKED) if runner is not None else None
        for key, model in (state.models.items() if state is not None and runner is not None else ()):
            group = state.peer_group(key)
            if model.peer is not None and group is not None:
                config = server.model_copy(update={"name": CHECKED})
                groups.setdefault(group, {})[member_name(server.url, key)] = _Member(runner, config, key)
    compared = {group: members for group, members in groups.items() if len(members) >= (1 if reference else 2)}
    standings: dict[str, Standing] = {}
    unsettled: list[str] = []
    if compared:
        async with connect() as http:
            fetcher = Fetcher(http, max_bytes)
            for group, members in compared.items():
                judgement = await _decided(members, fetcher, reference, uniform)
                agreement, split = judgement.agreement, judgement.split  # once: each reads every member
                standings |= {n: Standing(group, c, agreement, split)
                              for n, c in judgement.members.items()}
                unsettled += [n for n, c in judgement.members.items() if not _settled(c.agreement, c.evidence)]
    report = ChecksReport(servers=reports, peers={n: peers_entry(s) for n, s in standings.items()})
    disagreements = [Disagreement(n, s.comparison.kind or "", s.comparison.held_against, s.comparison.detail)
                     for n, s in standings.items() if s.comparison.agreement is False]
    report.disagreeing = [d.name for d in disagreements]
    report.undecided = [] if disagreements else unsettled
    name, decision = worst((r.url, Decision(Verdict(r.verdict), r.summary)) for r in reports)
    decision = Decision(decision.verdict, f"{name}: {decision.summary} (worst of {len(reports)} checked)")
    decision, exit_code = among_peers(decision, disagreements, report.undecided, referenced=reference is not None)
    decision.onto(report).exit_code = exit_code  # a replica that differs makes it 1, an undecided one 2
    return report


async def _decided(members: dict[str, _Member], fetcher: Fetcher, reference: Reference | None,
                   uniform: bool = False) -> Judgement[str]:
    """Ask the group's members the peer probe, one prompt a round (one the reference recorded, if held to one), until
    the test settles each of them, or ROUNDS."""
    test: Comparing[str] = Comparing(reference, uniform=uniform)
    judgement: Judgement[str] = Judgement({})
    for question in range(ROUNDS):
        questions = [(question, asked(question, reference))]
        for member in members.values():
            member.runner.fetcher = fetcher  # the check's own client is closed by now
        await asyncio.gather(*(member.runner.ask_peers(member.server, member.key, questions, copies=member.copies)
                               for member in members.values() if member.peer is not None))
        peers = {name: peer for name, member in members.items() if (peer := member.peer) is not None}
        test.count(peers, before=question + 1)
        judgement = test.judge(peers)
        if all(_settled(c.agreement, c.evidence) for c in judgement.members.values()):
            break
    return judgement


def _settled(agreement: bool | None, evidence: Cusum) -> bool:
    """The test has decided: the member differs, or it answered SETTLED rounds and its evidence is back at nothing."""
    return agreement is False or (agreement is True and evidence.answers >= SETTLED and evidence.total == 0.0)


def render_checks(report: ChecksReport) -> str:
    lines = [headline(report)]
    for one in report.servers:
        lines += ["", render_text(one)]
    if report.peers:
        lines.append("")
        for name, entry in report.peers.items():
            said = {True: "agrees", False: "DIFFERS", None: "nothing to compare"}[entry.agreement]
            if entry.agreement and name in report.undecided:
                said = "UNDECIDED"
            lines.append(f"peers {entry.group}: {name} {said}" + (f" ({entry.kind})" if entry.kind else "")
                         + (f": {entry.detail}" if entry.detail else ""))
    return "\n".join(lines)


def headline(report: ChecksReport) -> str:
    """The first line: the refusal first, when replicas differ or could not be told apart; else the fill-in verdict."""
    if report.disagreeing:
        return f"REFUSED (replicas differ; fill-in verdict {report.verdict}): {report.summary}"
    if report.undecided:
        return f"UNDECIDED (replicas not told apart; fill-in verdict {report.verdict}): {report.summary}"
    return f"{report.verdict.upper()}: {report.summary}"
