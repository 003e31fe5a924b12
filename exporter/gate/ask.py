"""`specwatch check --exporter`: the verdicts a running specwatch holds for what an eval will read; it sends no canary."""

from __future__ import annotations

import base64
import ssl
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from ..core.evidence import MISSED
from ..core.report import VERDICTS_PATH, EndpointEntry, PeersEntry, VerdictsDocument, read_verdicts
from ..core.verdict import SEVERITY, Decision, Disagreement, Verdict, among_peers, held, selection_verdict
from ..probe.http.client import Client, new_client
from ..probe.http.fetch import Fetcher
from ..reasons import ProbeFailure
from .options import CHECK, Spelling

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Exporter:
    """How to reach one specwatch: its URL and the credentials its --web-config asks for."""

    url: str
    username: str | None = None
    password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    def headers(self) -> dict[str, str]:
        if self.username is None:
            return {}
        password = self.password_file.read_text(encoding="utf-8").strip() if self.password_file else ""
        token = base64.b64encode(f"{self.username}:{password}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    def verify(self) -> bool | ssl.SSLContext:
        """Trust the system's CAs, or the exporter's own CA; present a client certificate when given one."""
        if self.ca_file is None and self.cert_file is None:
            return True
        context = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            context.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        return context


@dataclass
class ModelVerdict:
    server: str
    model: str
    verdict: str
    summary: str
    fresh: bool
    age_seconds: float | None
    max_age_seconds: float | None
    labels: dict[str, str] = field(default_factory=dict)
    exporter: str = ""
    endpoints: list[EndpointEntry] = field(default_factory=list)
    peers: PeersEntry | None = None
    """Its standing with its peer group, the second judgement beside the verdict."""

    @property
    def disagreement(self) -> Disagreement | None:
        if self.peers is None or self.peers.agreement is not False:
            return None
        name = self.server + (f"/{self.model}" if self.model else "")
        return Disagreement(name, self.peers.kind or "", tuple(self.peers.held_against), self.peers.detail)


@dataclass
class AskReport:
    """The same top-level keys as `specwatch check --json` (verdict, exit_code, summary), then what decided them."""

    verdict: str = Verdict.UNCHECKED.value
    exit_code: int = Verdict.UNCHECKED.exit_code
    summary: str = ""
    exporters: list[str] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)
    models: list[ModelVerdict] = field(default_factory=list)
    disagreeing: list[str] = field(default_factory=list)
    """The selected replicas that disagree with their peer group (the exit code is then 1, whatever the verdict)."""
    undecided: list[str] = field(default_factory=list)
    """The selected replicas that stopped answering the peer probe rounds their group answers (their standing is
    unknown): the exit code is then 2, never clean, unless one differs."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class ExporterUnreachable(Exception):
    """An exporter could not be asked: refused, unauthorised, not a specwatch, a bad answer."""


def _query(servers: list[str], labels: list[tuple[str, str]], model: str | None) -> str:
    pairs = [("server", s) for s in servers] + [("label", f"{k}={v}") for k, v in labels]
    if model is not None:
        pairs.append(("model", model))
    return f"?{urlencode(pairs)}" if pairs else ""


async def _document(fetcher: Fetcher, exporter: Exporter, query: str, timeout: float, spelling: Spelling) -> VerdictsDocument:
    url = exporter.url.rstrip("/") + VERDICTS_PATH + query
    try:
        headers = exporter.headers()
    except OSError as err:
        raise ExporterUnreachable(f"cannot read the password file for {exporter.url}: {err.strerror or err}") from None
    try:
        document = await fetcher.get_json(url, headers=headers, timeout=timeout)
    except ProbeFailure as failure:
        hint = {
            # As an API key's hint: credentials refused, or none sent to an exporter that asks for them.
            "unauthorized": spelling.say(("the exporter refused the credentials" if exporter.username is not None else
                                          "the exporter asks for credentials") + ": give {exporter_username} and "
                                         "{exporter_password_file} as its --web-config's basic_auth_users expects"),
            "not_found": f"no {VERDICTS_PATH} there: not a specwatch exporter, or one older than this check",
            "client_error": "the exporter refused the selection",
            "tls": spelling.say("TLS failed: give the exporter's CA with {exporter_ca_file} (or its client certificate)"),
        }.get(failure.reason.value, "")
        message = f"cannot ask the exporter at {exporter.url}: {failure}"
        raise ExporterUnreachable(message + (f"; {hint}" if hint else "")) from None
    try:
        return read_verdicts(document)
    except ValueError as err:
        raise ExporterUnreachable(
            f"{exporter.url} answered {VERDICTS_PATH} with something that is not a v1 verdicts document ({err})") from None


def _candidates(document: VerdictsDocument, exporter: str, model: str | None) -> list[ModelVerdict]:
    found = []
    for server in document.servers:
        for entry in server.models:
            # As `specwatch check` on a router: without --model, the loaded models are what an eval can reach.
            if server.router and model is None and entry.status != "loaded":
                continue
            decision = held(Decision(entry.verdict, entry.summary), entry.freshness())
            found.append(ModelVerdict(
                server=server.server, model=entry.key, verdict=decision.verdict.value, summary=decision.summary,
                fresh=entry.fresh, age_seconds=entry.age_seconds, max_age_seconds=entry.max_age_seconds,
                labels=server.labels, exporter=exporter, endpoints=entry.endpoints, peers=entry.peers,
            ))
    return found


def _rank(found: ModelVerdict) -> tuple[bool, int]:
    """Fresh beats stale; then the worse verdict wins."""
    return found.fresh, -SEVERITY.index(Verdict(found.verdict))


def _merged(candidates: list[ModelVerdict]) -> list[ModelVerdict]:
    """One entry per server and model: replicas that watch the same one (HA) agree, or the fresher, worse one counts."""
    best: dict[tuple[str, str], ModelVerdict] = {}
    for found in candidates:
        key = (found.server, found.model)
        held = best.get(key)
        if held is None or _rank(found) > _rank(held):
            # A disagreement one replica of an HA pair confirmed is kept whichever verdict is kept.
            if held is not None and held.disagreement is not None and found.disagreement is None:
                found.peers = held.peers
            best[key] = found
        elif found.disagreement is not None and held.disagreement is None:
            held.peers = found.peers
    return list(best.values())


async def ask(
    exporters: list[Exporter], *, servers: list[str], labels: list[tuple[str, str]], model: str | None, timeout: float,
    client: Client | None = None, spelling: Spelling = CHECK,
) -> AskReport:
    """The worst verdict of the selection across every exporter; unchecked when an exporter cannot be asked."""
    report = AskReport(exporters=[e.url for e in exporters],
                       selection={"servers": servers, "labels": dict(labels), "model": model})
    query = _query(servers, labels, model)
    candidates: list[ModelVerdict] = []
    watched = 0
    for exporter in exporters:
        try:
            if client is not None:
                document = await _document(Fetcher(client, MAX_DOCUMENT_BYTES), exporter, query, timeout, spelling)
            else:
                async with new_client(verify=exporter.verify()) as http:
                    document = await _document(Fetcher(http, MAX_DOCUMENT_BYTES), exporter, query, timeout, spelling)
        except (ExporterUnreachable, ssl.SSLError, OSError) as err:
            message = str(err) if isinstance(err, ExporterUnreachable) else f"cannot use the TLS files for {exporter.url}: {err}"
            return Decision(Verdict.UNCHECKED, message).onto(report)
        watched += len(document.servers)
        candidates += _candidates(document, exporter.url, model)
    report.models = sorted(_merged(candidates), key=lambda m: (SEVERITY.index(Verdict(m.verdict)), m.server, m.model))
    found = [(m.server + (f"/{m.model}" if m.model else ""), Decision(Verdict(m.verdict), m.summary)) for m in report.models]
    decision = selection_verdict(found, any_watched=watched > 0, selection=_describe(report.selection))
    disagreements = [d for m in report.models if (d := m.disagreement) is not None]
    report.disagreeing = [d.name for d in disagreements]
    report.undecided = [] if disagreements else [m.server + (f"/{m.model}" if m.model else "") for m in report.models
                                                 if m.peers is not None and m.peers.agreement is None
                                                 and m.peers.missed_rounds >= MISSED]
    decision, exit_code = among_peers(decision, disagreements, report.undecided)
    decision.onto(report).exit_code = exit_code  # a disagreement makes it 1 whatever the verdict, an unknown one 2
    return report


def _describe(selection: dict[str, Any]) -> str:
    parts = [f"server={s}" for s in selection["servers"]] + [f"label={k}={v}" for k, v in selection["labels"].items()]
    if selection["model"]:
        parts.append(f"model={selection['model']}")
    return ", ".join(parts) or "everything"



def render_text(report: AskReport) -> str:
    refused = (f"REFUSED (replicas differ; fill-in verdict {report.verdict})" if report.disagreeing
               else f"UNDECIDED (replicas not told apart; fill-in verdict {report.verdict})" if report.undecided
               else report.verdict.upper())
    lines = [f"{refused}: {report.summary}"]
    for m in report.models:
        name = m.server + (f" model {m.model}" if m.model else "")
        age = "never confirmed" if m.age_seconds is None else f"confirmed {m.age_seconds:.0f}s ago"
        lines.append(f"  {name}: {m.verdict.upper()} ({age}): {m.summary}")
        if (d := m.disagreement) is not None:
            lines.append(f"    DIFFERS from its peer group {m.peers.group if m.peers else '?'} ({d.kind}): {d.detail}; "
                         f"held against {', '.join(d.held_against) or 'the others'}")
    return "\n".join(lines)
