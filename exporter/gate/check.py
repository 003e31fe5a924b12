"""`specwatch check`: a one-shot verdict on whether a server's logprobs (every loaded model's, on a router) can be trusted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.report import EndpointReport, ModelReport, model_report
from ..core.runner import Runner, measure
from ..core.state import Fleet, ServerState
from ..core.verdict import (
    NO_V1_ENDPOINT_ASKED,
    Decision,
    ModelDecision,
    Verdict,
    behind_a_balancer,
    key_hint,
    load_failed,
    router_verdict,
    through_a_front_end,
)
from ..endpoints import Endpoint
from ..probe import probes
from ..probe.canary import TABLE
from ..probe.http.client import Client, new_client
from ..probe.http.fetch import Fetcher
from ..probe.keyfiles import KeyFiles
from ..reasons import ProbeFailure, Reason
from ..settings.targets import ServerConfig
from . import oneserver
from .options import CHECK, Spelling

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
    speculation_types: str | None = None
    """`speculative.types` as /props reports it."""
    build: str | None = None
    model: str | None = None
    endpoints: list[EndpointReport] = field(default_factory=list)
    router: bool = False
    models: list[ModelReport] = field(default_factory=list)
    """A router's models, each with its own verdict; `verdict` is then the worst of the models checked."""
    reason: str | None = None
    """The closed-set reason the poll failed (see the README), when it did."""
    api_key_sent: bool = False
    """Whether a key went with the requests: an `unauthorized` with none asks for one, with one says it was refused."""
    signs: list[str] = field(default_factory=list)
    """Answers that cannot come from one server (a load balancer in front): the verdict is then unchecked, unless a
    canary saw fill-ins, which stay proof (see verdict.behind_a_balancer)."""
    gateway: bool = False
    """Only /v1/* could be reached (an OpenAI-compatible front end): judged from the /v1 endpoints alone."""
    unreachable: list[str] = field(default_factory=list)
    """The poll endpoints the front end did not forward."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def run_check(
    server: ServerConfig,
    *,
    endpoints: list[Endpoint],
    tokens: int,
    timeout: float,
    max_bytes: int = 4 * 1024 * 1024,
    connect: Callable[[], Client] = new_client,
    load: bool = False,
    spelling: Spelling = CHECK,
) -> CheckReport:
    """Poll the server and canary every loaded model (the configured one with `server.model`), through the runner.

    Nothing is ever loaded unless `load` asks for the configured model: a check must not change what it checks.
    """
    report, _ = await checked(server, endpoints=endpoints, tokens=tokens, timeout=timeout, max_bytes=max_bytes,
                              connect=connect, load=load, spelling=spelling)
    return report


async def checked(
    server: ServerConfig, *, endpoints: list[Endpoint], tokens: int, timeout: float, max_bytes: int,
    connect: Callable[[], Client], load: bool, spelling: Spelling, meta: bool = False,
) -> tuple[CheckReport, Runner | None]:
    """run_check, and the runner it ended with (None where it stopped before canarying): its fleet of one is what a
    comparison reads, with each model's /v1/models meta when `meta` asks for it; its fetcher's client is closed."""
    server = server.model_copy(update={"name": CHECKED})
    policy, keys = CheckPolicy(tokens, timeout), KeyFiles()
    async with connect() as http:
        fetcher = Fetcher(http, max_bytes)
        runner = Runner(Fleet([server], endpoints), fetcher, policy, keys=keys)
        polled = await runner.poll_once(server)
        gateway = polled.reason is Reason.NOT_FOUND
        if gateway:
            # llama-server answers /props; a front end that forwards only /v1/* does not: judge through /v1.
            endpoints = [e for e in endpoints if TABLE[e].path.startswith("/v1/")]
            if not endpoints:
                report = CheckReport(url=server.url, gateway=True, unreachable=list(GATEWAY_HIDES))
                return NO_V1_ENDPOINT_ASKED.onto(report), None
            runner = Runner(Fleet([server], endpoints), fetcher, policy, keys=keys)
            polled = await runner.poll_once_with(server, probes.gateway_poll)
        elif load and server.model and polled.result is not None and polled.result.router \
                and not polled.result.models[server.model].loaded:
            try:
                await probes.load(fetcher, server, server.model, timeout=timeout, api_key=keys.key_of(server))
            except ProbeFailure as failure:
                return load_failed(failure).onto(CheckReport(url=server.url)), None
            polled = await runner.poll_once(server)
        for key, model in _state(runner).models.items():
            if model.poll is not None:
                await runner.round(server, key, endpoints, full=True)
        one_server = not gateway and polled.result is not None and not polled.result.router
        again = await _polls_anew(server, keys, policy, max_bytes, connect) if one_server else []
        # Last, so the requests a balancer in front sees up to here are a plain check's.
        if meta:
            await runner.meta_once(server)
    state = _state(runner)
    report, decision = report_of(server, state, key_sent=keys.key_of(server) is not None)
    model = state.model()
    if again and model is not None and model.poll is not None:
        tallies = [c.tally for c in model.canaries.values() if c.tally is not None]
        report.signs = oneserver.signs(model.poll, again, model.model, tallies)
    decision = key_hint(behind_a_balancer(decision, report.signs, hint=oneserver.HINT), state.poll_failure_reason,
                        key_sent=report.api_key_sent, give=spelling.say("{api_key_file} or {api_key_env}"))
    if gateway:
        report.gateway, report.unreachable = True, list(GATEWAY_HIDES)
        decision = through_a_front_end(decision)
    return decision.onto(report), runner


GATEWAY_HIDES = ("/props", "/slots")


def _state(runner: Runner) -> ServerState:
    state = runner.fleet.get(CHECKED)
    assert state is not None  # a fleet of one, never reloaded
    return state


AGAIN = 2
"""Polls made after the canaries, each on a connection of its own: a balancer that picks a replica per connection (or
per request) shows another server's /props to one of them."""


async def _polls_anew(
    server: ServerConfig, keys: KeyFiles, policy: CheckPolicy, max_bytes: int, connect: Callable[[], Client]
) -> list[probes.ServerPoll | Reason]:
    found: list[probes.ServerPoll | Reason] = []
    for _ in range(AGAIN):
        async with connect() as fresh:
            fetcher = Fetcher(fresh, max_bytes)
            measured = await measure(lambda fetcher=fetcher: probes.poll(
                fetcher, server, timeout=policy.timeout, api_key=keys.key_of(server)), policy.timeout)
        found.append(measured.result if measured.result is not None else measured.reason or Reason.INTERNAL)
    return found


def report_of(server: ServerConfig, state: ServerState, *, key_sent: bool) -> tuple[CheckReport, Decision]:
    """The check's report from what the runner recorded (the server's one model, or every model of a router), and the
    verdict its model reached, before the gate's rules."""
    report = CheckReport(url=server.url, api_key_sent=key_sent,
                         reason=state.poll_failure_reason.value if state.poll_failure_reason else None)
    checked = [(model_report(key, model), model.decision) for key, model in state.models.items()]
    if not state.router:
        ((only, decision),) = checked
        report.speculation_slots, report.speculation_props = only.speculation_slots, only.speculation_props
        report.speculation_types = only.speculation_types
        report.build, report.endpoints = only.build, only.endpoints
        report.model = server.model or only.model or None
        return report, decision
    report.router, report.models, report.model = True, [m for m, _ in checked], server.model
    models = [ModelDecision(m.model, m.status == "loaded", d) for m, d in checked]
    return report, router_verdict(models, one_asked=bool(server.model))



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


def _speculation(slots: bool | None, props: bool | None, types: str | None) -> str:
    named = f" ({types})" if props else ""
    return f"speculation: /slots {_known(slots)}, /props {_known(props)}{named}"


def render_text(report: CheckReport) -> str:
    lines = [f"{report.verdict.upper()}: {report.summary}"]
    if not report.router:
        lines += [
            f"server {report.url}  build={report.build or '?'}  model={report.model or '?'}",
            _speculation(report.speculation_slots, report.speculation_props, report.speculation_types),
            *_endpoint_lines(report.endpoints, "  "),
        ]
        return "\n".join(lines)
    lines.append(f"router {report.url}: {len(report.models)} model(s)")
    for m in report.models:
        lines.append(f"  model {m.model} ({m.status}): {m.verdict.upper()}: {m.summary}")
        if m.status == "loaded" and m.build is not None:
            lines.append(f"    {_speculation(m.speculation_slots, m.speculation_props, m.speculation_types)}")
        lines += _endpoint_lines(m.endpoints, "    ")
    return "\n".join(lines)

