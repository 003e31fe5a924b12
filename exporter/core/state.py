"""What specwatch knows about each server and each model it serves, as immutable snapshots that scrapes read without locks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType

from ..endpoints import Endpoint
from ..probe.canary import Tally
from ..probe.logprobs import Logprobs
from ..probe.probes import PLAIN, ModelPoll, PollResult, ServerPoll
from ..reasons import Reason
from ..settings.targets import ServerConfig
from .answered import PeerAnswers
from .peers import CONTENT_FIELDS, Fingerprint, Peer, Standing, group_of
from .verdict import Decision, EndpointEvidence, Evidence, decide

UNKNOWN = "unknown"
"""A model's status before any poll told it."""
LOADED = "loaded"
_EMPTY: Mapping = MappingProxyType({})


@dataclass(frozen=True)
class CanaryState:
    duration_seconds: float
    attempted_at: float
    """Unix time the last canary of this endpoint started."""
    tally: Tally | None = None
    """The last successful canary's tally: cached until the next success."""
    last_success_timestamp: float | None = None
    failure_reason: Reason | None = None
    """Why the last canary failed; None when it succeeded."""
    failure_detail: str = ""

    @property
    def success(self) -> bool:
        return self.failure_reason is None


def setup_of(result: PollResult) -> tuple[object, ...]:
    """What identifies a running model: a restart with another build, model, slots, context or speculation changes it."""
    props, slots = result.props, result.slots
    return (props.build, props.model, props.file, props.total_slots, props.n_ctx, props.speculation_types,
            None if slots is None else (slots.count, slots.speculative))


@dataclass(frozen=True)
class ModelState:
    """One watched model: the one model of a server, or one model a router lists."""

    model: str
    """The router's model id or the configured `model:`; PLAIN for a server watched without one."""
    endpoints: tuple[Endpoint, ...]
    status: str = UNKNOWN
    poll: PollResult | None = None
    """This model's last /props and /slots; None when the last poll failed, found it not loaded, or none ran."""
    poll_failure: str | None = None
    """Why the last poll of it (or of its server) failed, as "reason: detail"."""
    slots_at: float | None = None
    """Unix time /slots was last asked (the poll reuses its answer while /props shows the same process)."""
    seen: tuple[object, ...] | None = None
    """The setup of the last good poll, kept through failures so a restart with the same setup is told apart."""
    process: str | None = None
    """The media_marker of the last good poll, kept through failures: another one is another process."""
    full_round_due: str | None = "new"
    """Why a canary of every endpoint is due, if one is: "new" (first seen), "changed" (another build, model, slots,
    context or speculation), "back" (answering again after a failed poll or an unload)."""
    full_round_at: float | None = None
    """Unix time the last round of every endpoint began."""
    rotated_at: float | None = None
    """Unix time the last canary round began (one endpoint in turn, or all of them)."""
    canaries: Mapping[Endpoint, CanaryState] = field(default_factory=lambda: _EMPTY)
    canary_failures: Mapping[tuple[Endpoint, Reason], int] = field(default_factory=lambda: _EMPTY)
    canary_outcomes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Canaries that succeeded ("success") and failed ("failure")."""
    canary_tokens: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    """Canary tokens "requested" (asked for) and "generated" (in the answers)."""
    meta: Mapping[str, str] | None = None
    """What /v1/models says of the model file (peers.CONTENT_FIELDS); None before it was asked."""
    meta_for: tuple[object, ...] | None = None
    """The process (Props.identity) `meta` was asked of: another process is asked again."""
    peers: Standing | None = None
    """Its standing in its peer group after the last comparison; None outside any comparison."""
    peer_answers: PeerAnswers = field(default_factory=PeerAnswers)
    """Its answers to the peer probe in this process."""

    @cached_property
    def fingerprint(self) -> Fingerprint | None:
        """What the server says of the model file, for comparing it with its peers; None while it is not polled."""
        # Cached, as `peer` is: a state is never changed, only replaced, and a group of hundreds reads every member's.
        if self.poll is None:
            return None
        props = self.poll.props
        known = self.meta if self.meta is not None and self.meta_for == props.identity else _EMPTY
        return Fingerprint(build=props.build, file=props.file, **{k: known.get(k, "") for k in CONTENT_FIELDS})

    @cached_property
    def peer(self) -> Peer | None:
        """This model as its group's comparison sees it: None while it is not polled and loaded."""
        fingerprint = self.fingerprint
        if fingerprint is None or not self.loaded:
            return None
        return Peer(fingerprint, self.peer_answers.answers, self.peer_answers.noise, self.peer_answers.turn)

    @property
    def loaded(self) -> bool:
        return self.status == LOADED

    @property
    def suspect(self) -> bool:
        """Speculation may be on: /slots or /props says so, or /slots is off and cannot say otherwise."""
        if self.poll is None:
            return True
        slots = self.poll.slots
        return slots is None or slots.speculative or bool(self.poll.props.speculative)

    @property
    def serving_fill_ins(self) -> bool | None:
        """Whether the last successful canary of any endpoint found fill-ins; None before any success."""
        tallies = [c.tally for c in self.canaries.values() if c.tally is not None]
        if not tallies:
            return None
        return any(t.fill_ins > 0 for t in tallies)

    @property
    def last_canary_at(self) -> float | None:
        return max((c.attempted_at for c in self.canaries.values()), default=None)

    def evidence(self) -> Evidence:
        if self.status not in (UNKNOWN, LOADED):
            return Evidence(poll_failure=None, model_status=self.status)
        if self.poll is None:
            return Evidence(poll_failure=self.poll_failure or "not polled yet")
        endpoints = []
        for endpoint in self.endpoints:
            canary = self.canaries.get(endpoint)
            if canary is None:
                endpoints.append(EndpointEvidence(endpoint.value, None))
            else:
                failure = None if canary.success else f"{canary.failure_reason}: {canary.failure_detail}"
                endpoints.append(EndpointEvidence(endpoint.value, canary.tally, failure))
        return Evidence(
            poll_failure=None,
            speculation_slots=self.poll.slots.speculative if self.poll.slots is not None else None,
            speculation_props=self.poll.props.speculative,
            endpoints=endpoints,
        )

    @cached_property
    def decision(self) -> Decision:
        """The verdict on this model, from `specwatch.verdict` like every other consumer's."""
        return decide(self.evidence())

    def reconfigured(self, endpoints: tuple[Endpoint, ...]) -> ModelState:
        """This model under a reloaded endpoint list: dropped endpoints vanish, added ones make a full round due."""
        return replace(
            self, endpoints=endpoints, canaries=MappingProxyType({e: c for e, c in self.canaries.items() if e in endpoints}),
            full_round_due=self.full_round_due or ("changed" if set(endpoints) - set(self.endpoints) else None),
        )

    def polled(self, found: ModelPoll, now: float) -> ModelState:
        """This model after a poll of its server that answered."""
        if not found.loaded:
            return replace(self, status=found.status, poll=None, poll_failure=None, slots_at=None)
        if found.result is None:
            failure = found.failure
            return replace(self, status=found.status, poll=None, poll_failure=str(failure) if failure else "no answer")
        now_seen = setup_of(found.result)
        changed = now_seen != self.seen
        if changed and self.seen is not None:
            due: str | None = "changed"
        else:
            due = self.full_round_due or ("back" if self.poll is None else None)
        process = found.result.props.media_marker
        # Verdicts of what ran before a change say nothing about what runs now; a restart with the same setup keeps
        # its fill-in verdicts, but the new process may have loaded other weights under the same file name: its peers
        # hold it to what it answers itself, with its evidence begun anew.
        canaries = _EMPTY if changed and self.seen is not None else self.canaries
        anew = (changed and self.seen is not None) or (process != self.process and self.process is not None)
        return self._kept_decision(replace(
            self, status=found.status, poll=found.result, poll_failure=None, seen=now_seen, full_round_due=due,
            slots_at=now if found.slots_asked else self.slots_at, process=process or self.process, canaries=canaries,
            peer_answers=self.peer_answers.anew() if anew else self.peer_answers, peers=None if anew else self.peers,
        ))

    def _decided_from(self) -> tuple[object, ...]:
        """What evidence() reads besides the canaries: equal for two states with the same canaries, their decisions are
        equal."""
        poll = self.poll
        slots = poll.slots.speculative if poll is not None and poll.slots is not None else None
        return (self.status, self.poll_failure, poll is None, slots, poll.props.speculative if poll else None,
                self.endpoints)

    def _kept_decision(self, after: ModelState) -> ModelState:
        """`after`, with this state's decision when it was made and would be made again: a poll that changes nothing
        the verdict reads (most polls) decides nothing anew."""
        if "decision" in self.__dict__ and after.canaries is self.canaries and after._decided_from() == self._decided_from():
            after.__dict__["decision"] = self.__dict__["decision"]  # what cached_property would store
        return after


@dataclass(frozen=True)
class ServerState:
    config: ServerConfig
    endpoints: tuple[Endpoint, ...] = ()
    """The endpoints the canary asks: a verdict needs every one of them."""
    router: bool | None = None
    """Whether the server is a router (it lists models); None before a poll said."""
    poll_failure_reason: Reason | None = None
    poll_failure_detail: str = ""
    poll_duration_seconds: float | None = None
    last_poll_success_timestamp: float | None = None
    poll_success: bool | None = None
    """True after a good poll, False after a failed one, None before the first."""
    poll_failures: Mapping[Reason, int] = field(default_factory=lambda: _EMPTY)
    poll_outcomes: Mapping[str, int] = field(default_factory=lambda: _EMPTY)
    models: Mapping[str, ModelState] = field(default_factory=lambda: _EMPTY)

    def peer_group(self, key: str) -> str | None:
        """The peer group of one of its models (specwatch.peers.group_of); None outside any."""
        model = self.models.get(key)
        reported = key if self.router else (model.poll.props.model if model is not None and model.poll else "")
        return group_of(self.config.peer_group, reported, whole_server=not self.router or bool(self.config.model))

    def model(self, key: str | None = None) -> ModelState | None:
        """One watched model: by default the configured one, or the server's only model."""
        return self.models.get(self.config.model or PLAIN if key is None else key)

    def _blank(self, key: str) -> ModelState:
        return ModelState(model=key, endpoints=self.endpoints)


def _bumped(counts: Mapping, key: object, by: int = 1) -> Mapping:
    updated = dict(counts)
    updated[key] = updated.get(key, 0) + by
    return MappingProxyType(updated)


def _fresh(config: ServerConfig, endpoints: tuple[Endpoint, ...]) -> ServerState:
    key = config.model or PLAIN
    return ServerState(config=config, endpoints=endpoints, models=MappingProxyType({key: ModelState(key, endpoints)}))


Change = tuple[ServerState, ServerState]


class Fleet:
    """Per-server state. Writers run on the event loop; readers (scrapes) may run on any thread.

    An update replaces one server's immutable state in place, a reload rebinds `_servers` to a new dict: either way a
    reader's `snapshot()` is consistent.
    """

    def __init__(self, servers: Iterable[ServerConfig] = (), endpoints: Iterable[Endpoint] = ()) -> None:
        wanted = tuple(endpoints)
        self._servers: dict[str, ServerState] = {s.name: _fresh(s, wanted) for s in servers}

    def snapshot(self) -> list[ServerState]:
        return list(self._servers.values())

    def get(self, name: str) -> ServerState | None:
        return self._servers.get(name)

    def reconcile(self, servers: Iterable[ServerConfig], endpoints: Iterable[Endpoint]) -> None:
        """Adopt a new config: removed servers and endpoints vanish; a server whose target is unchanged keeps its data."""
        current, wanted = self._servers, tuple(endpoints)
        updated: dict[str, ServerState] = {}
        for server in servers:
            old = current.get(server.name)
            if old is not None and old.config.url == server.url and old.config.model == server.model:
                models = {key: m.reconfigured(wanted) for key, m in old.models.items()}
                updated[server.name] = replace(old, config=server, endpoints=wanted, models=MappingProxyType(models))
            else:
                updated[server.name] = _fresh(server, wanted)
        self._servers = updated

    def _update(self, name: str, **changes: object) -> Change | None:
        """(old, new) state of `name` after `changes`; None when a reload removed it while its probe was in flight."""
        old = self._servers.get(name)
        if old is None:
            return None
        new = replace(old, **changes)
        # In place: a key that is already there neither grows nor shrinks the dict, so a reader's snapshot() (one C call
        # under the GIL) sees every server whole, before or after; a copy of the dict per probe cost 4% of the CPU.
        self._servers[name] = new
        return old, new

    def record_poll(
        self, name: str, *, result: ServerPoll | None, reason: Reason | None, detail: str = "", duration: float, now: float
    ) -> Change | None:
        old = self._servers.get(name)
        if old is None:
            return None
        if result is None or reason is not None:
            failure = f"{reason}: {detail}"
            # The server did not answer, so no model's status is known any more.
            models = {key: replace(m, status=UNKNOWN, poll=None, poll_failure=failure, slots_at=None)
                      for key, m in old.models.items()}
            return self._update(
                name, poll_success=False, poll_failure_reason=reason, poll_failure_detail=detail, poll_duration_seconds=duration,
                poll_failures=_bumped(old.poll_failures, reason), poll_outcomes=_bumped(old.poll_outcomes, "failure"),
                models=MappingProxyType(models),
            )
        # A router's listing decides which models exist; models it no longer lists vanish with their series.
        models = {key: old.models.get(key, old._blank(key)).polled(found, now) for key, found in result.models.items()}
        return self._update(
            name, router=result.router, poll_success=True, poll_failure_reason=None, poll_failure_detail="",
            poll_duration_seconds=duration, last_poll_success_timestamp=now,
            poll_outcomes=_bumped(old.poll_outcomes, "success"), models=MappingProxyType(models),
        )

    def _update_model(self, name: str, key: str, change: dict[str, object]) -> Change | None:
        old = self._servers.get(name)
        model = old.models.get(key) if old is not None else None
        if old is None or model is None:
            return None
        return self._update(name, models=MappingProxyType({**old.models, key: replace(model, **change)}))

    def record_meta(self, name: str, key: str, meta: Mapping[str, str], identity: tuple[object, ...]) -> Change | None:
        """What /v1/models said of the model file of the process `identity` names."""
        return self._update_model(name, key, {"meta": MappingProxyType(dict(meta)), "meta_for": identity})

    def record_peers(self, standings: Mapping[tuple[str, str], Standing | None]) -> None:
        """The standings a comparison gave, by (server, model key); a standing that did not change writes nothing."""
        for (name, key), standing in standings.items():
            server = self._servers.get(name)
            model = server.models.get(key) if server is not None else None
            if model is not None and model.peers != standing:
                self._update_model(name, key, {"peers": standing})

    def record_peer_answer(self, name: str, key: str, question: int, *, answer: Logprobs | None,
                           spread: float | None = None, copies: int = 1, reason: Reason | None = None,
                           detail: str = "") -> Change | None:
        """A peer probe's answer to round `question` (with how far its copies parted), or why it failed."""
        old = self._servers.get(name)
        model = old.models.get(key) if old is not None else None
        if model is None:
            return None
        held = model.peer_answers
        if answer is None or reason is not None:
            held = held.failed(question, reason or Reason.INTERNAL, detail)
        else:
            held = held.answered(question, answer, spread, copies=copies)
        return self._update_model(name, key, {"peer_answers": held})

    def start_peer_round(self, name: str, key: str, question: int, *, now: float) -> Change | None:
        """A peer probe of round `question` began: the next is due at the next round."""
        old = self._servers.get(name)
        model = old.models.get(key) if old is not None else None
        if model is None:
            return None
        return self._update_model(name, key, {"peer_answers": replace(model.peer_answers, asked_at=now,
                                                                      asked_round=question)})

    def start_round(self, name: str, key: str, *, full: bool, now: float) -> Change | None:
        """A canary round began: the next one is due a canary_interval from now; a full one is no longer due."""
        change: dict[str, object] = {"rotated_at": now}
        if full:
            change.update(full_round_due=None, full_round_at=now)
        return self._update_model(name, key, change)

    def record_unloaded(self, name: str, key: str) -> Change | None:
        """A router said the model is not loaded after all (it was unloaded since the poll)."""
        return self._update_model(name, key, {"status": "unloaded", "poll": None, "poll_failure": None})

    def record_canary(
        self, name: str, key: str, endpoint: Endpoint, *, tally: Tally | None, reason: Reason | None, detail: str = "",
        duration: float, now: float, requested: int = 0,
    ) -> Change | None:
        old = self._servers.get(name)
        model = old.models.get(key) if old is not None else None
        if model is None:
            return None
        previous = model.canaries.get(endpoint)
        tokens = _bumped(model.canary_tokens, "requested", requested)
        if reason is None:
            state = CanaryState(duration_seconds=duration, attempted_at=now - duration, tally=tally,
                                last_success_timestamp=now)
            failures = model.canary_failures
            outcomes = _bumped(model.canary_outcomes, "success")
            tokens = _bumped(tokens, "generated", tally.tokens if tally is not None else 0)
        else:
            state = CanaryState(
                duration_seconds=duration,
                attempted_at=now - duration,
                tally=previous.tally if previous else None,
                last_success_timestamp=previous.last_success_timestamp if previous else None,
                failure_reason=reason,
                failure_detail=detail,
            )
            failures = _bumped(model.canary_failures, (endpoint, reason))
            outcomes = _bumped(model.canary_outcomes, "failure")
        return self._update_model(name, key, {
            "canaries": MappingProxyType({**model.canaries, endpoint: state}), "canary_failures": failures,
            "canary_outcomes": outcomes, "canary_tokens": tokens,
        })
