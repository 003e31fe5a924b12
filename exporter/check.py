"""`specwatch check`: a one-shot verdict on whether a server's logprobs can be trusted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from exporter.probe import probes
from exporter.probe.canary import Endpoint, Tally
from exporter.probe.fetch import Fetcher, new_client
from exporter.reasons import ProbeFailure
from exporter.settings import ServerConfig
from exporter.verdict import EndpointEvidence, Evidence, Verdict, decide

ROUNDS = 2


@dataclass
class EndpointReport:
    endpoint: str
    tokens: int | None = None
    fill_ins: int | None = None
    fill_in_ratio: float | None = None
    mean_logprob: float | None = None
    draft_n: int | None = None
    error: str | None = None


@dataclass
class CheckReport:
    url: str
    verdict: str = Verdict.UNCHECKED.value
    exit_code: int = Verdict.UNCHECKED.exit_code
    summary: str = ""
    speculation_slots: bool | None = None
    speculation_props: bool | None = None
    build: str | None = None
    model: str | None = None
    endpoints: list[EndpointReport] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _report_entry(endpoint: Endpoint, tally: Tally | None, error: str | None) -> EndpointReport:
    entry = EndpointReport(endpoint=endpoint.value, error=error)
    if tally is not None:
        entry.tokens, entry.fill_ins, entry.draft_n = tally.tokens, tally.fill_ins, tally.draft_n
        entry.fill_in_ratio = round(tally.fill_in_ratio, 4)
        entry.mean_logprob = None if tally.mean_logprob is None else round(tally.mean_logprob, 4)
    return entry


async def run_check(
    server: ServerConfig,
    *,
    endpoints: list[Endpoint],
    tokens: int,
    timeout: float,
    max_bytes: int = 4 * 1024 * 1024,
    client: httpx.AsyncClient | None = None,
) -> CheckReport:
    report = CheckReport(url=server.url)
    async with client or new_client() as http:
        fetcher = Fetcher(http, max_bytes)
        try:
            polled = await probes.poll(fetcher, server, timeout=timeout)
        except ProbeFailure as failure:
            return _decided(report, Evidence(poll_failure=str(failure)))
        report.speculation_props = polled.props.speculative
        report.speculation_slots = polled.slots.speculative if polled.slots else None
        report.build, report.model = polled.props.build, polled.props.model
        evidence: list[EndpointEvidence] = []
        for attempt in range(ROUNDS):
            evidence = [await _probe(fetcher, server, e, tokens=tokens, timeout=timeout) for e in endpoints]
            nothing_drafted = not any(e.tally is not None and e.tally.drafted for e in evidence)
            # n-gram speculation learns from earlier requests: a server that speculates but has not
            # drafted yet often drafts on a second round once it has seen the canary text.
            if not (report.speculation_slots and nothing_drafted) or attempt + 1 == ROUNDS:
                break
        report.endpoints = [_report_entry(Endpoint(e.endpoint), e.tally, e.failure) for e in evidence]
        return _decided(report, Evidence(
            poll_failure=None, speculation_slots=report.speculation_slots, speculation_props=report.speculation_props,
            endpoints=evidence,
        ))


def _decided(report: CheckReport, evidence: Evidence) -> CheckReport:
    decision = decide(evidence)
    report.verdict, report.exit_code, report.summary = decision.verdict.value, decision.verdict.exit_code, decision.summary
    return report


async def _probe(fetcher: Fetcher, server: ServerConfig, endpoint: Endpoint, *, tokens: int, timeout: float) -> EndpointEvidence:
    try:
        tally = await probes.canary(fetcher, server, endpoint, tokens=tokens, timeout=timeout)
    except ProbeFailure as failure:
        return EndpointEvidence(endpoint.value, None, str(failure))
    return EndpointEvidence(endpoint.value, tally)


def render_text(report: CheckReport) -> str:
    def known(flag: bool | None) -> str:
        return "unknown" if flag is None else ("on" if flag else "off")

    lines = [
        f"{report.verdict.upper()}: {report.summary}",
        f"server {report.url}  build={report.build or '?'}  model={report.model or '?'}",
        f"speculation: /slots {known(report.speculation_slots)}, /props {known(report.speculation_props)}",
    ]
    for e in report.endpoints:
        if e.error:
            lines.append(f"  {e.endpoint:<26} error: {e.error}")
        else:
            mean = "n/a" if e.mean_logprob is None else f"{e.mean_logprob:.4f}"
            drafted = "-" if e.draft_n is None else str(e.draft_n)
            lines.append(
                f"  {e.endpoint:<26} fill-ins {e.fill_ins}/{(e.tokens or 1) - 1} after the first"
                f"  mean logprob {mean}  drafted {drafted}"
            )
    return "\n".join(lines)
