"""Probes of one llama-server: the poll (/props, /slots when due; a router's /models) and the canary; they know no metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol
from urllib.parse import quote

from pydantic import SecretStr

from ..endpoints import Endpoint
from ..reasons import ProbeFailure, Reason
from . import peerprobe
from .canary import TABLE, Tally, judge
from .http.fetch import Fetcher
from .llama import (
    Props,
    RouterModel,
    Slots,
    label_safe,
    model_ids,
    model_names,
    names_of,
    parse_meta,
    parse_models,
    parse_props,
    parse_slots,
)
from .logprobs import Logprobs

PLAIN = ""
"""The key of the one model of a server watched without a `model:`: its series carry no model label."""


class Target(Protocol):
    """What a probe needs to know of a server: the settings' ServerConfig is one, without probes importing settings.

    The key is not part of it: each probe is given the key to send (`api_key`), resolved for it by the runner's KeyFiles.
    """

    @property
    def url(self) -> str: ...
    @property
    def model(self) -> str | None: ...


@dataclass(frozen=True)
class PollResult:
    """One model's /props and /slots."""

    props: Props
    slots: Slots | None
    """None when the server has /slots switched off: speculation is then unknown, not off."""


@dataclass(frozen=True)
class ModelPoll:
    """What a poll found for one watched model: its status, and its answers when it is loaded."""

    status: str
    """"loaded" for a server that runs its model itself ("sleeping" while it sleeps); the router's status otherwise."""
    result: PollResult | None = None
    failure: ProbeFailure | None = None
    """Why this model's /props or /slots failed while the server itself answered."""
    slots_asked: bool = True
    """Whether /slots was asked this time; False when the known answer still held (see KnownSlots)."""

    @property
    def loaded(self) -> bool:
        return self.status == "loaded"


@dataclass(frozen=True)
class ServerPoll:
    """One poll of a server: a router with the models it lists, or a server with its one model."""

    router: bool
    models: Mapping[str, ModelPoll]
    """Keyed by model id (the router's, or the configured `model:`), or PLAIN."""


REDACTED = "[REDACTED]"
# Details are cut to a length, which can leave the start of a key at the cut: such a start is redacted
# too, down to this many characters.
MIN_KEY_FRAGMENT = 6


def redact(text: str, secret: str | None) -> str:
    """`text` without `secret`, whole or cut off, plain or as repr() escapes it."""
    if not secret:
        return text
    for form in dict.fromkeys((secret, repr(secret)[1:-1])):
        for size in range(len(form), min(len(form), MIN_KEY_FRAGMENT) - 1, -1):
            text = text.replace(form[:size], REDACTED)
    return text


def _key(api_key: SecretStr | None) -> str | None:
    return api_key.get_secret_value() if api_key is not None else None


def _redacted(failure: ProbeFailure, key: str | None) -> ProbeFailure:
    return ProbeFailure(failure.reason, redact(failure.detail, key))


@contextmanager
def _secret_free(api_key: SecretStr | None) -> Iterator[None]:
    """Failures leave without the server's API key: a hostile server or proxy may echo it into any detail."""
    key = _key(api_key)
    try:
        yield
    except ProbeFailure as failure:
        raise _redacted(failure, key) from None
    except Exception as err:  # noqa: BLE001 - a surprise is reported like any failure, minus the key
        raise ProbeFailure(Reason.INTERNAL, redact(f"{err.__class__.__name__}: {str(err)[:200]}", key)) from None


def auth_headers(api_key: SecretStr | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key.get_secret_value()}"} if api_key is not None else {}


KnownSlots = Callable[[str, Props], "tuple[bool, Slots | None]"]
"""Given a model's key and its fresh /props: (True, the known /slots answer) to reuse it, or (False, None) to ask.

/slots changes only when the process does (no request can switch speculation), and asking it wakes a sleeping server:
the watcher asks again when /props shows another process, or when its answer grew old."""


def ask_always(key: str, props: Props) -> tuple[bool, Slots | None]:
    """Ask /slots at every poll: what a one-shot check does."""
    return False, None


def _model_query(model: str) -> str:
    # autoload=false: a router answers "model is not loaded" instead of loading it. A monitor never loads a model.
    return f"?model={quote(model, safe='')}&autoload=false"


async def poll(
    fetcher: Fetcher, target: Target, *, timeout: float, known: KnownSlots = ask_always, api_key: SecretStr | None = None
) -> ServerPoll:
    """/props (and a router's /models and each loaded model's /props), and /slots unless `known` says it still holds.

    No /health: /props answers everything it does (503 while loading, before any key is checked; 401 once loaded
    when the key is wrong) and more. A server that sleeps is left asleep: its model counts as "sleeping".
    """
    with _secret_free(api_key):
        return await _poll(fetcher, target, timeout=timeout, known=known, api_key=api_key)


async def canary(
    fetcher: Fetcher, target: Target, endpoint: Endpoint, *, tokens: int, timeout: float, model: str | None = None,
    api_key: SecretStr | None = None,
) -> Tally:
    """One canary on one endpoint; `model` names a router's model (or the configured one) and is never loaded."""
    with _secret_free(api_key):
        return await _canary(fetcher, target, endpoint, tokens=tokens, timeout=timeout, model=model or None,
                             api_key=api_key)


async def peer_probe(
    fetcher: Fetcher, target: Target, prompt: int, *, timeout: float, model: str | None = None,
    api_key: SecretStr | None = None,
) -> Logprobs:
    """The peer probe's pool prompt `prompt`; `model` names a router's model (or the configured one), never loaded."""
    with _secret_free(api_key):
        query = "?autoload=false" if model else ""
        asked = peerprobe.body(peerprobe.prompts()[prompt], model)
        answer = await fetcher.post_json(f"{target.url}{peerprobe.PATH}{query}", asked, headers=auth_headers(api_key),
                                         timeout=timeout)
        logprobs, answered_by = peerprobe.read(answer)
        if model and answered_by and model not in names_of(answered_by):
            raise ProbeFailure(Reason.MODEL_MISMATCH, f"asked model {model!r}, answered by {answered_by[:100]!r}")
        return logprobs


async def gateway_poll(fetcher: Fetcher, target: Target, *, timeout: float, api_key: SecretStr | None = None) -> ServerPoll:
    """A front end that forwards only /v1/* (an OpenAI-compatible gateway): the model it serves, from /v1/models.

    Nothing else can be seen through it, so speculation is unknown (no /props, no /slots): the canaries alone decide.
    The model is named in every canary, as such gateways require.
    """
    with _secret_free(api_key):
        listing = await fetcher.get_json(f"{target.url}/v1/models", headers=auth_headers(api_key), timeout=timeout)
        ids = model_ids(listing)
        if target.model is not None:
            if target.model not in ids:
                raise ProbeFailure(Reason.MODEL_MISMATCH, f"/v1/models lists no model {target.model!r}")
            chosen = target.model
        elif len(ids) == 1:
            chosen = ids[0]
        else:
            raise ProbeFailure(Reason.MODEL_MISMATCH,
                               f"/v1/models lists {len(ids)} models: name the one the eval reads with --model")
        props = Props(speculation_types=None, total_slots=None, model=label_safe(chosen), build="")
        return ServerPoll(router=False, models=MappingProxyType({chosen: ModelPoll("loaded", PollResult(props, None))}))


async def model_meta(
    fetcher: Fetcher, target: Target, props: Props, *, timeout: float, api_key: SecretStr | None = None
) -> dict[str, str]:
    """What /v1/models says of the file of the model `props` names (its fingerprint without a token); asked once per
    process, since a running process cannot change its file."""
    with _secret_free(api_key):
        listing = await fetcher.get_json(f"{target.url}/v1/models", headers=auth_headers(api_key), timeout=timeout)
        key = _key(api_key)
        return {k: redact(v, key) for k, v in parse_meta(listing, names_of(props.model, props.file)).items()}


async def load(fetcher: Fetcher, target: Target, model: str, *, timeout: float, api_key: SecretStr | None = None) -> None:
    """Ask a router to load `model` and wait until it lists it loaded: only an explicit `specwatch check --load` does."""
    with _secret_free(api_key):
        headers = auth_headers(api_key)
        await fetcher.post_json(f"{target.url}/models/load", {"model": model}, headers=headers, timeout=timeout)
        loop = asyncio.get_running_loop()
        deadline, status = loop.time() + timeout, "unknown"
        while loop.time() < deadline:
            listing = parse_models(await fetcher.get_json(f"{target.url}/models", headers=headers, timeout=timeout))
            status = next((m.status for m in listing if m.id == model), "not listed")
            if status == "loaded":
                return
            await asyncio.sleep(0.2)
        raise ProbeFailure(Reason.TIMEOUT, f"model {model!r} not loaded within {timeout:g}s (status {status})")


def _labels_redacted(props: Props, key: str | None) -> Props:
    # model and build become labels; a server that echoes the key there must not put it on /metrics.
    return replace(props, model=redact(props.model, key), build=redact(props.build, key), file=redact(props.file, key)) \
        if key else props


async def _slots(fetcher: Fetcher, url: str, headers: dict[str, str], timeout: float) -> Slots | None:
    try:
        return parse_slots(await fetcher.get_json(url, headers=headers, timeout=timeout))
    except ProbeFailure as failure:
        if failure.reason is Reason.NOT_SUPPORTED:
            return None
        raise


async def _poll(
    fetcher: Fetcher, target: Target, *, timeout: float, known: KnownSlots, api_key: SecretStr | None
) -> ServerPoll:
    headers, key = auth_headers(api_key), _key(api_key)
    # No model in this query: a router answers for itself, and nothing gets loaded.
    raw_props = await fetcher.get_json(f"{target.url}/props", headers=headers, timeout=timeout)
    props = _labels_redacted(parse_props(raw_props), key)
    if props.router:
        listing = parse_models(await fetcher.get_json(f"{target.url}/models", headers=headers, timeout=timeout))
        wanted = [m for m in listing if target.model in (None, m.id)]
        if target.model and not wanted:
            raise ProbeFailure(Reason.MODEL_MISMATCH, f"the router lists no model {target.model!r}")
        polls = await asyncio.gather(*(_router_model(fetcher, target, m, headers, key, timeout, known) for m in wanted))
        return ServerPoll(router=True, models=MappingProxyType(dict(zip((m.id for m in wanted), polls, strict=True))))
    if target.model and target.model not in model_names(raw_props):
        raise ProbeFailure(Reason.MODEL_MISMATCH, f"configured model {target.model!r}, server runs {props.model!r}")
    key = target.model or PLAIN
    reuse, slots = known(key, props)
    if props.sleeping:
        only = ModelPoll("sleeping", PollResult(props, slots), slots_asked=False)  # asking /slots would wake it
    elif reuse:
        only = ModelPoll("loaded", PollResult(props, slots), slots_asked=False)
    else:
        only = ModelPoll("loaded", PollResult(props, await _slots(fetcher, f"{target.url}/slots", headers, timeout)))
    return ServerPoll(router=False, models=MappingProxyType({key: only}))


async def _router_model(
    fetcher: Fetcher, target: Target, model: RouterModel, headers: dict[str, str], key: str | None, timeout: float,
    known: KnownSlots,
) -> ModelPoll:
    """A loaded model's own /props and /slots, through the router; a model that is not loaded is left alone."""
    if not model.loaded:
        return ModelPoll(model.status)
    query = _model_query(model.id)
    try:
        props = parse_props(await fetcher.get_json(f"{target.url}/props{query}", headers=headers, timeout=timeout))
        if props.router:
            raise ProbeFailure(Reason.INVALID_RESPONSE, f"/props for model {model.id!r} answered for the router")
        reuse, slots = known(model.id, props)
        if not reuse:
            slots = await _slots(fetcher, f"{target.url}/slots{query}", headers, timeout)
    except ProbeFailure as failure:
        if failure.reason is Reason.NOT_LOADED:
            return ModelPoll("unloaded")  # unloaded between the listing and now
        return ModelPoll(model.status, failure=_redacted(failure, key))
    return ModelPoll(model.status, PollResult(_labels_redacted(props, key), slots), slots_asked=not reuse)


async def _canary(
    fetcher: Fetcher, target: Target, endpoint: Endpoint, *, tokens: int, timeout: float, model: str | None,
    api_key: SecretStr | None,
) -> Tally:
    spec = TABLE[endpoint]
    body = spec.body(tokens)
    query = ""
    if model:
        body["model"] = model
        query = "?autoload=false"
    url, headers = f"{target.url}{spec.path}{query}", auth_headers(api_key)
    if spec.streaming:
        answer = await fetcher.post_events(url, body, headers=headers, timeout=timeout)
    else:
        answer = await fetcher.post_json(url, body, headers=headers, timeout=timeout)
    reading = spec.read(answer)
    if model and reading.model and model not in names_of(reading.model):
        raise ProbeFailure(Reason.MODEL_MISMATCH, f"asked model {model!r}, answered by {reading.model[:100]!r}")
    return judge(spec, reading)
