"""When a model is due a canary, and on which endpoints: all at once after a change, else one endpoint per canary_interval
(longer in proportion for a larger canary)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.state import ModelState
from ..endpoints import Endpoint
from ..probe.llama import Props, Slots
from ..settings.schema import Settings

DEFAULT_TOKENS: int = Settings.model_fields["canary_tokens"].default
DEFAULT_TOKENS_SPECULATING: int = Settings.model_fields["canary_tokens_speculating"].default
MAX_STRETCH = 2.0
"""Periodic canaries of a model come at most this many canary_intervals apart, whatever their size:
SpecwatchCanaryStale warns after 2.5 intervals (and 2m more) without a successful canary."""


@dataclass(frozen=True)
class Round:
    """The canaries due for one model now."""

    endpoints: tuple[Endpoint, ...]
    full: bool
    """Every endpoint, after the model appeared, changed or came back: a second pass follows when it proves nothing."""
    rotation: bool
    """The periodic confirmation: it restarts the canary_interval clock."""


def spacing(model: ModelState, *, interval: float, tokens: int = DEFAULT_TOKENS,
            tokens_speculating: int = DEFAULT_TOKENS_SPECULATING) -> float:
    """The time between periodic canaries of `model`: `interval` for a canary of `tokens`, longer in proportion for a
    larger one (the watcher asks `tokens_speculating` of a model that may speculate), up to MAX_STRETCH intervals. At
    the defaults a plain server gets 8 tokens every 60 s (480 an hour), a speculating one 32 every 120 s (960).

    A model /slots says speculates gives up nothing by it: whatever would change its verdict (a restart without
    speculation, another build) changes what the poll sees and gets a full round at once. A server with /slots off is
    canaried as if it speculated, and there speculation cannot be seen: a restart that changes it, and nothing else
    the poll sees, waits for this periodic canary unless a poll found the server down meanwhile (then it is "back").
    """
    size = tokens_speculating if model.suspect else tokens
    return interval * min(MAX_STRETCH, max(1.0, size / tokens))


def _reached(elapsed: float, wanted: float, poll_interval: float) -> bool:
    """Whether `elapsed` seconds since a round began is `wanted` or more, counted in whole polls when rounds start at
    polls: the milliseconds each poll's answer takes make the time between two of them vary."""
    if poll_interval <= 0 or not math.isfinite(elapsed):
        return elapsed >= wanted
    return round(elapsed / poll_interval) * poll_interval >= wanted - 1e-9


def due(model: ModelState, now: float, *, interval: float, tokens: int = DEFAULT_TOKENS,
        tokens_speculating: int = DEFAULT_TOKENS_SPECULATING, poll_interval: float = 0.0) -> Round | None:
    """The round due for `model` at `now`, or None.

    A model that cannot answer (its poll failed, or a router has it unloaded) gets nothing: canaries would only
    fail, or load it. A change seen by the poll gets every endpoint at once. Otherwise one endpoint per `spacing()`
    (`interval` for a model canaried with `tokens`), the one canaried longest ago, so each endpoint is confirmed every
    spacing x endpoints; an endpoint whose last canary failed is retried after one `interval` instead of waiting its
    turn. A model that comes back after a failed poll gets every endpoint too, but at most once per `interval`: a
    flapping server must not cost a round a poll. `tokens` and `tokens_speculating` are the settings' canary_tokens
    and canary_tokens_speculating (their defaults unless given).

    The watcher looks at `now` right after each poll and passes its `poll_interval`: time is then counted in polls.
    Compared to the millisecond, a round begun after a poll that took 5 ms is not due at a poll that took 4 ms an
    interval later, and canaries meant to come an interval apart came an interval and a poll apart half the time.
    """
    if model.poll is None or not model.loaded or not model.endpoints:
        return None
    if model.full_round_due in ("new", "changed"):
        return Round(model.endpoints, full=True, rotation=True)
    # A server that keeps failing and recovering would otherwise get a full round at every recovery.
    if model.full_round_due == "back" and (model.full_round_at is None
                                           or _reached(now - model.full_round_at, interval, poll_interval)):
        return Round(model.endpoints, full=True, rotation=True)

    def age(endpoint: Endpoint) -> float:
        canary = model.canaries.get(endpoint)
        return float("inf") if canary is None else now - canary.attempted_at

    picks: list[Endpoint] = []
    every = spacing(model, interval=interval, tokens=tokens, tokens_speculating=tokens_speculating)
    rotation = model.rotated_at is None or _reached(now - model.rotated_at, every, poll_interval)
    if rotation:
        picks.append(max(model.endpoints, key=age))
    failing = [e for e in model.endpoints if e not in picks and (c := model.canaries.get(e)) is not None and not c.success
               and _reached(age(e), interval, poll_interval)]
    if failing:
        picks.append(max(failing, key=age))
    return Round(tuple(picks), full=False, rotation=rotation) if picks else None


def round_of(now: float, interval: float) -> int:
    """The peer probe's round at `now`: one per canary_interval of the clock, so every member of a group asked within
    one interval is asked the same prompt, without a word between them."""
    return int(now // interval) if interval > 0 else 0


def peers_due(model: ModelState, now: float, *, interval: float, phase: float = 0.0) -> tuple[int, ...] | None:
    """The peer probe's round due for a member of a peer group at `now`, or None: the current round, once, from `phase`
    seconds into it after its first (each member at its own, so a fleet is asked over the round, not in its first
    seconds). A failed round is not asked again: its group counts it as one the member missed."""
    if model.poll is None or not model.loaded:
        return None
    current = round_of(now, interval)
    asked = model.peer_answers.asked_round
    if asked is None:
        return (current,)  # its first: canary_first already spread those over an interval
    if asked >= current:
        return None
    return (current,) if now - current * interval >= phase else None


def canary_first(model: ModelState, now: float, *, phase: float) -> bool:
    """Whether the peer probe may ask `model` at `now` as far as its canaries go (the watcher adds: none in flight)."""
    # The fill-in verdict is the mission, the comparison is not: no peer question while a full canary round is due,
    # nor before one has begun in this process (the watcher holds it off while that round is in flight), so a
    # one-slot server never answers a question while its canary waits behind it.
    if model.full_round_due is not None or model.full_round_at is None:
        return False
    # A process's first round waits for the member's `phase` (a share of the canary_interval) after that full round
    # began: the members of a fleet that starts together are asked over one interval, not all at its first seconds.
    return model.peer_answers.asked_at is not None or now - model.full_round_at >= phase


def freshness_bound(model: ModelState, *, poll_interval: float, interval: float, timeout: float,
                    tokens: int = DEFAULT_TOKENS, tokens_speculating: int = DEFAULT_TOKENS_SPECULATING) -> float:
    """How old the oldest endpoint's last successful canary may be before a verdict resting on it is stale.

    Each endpoint is confirmed once per rotation (spacing x endpoints), at a poll (up to poll_interval late), within
    the canary's timeout; one spacing more allows a failed canary its retry. A verdict older than this was not
    confirmed when it should have been: the daemon is behind, or the server stopped answering canaries.
    """
    every = spacing(model, interval=interval, tokens=tokens, tokens_speculating=tokens_speculating)
    return every * (len(model.endpoints) + 1) + poll_interval + timeout


def slots_known(model: ModelState | None, props: Props, now: float, *, max_age: float) -> tuple[bool, Slots | None]:
    """Whether the poll may reuse this model's known /slots answer instead of asking (see probes.KnownSlots).

    Speculation is set when a server starts, and /props shows a new start (its media_marker is random per process):
    while /props shows the same process, /slots says what it said, and is asked again only after `max_age` (the
    canary_interval), so a build whose marker stays put is still re-read. A build with no marker is asked every poll.
    """
    if model is None or model.poll is None or model.slots_at is None:
        return False, None
    if props.media_marker is None or props.identity != model.poll.props.identity or now - model.slots_at >= max_age:
        return False, None
    return True, model.poll.slots
