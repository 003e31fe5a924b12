"""`specwatch check`: a one-shot verdict on whether a server's logprobs can be trusted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any

import httpx

from exporter import probes
from exporter.fetch import Fetcher, new_client
from exporter.reasons import ProbeFailure
from exporter.settings import Endpoint, ServerConfig

ROUNDS = 2


class Exit(IntEnum):
    CLEAN = 0
    FAKE = 1
    UNCHECKED = 2


@dataclass
class EndpointReport:
    endpoint: str
    tokens: int | None = None
    placeholder_tokens: int | None = None
    placeholder_ratio: float | None = None
    mean_logprob: float | None = None
    draft_n: int | None = None
    error: str | None = None


@dataclass
class CheckReport:
    url: str
    verdict: str
    exit_code: int
    summary: str
    speculation_slots: bool | None = None
    speculation_props: bool | None = None
    build: str | None = None
    model: str | None = None
    endpoints: list[EndpointReport] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def decide(report: CheckReport) -> CheckReport:
    """Fill in verdict, exit code and summary from what the probes found."""
    checked = [e for e in report.endpoints if e.error is None]
    failed = [e for e in report.endpoints if e.error is not None]
    faked = [e for e in checked if e.placeholder_tokens]
    drafted = any(e.draft_n for e in checked)

    def done(verdict: str, code: Exit, summary: str) -> CheckReport:
        report.verdict, report.exit_code, report.summary = verdict, int(code), summary
        return report

    if faked:
        worst = ", ".join(f"{e.endpoint} {e.placeholder_tokens}/{(e.tokens or 1) - 1}" for e in faked)
        summary = f"the server serves fill-in logprobs (placeholders/tokens after the first: {worst}); do not score"
        return done("fill_ins", Exit.FAKE, summary)
    if failed:
        why = "; ".join(f"{e.endpoint}: {e.error}" for e in failed)
        return done("unchecked", Exit.UNCHECKED, f"could not check every endpoint: {why}")
    if report.speculation_slots and not drafted:
        return done(
            "unproven",
            Exit.FAKE,
            "/slots says the server speculates, but the canary never drafted (timings.draft_n), "
            "so its logprobs are not proven real; do not score",
        )
    if drafted:
        return done("clean", Exit.CLEAN, "the server drafted and still returned real logprobs with alternatives")
    return done("clean", Exit.CLEAN, "logprobs are real: every token carries its alternatives")


async def run_check(
    server: ServerConfig,
    *,
    endpoints: list[Endpoint],
    tokens: int,
    timeout: float,
    max_bytes: int = 4 * 1024 * 1024,
    client: httpx.AsyncClient | None = None,
) -> CheckReport:
    report = CheckReport(url=server.url, verdict="", exit_code=0, summary="")
    async with client or new_client(4) as http:
        fetcher = Fetcher(http, max_bytes)
        try:
            polled = await probes.poll(fetcher, server, timeout=timeout)
        except ProbeFailure as failure:
            report.verdict, report.exit_code = "unchecked", int(Exit.UNCHECKED)
            report.summary = f"could not check {server.url}: {failure}"
            return report
        report.speculation_props = polled.props.speculative
        report.speculation_slots = polled.slots.speculative if polled.slots else None
        report.build, report.model = polled.props.build, polled.props.model
        for attempt in range(ROUNDS):
            report.endpoints = [await _probe(fetcher, server, e, tokens=tokens, timeout=timeout) for e in endpoints]
            nothing_drafted = not any(e.draft_n or e.placeholder_tokens for e in report.endpoints)
            # n-gram speculation learns from earlier requests: a server that speculates but has not
            # drafted yet often drafts on a second round once it has seen the canary text.
            if not (report.speculation_slots and nothing_drafted) or attempt + 1 == ROUNDS:
                break
    return decide(report)


async def _probe(fetcher: Fetcher, server: ServerConfig, endpoint: Endpoint, *, tokens: int, timeout: float) -> EndpointReport:
    entry = EndpointReport(endpoint=endpoint.value)
    try:
        verdict = await probes.canary(fetcher, server, endpoint, tokens=tokens, timeout=timeout)
    except ProbeFailure as failure:
        entry.error = str(failure)
    else:
        entry.tokens, entry.placeholder_tokens = verdict.tokens, verdict.placeholders
        entry.placeholder_ratio = round(verdict.placeholder_ratio, 4)
        entry.mean_logprob = None if verdict.mean_logprob is None else round(verdict.mean_logprob, 4)
        entry.draft_n = verdict.draft_n
    return entry


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
                f"  {e.endpoint:<26} fill-ins {e.placeholder_tokens}/{(e.tokens or 1) - 1} after the first"
                f"  mean logprob {mean}  drafted {drafted}"
            )
    return "\n".join(lines)
