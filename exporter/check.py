"""`specwatch check`: a one-shot verdict on whether a server's logprobs (every loaded model's, on a router) can be trusted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from exporter.probe import probes
from exporter.probe.canary import Endpoint, Tally
from exporter.probe.fetch import Fetcher, new_client
from exporter.probe.probes import ModelPoll
from exporter.reasons import ProbeFailure
from exporter.settings.schema import ServerConfig
from exporter.verdict import SEVERITY, Decision, EndpointEvidence, Evidence, Verdict, decide

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
class ModelReport:
    """The verdict on one model of a router."""

    model: str
    status: str
    verdict: str = Verdict.UNCHECKED.value
    summary: str = ""
    speculation_slots: bool | None = None
    speculation_props: bool | None = None
    build: str | None = None
    endpoints: list[EndpointReport] = field(default_factory=list)


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
    router: bool = False
    models: list[ModelReport] = field(default_factory=list)
    """A router's models, each with its own verdict; `verdict` is then the worst of the models checked."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _report_entry(endpoint: str, tally: Tally | None, error: str | None) -> EndpointReport:
    entry = EndpointReport(endpoint=endpoint, error=error)
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
    load: bool = False,
) -> CheckReport:
    """Poll the server and canary every loaded model (the configured one with `server.model`).

    Nothing is ever loaded unless `load` asks for the configured model: a check must not change what it checks.
    """
    report = CheckReport(url=server.url)
    async with client or new_client() as http:
        fetcher = Fetcher(http, max_bytes)
        try:
            polled = await probes.poll(fetcher, server, timeout=timeout)
            if load and server.model and polled.router and not polled.models[server.model].loaded:
                await probes.load(fetcher, server, server.model, timeout=timeout)
                polled = await probes.poll(fetcher, server, timeout=timeout)
        except ProbeFailure as failure:
            return _decided(report, decide(Evidence(poll_failure=str(failure))))
        checked = [await _check_model(fetcher, server, key, found, endpoints=endpoints, tokens=tokens, timeout=timeout)
                   for key, found in polled.models.items()]
    if not polled.router:
        ((only, decision),) = checked
        report.speculation_slots, report.speculation_props = only.speculation_slots, only.speculation_props
        report.build, report.endpoints = only.build, only.endpoints
        report.model = server.model or only.model or None
        return _decided(report, decision)
    report.router, report.models, report.model = True, [m for m, _ in checked], server.model
    # A router's verdict is its worst loaded model's: an eval may be sent to any of them.
    counted = checked if server.model else [(m, d) for m, d in checked if m.status == "loaded"]
    if not counted:
        return _decided(report, decide(Evidence(poll_failure="the router has no model loaded, and specwatch loads none")))
    worst, decision = min(counted, key=lambda pair: SEVERITY.index(pair[1].verdict))
    if len(checked) > 1:
        names = ", ".join(f"{m.model}: {m.verdict}" for m, _ in checked)
        decision = Decision(decision.verdict, f"{decision.summary} (model {worst.model}; models: {names})")
    return _decided(report, decision)


def _decided(report: CheckReport, decision: Decision) -> CheckReport:
    report.verdict, report.exit_code, report.summary = decision.verdict.value, decision.verdict.exit_code, decision.summary
    return report


async def _check_model(
    fetcher: Fetcher, server: ServerConfig, key: str, found: ModelPoll, *, endpoints: list[Endpoint], tokens: int,
    timeout: float,
) -> tuple[ModelReport, Decision]:
    report = ModelReport(model=key or (found.result.props.model if found.result else ""), status=found.status)
    if not found.loaded:
        evidence = Evidence(poll_failure=None, model_status=found.status)
    elif found.result is None:
        evidence = Evidence(poll_failure=str(found.failure) if found.failure else "no answer")
    else:
        props, slots = found.result.props, found.result.slots
        report.speculation_props, report.speculation_slots = props.speculative, slots.speculative if slots else None
        report.build = props.build
        evidence = Evidence(poll_failure=None, speculation_slots=report.speculation_slots,
                            speculation_props=report.speculation_props)
        for _ in range(ROUNDS):
            tested = [await _probe(fetcher, server, e, key, tokens=tokens, timeout=timeout) for e in endpoints]
            evidence = Evidence(poll_failure=None, speculation_slots=report.speculation_slots,
                                speculation_props=report.speculation_props, endpoints=tested)
            # n-gram speculation learns from earlier requests: a server that speculates but has not drafted yet
            # often drafts on a second round once it has seen the canary text.
            if decide(evidence).verdict is not Verdict.UNPROVEN:
                break
        report.endpoints = [_report_entry(e.endpoint, e.tally, e.failure) for e in evidence.endpoints]
    decision = decide(evidence)
    report.verdict, report.summary = decision.verdict.value, decision.summary
    return report, decision


async def _probe(
    fetcher: Fetcher, server: ServerConfig, endpoint: Endpoint, key: str, *, tokens: int, timeout: float
) -> EndpointEvidence:
    try:
        tally = await probes.canary(fetcher, server, endpoint, tokens=tokens, timeout=timeout, model=key or None)
    except ProbeFailure as failure:
        return EndpointEvidence(endpoint.value, None, str(failure))
    return EndpointEvidence(endpoint.value, tally)


def _endpoint_lines(entries: list[EndpointReport], indent: str) -> list[str]:
    lines = []
    for e in entries:
        if e.error:
            lines.append(f"{indent}{e.endpoint:<26} error: {e.error}")
        else:
            mean = "n/a" if e.mean_logprob is None else f"{e.mean_logprob:.4f}"
            drafted = "-" if e.draft_n is None else str(e.draft_n)
            lines.append(
                f"{indent}{e.endpoint:<26} fill-ins {e.fill_ins}/{(e.tokens or 1) - 1} after the first"
                f"  mean logprob {mean}  drafted {drafted}"
            )
    return lines


def _known(flag: bool | None) -> str:
    return "unknown" if flag is None else ("on" if flag else "off")


def render_text(report: CheckReport) -> str:
    lines = [f"{report.verdict.upper()}: {report.summary}"]
    if not report.router:
        lines += [
            f"server {report.url}  build={report.build or '?'}  model={report.model or '?'}",
            f"speculation: /slots {_known(report.speculation_slots)}, /props {_known(report.speculation_props)}",
            *_endpoint_lines(report.endpoints, "  "),
        ]
        return "\n".join(lines)
    lines.append(f"router {report.url}: {len(report.models)} model(s)")
    for m in report.models:
        lines.append(f"  model {m.model} ({m.status}): {m.verdict.upper()}: {m.summary}")
        if m.status == "loaded" and m.build is not None:
            lines.append(f"    speculation: /slots {_known(m.speculation_slots)}, /props {_known(m.speculation_props)}")
        lines += _endpoint_lines(m.endpoints, "    ")
    return "\n".join(lines)

