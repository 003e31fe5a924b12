"""`specwatch check`: a one-shot verdict on whether a server's logprobs (every loaded model's, on a router) can be trusted."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from exporter.probe import probes
from exporter.probe.canary import Endpoint
from exporter.probe.fetch import Fetcher, new_client
from exporter.reasons import ProbeFailure
from exporter.report import EndpointReport, ModelReport, model_report
from exporter.runner import Runner
from exporter.settings.schema import ServerConfig
from exporter.state import Fleet, ServerState
from exporter.verdict import NOTHING_LOADED, Decision, Verdict, worst

CHECKED = "check"
"""The name of the one server a check watches, in its fleet of one."""


@dataclass(frozen=True)
class CheckPolicy:
    """One size and one timeout for every canary and request: a check runs once, so it stays thorough."""

    tokens: int
    timeout: float

    @property
    def canary_tokens(self) -> int:
        return self.tokens

    @property
    def canary_tokens_speculating(self) -> int:
        return self.tokens

    def timeout_for(self, server: ServerConfig, *, canary: bool) -> float:
        return self.timeout


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
    """Poll the server and canary every loaded model (the configured one with `server.model`), through the runner.

    Nothing is ever loaded unless `load` asks for the configured model: a check must not change what it checks.
    """
    server = server.model_copy(update={"name": CHECKED})
    fleet = Fleet([server], endpoints)
    async with client or new_client() as http:
        fetcher = Fetcher(http, max_bytes)
        runner = Runner(fleet, fetcher, CheckPolicy(tokens, timeout))
        polled = await runner.poll_once(server)
        if load and server.model and polled.result is not None and polled.result.router \
                and not polled.result.models[server.model].loaded:
            try:
                await probes.load(fetcher, server, server.model, timeout=timeout)
            except ProbeFailure as failure:
                return _decided(CheckReport(url=server.url), Decision(Verdict.UNCHECKED, f"could not load the model: {failure}"))
            await runner.poll_once(server)
        state = fleet.get(CHECKED)
        assert state is not None  # a fleet of one, never reloaded
        for key, model in state.models.items():
            if model.poll is not None:
                await runner.round(server, key, endpoints, full=True)
    return report_of(server, fleet.get(CHECKED) or state)


def report_of(server: ServerConfig, state: ServerState) -> CheckReport:
    """The check's report from what the runner recorded: the server's one model, or every model of a router."""
    report = CheckReport(url=server.url)
    checked = [(model_report(key, model), model.decision) for key, model in state.models.items()]
    if not state.router:
        ((only, decision),) = checked
        report.speculation_slots, report.speculation_props = only.speculation_slots, only.speculation_props
        report.build, report.endpoints = only.build, only.endpoints
        report.model = server.model or only.model or None
        return _decided(report, decision)
    report.router, report.models, report.model = True, [m for m, _ in checked], server.model
    # A router's verdict is its worst loaded model's: an eval may be sent to any of them.
    counted = [(m.model, d) for m, d in checked if server.model or m.status == "loaded"]
    if not counted:
        return _decided(report, NOTHING_LOADED)
    name, decision = worst(counted)
    if len(checked) > 1:
        verdicts = ", ".join(f"{m.model}: {m.verdict}" for m, _ in checked)
        decision = Decision(decision.verdict, f"{decision.summary} (model {name}; models: {verdicts})")
    return _decided(report, decision)


def _decided(report: CheckReport, decision: Decision) -> CheckReport:
    report.verdict, report.exit_code, report.summary = decision.verdict.value, decision.verdict.exit_code, decision.summary
    return report


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

