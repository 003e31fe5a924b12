"""The landing page on-call opens first: how many servers serve fill-ins, then every watched model, worst first."""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..core.report import PeersEntry, endpoint_state, model_report, peers_entry
from ..core.state import ServerState
from ..core.verdict import SEVERITY, Verdict
from ..version import __version__


@dataclass(frozen=True)
class Row:
    """One watched model (a server's only one, or one a router lists): plain words, no secrets."""

    server: str
    url: str
    verdict: Verdict
    summary: str
    poll: str
    model: str = ""
    poll_age: float | None = None
    """Seconds since the last successful poll."""
    canary_age: float | None = None
    """Seconds since the last canary of this model started."""
    labels: dict[str, str] = field(default_factory=dict)
    endpoints: tuple[tuple[str, str, str], ...] = ()
    """(endpoint, kind, words) of each canaried endpoint (see report.endpoint_state)."""
    peers: str = ""
    """Its standing with its peer group, in words; "" outside any group."""
    disagrees: bool = False
    """A confirmed disagreement with its peer group."""


def peer_words(entry: PeersEntry | None, group: str | None = None) -> str:
    """A model's standing with its peers for people: the second judgement, beside the verdict."""
    if entry is None:
        return f"group {group}: no peer to compare with" if group else ""
    if entry.agreement is None and entry.missed_rounds:
        return (f"group {entry.group}: UNKNOWN, it did not answer the last {entry.missed_rounds} peer-probe rounds its "
                "group answered")
    if entry.agreement is None:
        return f"group {entry.group}: nothing to compare yet"
    deployment = f"; deployed otherwise: {entry.deployment}" if entry.deployment else ""
    if entry.agreement is False:
        split = ", which has no majority" if entry.split else ""
        return (f"disagrees with group {entry.group}{split} ({entry.kind}): {entry.detail}; "
                f"held against {', '.join(entry.held_against)}{deployment}")
    evidence = f", evidence {entry.evidence:.0%} of the way to differing" if entry.evidence else ""
    others = "; others in the group differ" if entry.group_agreement is False else ""
    noisy = "; its own noise stands far over its group's" if entry.noisy else ""
    return f"agrees with group {entry.group}{evidence}{others}{noisy}{deployment}"


def rows(state: ServerState, now: float) -> list[Row]:
    if state.poll_success is None:
        poll = "not polled yet"
    elif not state.poll_success:
        poll = f"down ({state.poll_failure_reason or 'failed'})"
    else:
        poll = "up, router" if state.router else "up"
    poll_age = now - state.last_poll_success_timestamp if state.last_poll_success_timestamp is not None else None
    found = []
    for key, model in state.models.items():
        detail = poll
        if model.poll is not None:
            slots = model.poll.slots
            speculation = "unknown (/slots off)" if slots is None else "on" if slots.speculative else "off"
            detail += f"; speculation per /slots: {speculation}"
            if model.poll.props.speculative:
                # Only a /props that names a type says something: build 11434 says "none" whatever the server does.
                detail += f"; /props: {model.poll.props.speculation_types}"
        elif state.poll_success and state.router:
            detail += f"; model {model.status}"
        last = model.last_canary_at
        entries = model_report(key, model).endpoints
        standing = model.peers
        peers = None if standing is None else peers_entry(standing)
        found.append(Row(
            server=state.config.name, url=state.config.url, model=key, verdict=model.decision.verdict,
            summary=model.decision.summary, poll=detail, poll_age=poll_age,
            canary_age=now - last if last is not None else None, labels=dict(state.config.labels),
            endpoints=tuple((e.endpoint, *endpoint_state(e)) for e in entries),
            peers=peer_words(peers, state.peer_group(key) if model.poll is not None else None),
            disagrees=peers is not None and peers.agreement is False,
        ))
    return found


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def summary_line(found: Iterable[Row]) -> str:
    found = list(found)
    counts = Counter(r.verdict for r in found)
    total = sum(counts.values())
    words = {Verdict.FILL_INS: "serving fill-ins", Verdict.UNPROVEN: "unproven", Verdict.UNCHECKED: "unchecked",
             Verdict.CLEAN: "clean"}
    first = f"{counts[Verdict.FILL_INS]} of {total} serving fill-ins"
    rest = [f"{counts[v]} {words[v]}" for v in SEVERITY[1:] if counts[v]]
    disagree = sum(1 for r in found if r.disagrees)
    return " · ".join([first, *rest, *([f"{disagree} disagreeing with their peers"] if disagree else [])])


def render(found: list[Row]) -> str:
    order = {verdict: rank for rank, verdict in enumerate(SEVERITY)}
    found = sorted(found, key=lambda r: (order[r.verdict], r.server, r.model))
    cells = []
    for r in found:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        name = html.escape(r.server) + (f" <span class=\"model\">{html.escape(r.model)}</span>" if r.model else "")
        endpoints = "".join(f'<li class="{kind}">{html.escape(endpoint)}: {html.escape(words)}</li>'
                            for endpoint, kind, words in r.endpoints)
        cells.append(
            f'<tr class="{r.verdict.value}"><td>{name}</td><td>{html.escape(r.verdict.value)}</td>'
            f"<td>{html.escape(r.summary)}</td><td><ul class=\"endpoints\">{endpoints}</ul></td>"
            f'<td class="peers{" disagrees" if r.disagrees else ""}">{html.escape(r.peers)}</td>'
            f"<td>{html.escape(r.poll)}</td><td>{_age(r.poll_age)}</td>"
            f"<td>{_age(r.canary_age)}</td><td>{html.escape(labels)}</td><td><code>{html.escape(r.url)}</code></td></tr>"
        )
    alarm = " alarm" if any(r.verdict is Verdict.FILL_INS for r in found) else ""
    body = "\n".join(cells) or '<tr><td colspan="10">no servers watched</td></tr>'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>specwatch</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em 2em; }}
#summary {{ font-size: 1.4em; font-weight: bold; margin: 0.4em 0 0.8em; }}
#summary.alarm {{ color: #b00020; }}
table {{ border-collapse: collapse; }}
td, th {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }}
tr.fill_ins td {{ background: #fde2e1; }}
tr.unproven td, tr.unchecked td {{ background: #fff4d6; }}
.model {{ color: #555; }}
ul.endpoints {{ list-style: none; margin: 0; padding: 0; font-size: 0.9em; white-space: nowrap; }}
li.fill_ins {{ color: #b00020; font-weight: bold; }}
li.drafted {{ color: #1b5e20; }}
li.failed, li.pending {{ color: #8a6d00; }}
td.peers {{ font-size: 0.9em; }}
td.disagrees {{ color: #b00020; font-weight: bold; }}
</style></head>
<body>
<h1>specwatch {html.escape(__version__)}</h1>
<p id="summary" class="summary{alarm}">{html.escape(summary_line(found))}</p>
<p>Watches llama-server instances for fill-in logprobs served under speculative decoding. The verdict is the one
<code>specwatch check</code> gives and the alerts page on. <a href="metrics">Metrics</a> · <a href="-/healthy">Health</a></p>
<table id="servers">
<thead><tr><th>server</th><th>verdict</th><th>why</th><th>endpoints</th><th>peers</th><th>poll</th><th>last good poll</th>
<th>last canary</th><th>labels</th><th>url</th></tr></thead>
<tbody>
{body}
</tbody>
</table>
</body></html>
"""
