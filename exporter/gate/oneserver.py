"""Signs that the answers to one check came from more than one server: a load balancer between the check and them."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePath

from ..probe.canary import Tally
from ..probe.llama import Props, names_of
from ..probe.probes import PollResult, ServerPoll
from ..reasons import Reason

HINT = ("a load balancer may send each request to another replica, so no canary speaks for the one an eval reaches: "
        "ask the daemon that watches every replica (specwatch check --exporter URL --label ... or --server ...)")


def _describe(props: Props) -> str:
    marker = props.media_marker or "?"
    slots = "? slots" if props.total_slots is None else f"{props.total_slots} slot{'' if props.total_slots == 1 else 's'}"
    return f"build {props.build or '?'}, model {props.model or '?'}, {slots}, marker {marker}"


def _answer_signs(first: PollResult, tallies: Iterable[Tally]) -> list[str]:
    signs = []
    tallies = list(tallies)
    slots = first.slots
    if slots is not None and not slots.speculative and any(t.drafted for t in tallies):
        signs.append("/slots says speculation is off, yet a canary drafted (timings.draft_n or fill-ins)")
    served = {t.model for t in tallies if t.model}
    known = names_of(first.props.model)
    strangers = sorted(m for m in served if not names_of(m) & known)
    if strangers and first.props.model:
        signs.append(f"a canary was answered by model {strangers[0][:80]!r} where /props says {first.props.model[:80]!r}")
    if len({PurePath(m).stem for m in served}) > 1:
        signs.append(f"the canaries were answered by {len(served)} different models")
    return signs


def signs(first: PollResult, again: list[ServerPoll | Reason], key: str, tallies: Iterable[Tally]) -> list[str]:
    """What cannot come from one server: the first poll's /slots against the canaries, the models that answered, and
    `again` (polls made afterwards on new connections, or the reason each failed) against the first."""
    found = _answer_signs(first, tallies)
    for later in again:
        if isinstance(later, Reason):
            found.append(f"/props answered the first poll but a later one failed ({later.value})")
            continue
        model = later.models.get(key)
        result = model.result if model is not None else None
        if result is None:
            found.append("a later poll found no model where the first found one")
        elif result.props.identity != first.props.identity:
            found.append(f"/props changed between requests ({_describe(first.props)}; then {_describe(result.props)})")
        elif (result.slots is None) != (first.slots is None) or (
                result.slots is not None and first.slots is not None and result.slots.speculative != first.slots.speculative):
            found.append("/slots changed between requests (speculation on in one answer, off or unknown in another)")
    return list(dict.fromkeys(found))
