"""The one runner every probe goes through, for `run` and `check` alike: it times a probe, records it, runs the second pass."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pydantic import SecretStr

from ..endpoints import Endpoint
from ..probe import probes
from ..probe.canary import Tally
from ..probe.http.fetch import Fetcher
from ..probe.keyfiles import KeyFiles
from ..probe.logprobs import Logprobs
from ..reasons import ProbeFailure, Reason
from ..settings.targets import ServerConfig
from .evidence import spread
from .state import Change, Fleet, ModelState
from .verdict import worth_another_pass

T = TypeVar("T")


class PollProbe(Protocol):
    def __call__(
        self, fetcher: Fetcher, target: ServerConfig, *, timeout: float, api_key: SecretStr | None
    ) -> Awaitable[probes.ServerPoll]: ...


PASSES = 2
"""A full round that proves nothing on a speculating model runs once more: n-gram speculation learns from the first
pass (it has seen the canary text) and drafts on the second."""


@dataclass(frozen=True)
class Measured(Generic[T]):
    """One probe's outcome: its result, or the closed-set reason it failed, and how long it took."""

    result: T | None
    reason: Reason | None
    detail: str
    duration: float


async def measure(
    run: Callable[[], Awaitable[T]], timeout: float, monotonic: Callable[[], float] = time.monotonic
) -> Measured[T]:
    """Run one probe under `timeout`; every way it can end becomes a result or a reason, never an exception."""
    started = monotonic()
    try:
        async with asyncio.timeout(timeout):
            result = await run()
        return Measured(result, None, "", monotonic() - started)
    except ProbeFailure as failure:
        return Measured(None, failure.reason, failure.detail, monotonic() - started)
    except TimeoutError:
        return Measured(None, Reason.TIMEOUT, f"no answer within {timeout:g}s", monotonic() - started)
    except Exception as err:  # noqa: BLE001 - one server's surprise must never stop the others
        return Measured(None, Reason.INTERNAL, f"{err.__class__.__name__}: {str(err)[:200]}", monotonic() - started)


class Policy(Protocol):
    """How hard to probe: the daemon's Settings are one, `specwatch check` has its own."""

    @property
    def canary_tokens(self) -> int: ...
    @property
    def canary_tokens_speculating(self) -> int: ...
    def timeout_for(self, server: ServerConfig, *, canary: bool) -> float: ...


def canary_tokens(policy: Policy, model: ModelState | None) -> int:
    """The canary's size: larger where speculation may be on (n-gram types draft only in longer answers)."""
    return policy.canary_tokens_speculating if model is None or model.suspect else policy.canary_tokens


class Runner:
    """Polls and canaries servers of one Fleet, and records every outcome in it; subclasses add limits and logging."""

    def __init__(
        self,
        fleet: Fleet,
        fetcher: Fetcher,
        policy: Policy,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        keys: KeyFiles | None = None,
    ) -> None:
        self.fleet = fleet
        self.fetcher = fetcher
        self.policy = policy
        self.keys = keys if keys is not None else KeyFiles()
        """Resolves the key each probe sends: the config names key files, this reads them (again when they change)."""
        self._clock = clock
        self._monotonic = monotonic

    def _gate(self, *, canary: bool, peers: bool = False) -> contextlib.AbstractAsyncContextManager[object]:
        """Held while a probe runs: the daemon bounds how many are in flight, the peer probe's apart."""
        return contextlib.nullcontext()

    async def _measure(self, run: Callable[[], Awaitable[T]], timeout: float, *, canary: bool = False) -> Measured[T]:
        async with self._gate(canary=canary):
            return await measure(run, timeout, self._monotonic)

    def _polled(self, server: ServerConfig, measured: Measured[object], change: Change | None) -> None:
        """After a poll was recorded."""

    def _canaried(self, server: ServerConfig, key: str, endpoint: Endpoint, measured: Measured[Tally],
                  change: Change | None) -> None:
        """After a canary was recorded."""

    def _unloaded(self, server: ServerConfig, key: str, change: Change | None) -> None:
        """After a router answered a canary that the model is not loaded."""

    def _meta_asked(self, server: ServerConfig, key: str, measured: Measured[dict[str, str]]) -> None:
        """After /v1/models' meta of a model was recorded (empty when it could not be read)."""

    def _peer_asked(self, server: ServerConfig, key: str, question: int, measured: Measured[Logprobs],
                    change: Change | None) -> None:
        """After a peer probe's answer (or failure) was recorded."""

    def _known_slots(self, server: ServerConfig) -> probes.KnownSlots:
        """Which /slots answers the next poll of `server` may reuse: none by default."""
        return probes.ask_always

    async def poll_once(self, server: ServerConfig) -> Measured[probes.ServerPoll]:
        """Poll `server` and record what it answered."""
        known = self._known_slots(server)
        return await self.poll_once_with(server, lambda fetcher, target, *, timeout, api_key: probes.poll(
            fetcher, target, timeout=timeout, known=known, api_key=api_key))

    async def poll_once_with(self, server: ServerConfig, probe: PollProbe) -> Measured[probes.ServerPoll]:
        """Poll `server` with `probe` (the usual poll, or what a front end that forwards only /v1/* allows) and record it."""
        timeout = self.policy.timeout_for(server, canary=False)
        measured = await self._measure(
            lambda: probe(self.fetcher, server, timeout=timeout, api_key=self.keys.key_of(server)), timeout)
        change = self.fleet.record_poll(server.name, result=measured.result, reason=measured.reason, detail=measured.detail,
                                        duration=measured.duration, now=self._clock())
        self._polled(server, measured, change)
        return measured

    async def meta_once(self, server: ServerConfig) -> None:
        """/v1/models' meta for each loaded model whose process it was not asked of yet: once per process start or change."""
        state = self.fleet.get(server.name)
        if state is None or state.router:
            return  # a router does not forward /v1/models to a model: its models' fingerprints come from /props alone
        timeout = self.policy.timeout_for(server, canary=False)
        for key, model in state.models.items():
            poll = model.poll
            if poll is None or not model.loaded or model.meta_for == poll.props.identity:
                continue
            props = poll.props
            measured = await self._measure(lambda props=props: probes.model_meta(
                self.fetcher, server, props, timeout=timeout, api_key=self.keys.key_of(server)), timeout)
            # Not asked again before the next process: the fingerprint then goes without what /v1/models would add.
            self.fleet.record_meta(server.name, key, measured.result or {}, props.identity)
            self._meta_asked(server, key, measured)

    async def ask_peers(self, server: ServerConfig, key: str, rounds: Sequence[tuple[int, int]], *, copies: int) -> None:
        """Ask the peer probe each of `rounds` (the round, and the pool prompt it asks) in turn, `copies` of it at once
        (a server's slots then decode them in one batch, beside its other work): how far the copies parted is the
        member's own noise under its load (a server of one slot gets one copy). A failure ends the rounds."""
        timeout = self.policy.timeout_for(server, canary=True)
        for question, prompt in rounds:
            self.fleet.start_peer_round(server.name, key, question, now=self._clock())

            def ask(prompt: int = prompt) -> Awaitable[Logprobs]:
                return probes.peer_probe(self.fetcher, server, prompt, timeout=timeout, model=key or None,
                                         api_key=self.keys.key_of(server))

            async with self._gate(canary=False, peers=True):  # once for the copies: they must go out together
                together = await asyncio.gather(*(measure(ask, timeout, self._monotonic) for _ in range(max(1, copies))))
            first = together[0]
            if first.reason is Reason.NOT_LOADED:
                self._unloaded(server, key, self.fleet.record_unloaded(server.name, key))
                return
            answers = [m.result for m in together if m.result is not None]
            # Copies cut short measured less than the noise: the next round measures it again. A server of one slot
            # never batches: its own noise is none.
            parted = (spread(answers) if len(answers) == len(together) else None) if copies > 1 else 0.0
            change = self.fleet.record_peer_answer(server.name, key, question, answer=first.result, spread=parted,
                                                   copies=len(answers) or 1, reason=first.reason, detail=first.detail)
            self._peer_asked(server, key, question, first, change)
            if first.result is None:
                return

    async def round(self, server: ServerConfig, key: str, endpoints: Sequence[Endpoint], *, full: bool) -> None:
        """Canary `endpoints` of one model; a full round that leaves a speculating model unproven runs again."""
        self.fleet.start_round(server.name, key, full=full, now=self._clock())
        for _ in range(PASSES if full else 1):
            if not await self._canary_pass(server, key, endpoints):
                return
            state = self.fleet.get(server.name)
            model = state.models.get(key) if state is not None else None
            if model is None or not worth_another_pass(model.decision):
                return

    async def _canary_pass(self, server: ServerConfig, key: str, endpoints: Sequence[Endpoint]) -> bool:
        """Canary each endpoint in turn; False when the model turned out not to be loaded."""
        state = self.fleet.get(server.name)
        tokens = canary_tokens(self.policy, state.models.get(key) if state is not None else None)
        timeout = self.policy.timeout_for(server, canary=True)
        for endpoint in endpoints:
            measured = await self._measure(
                lambda endpoint=endpoint: probes.canary(self.fetcher, server, endpoint, tokens=tokens, timeout=timeout,
                                                        model=key or None, api_key=self.keys.key_of(server)),
                timeout,
                canary=True,
            )
            if measured.reason is Reason.NOT_LOADED:
                # The router unloaded it since the poll: a state of the model, not a failure of the canary.
                self._unloaded(server, key, self.fleet.record_unloaded(server.name, key))
                return False
            change = self.fleet.record_canary(
                server.name, key, endpoint, tally=measured.result, reason=measured.reason, detail=measured.detail,
                duration=measured.duration, now=self._clock(), requested=tokens,
            )
            self._canaried(server, key, endpoint, measured, change)
        return True
