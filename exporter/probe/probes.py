"""Probes of one llama-server: the poll (/health, /props, /slots) and the canary; they know no metrics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol
from urllib.parse import quote

from pydantic import SecretStr

from exporter.probe.canary import TABLE, Endpoint, Tally, classify
from exporter.probe.fetch import Fetcher
from exporter.probe.llama import Props, Slots, model_names, parse_props, parse_slots
from exporter.reasons import ProbeFailure, Reason


class Target(Protocol):
    """What a probe needs to know of a server: the settings' ServerConfig is one, without probes importing settings."""

    @property
    def url(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def api_key(self) -> SecretStr | None: ...


@dataclass(frozen=True)
class PollResult:
    props: Props
    slots: Slots | None
    """None when the server has /slots switched off: speculation is then unknown, not off."""


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


@contextmanager
def _secret_free(server: Target) -> Iterator[None]:
    """Failures leave without the server's API key: a hostile server or proxy may echo it into any detail."""
    key = server.api_key.get_secret_value() if server.api_key is not None else None
    try:
        yield
    except ProbeFailure as failure:
        raise ProbeFailure(failure.reason, redact(failure.detail, key)) from None
    except Exception as err:  # noqa: BLE001 - a surprise is reported like any failure, minus the key
        raise ProbeFailure(Reason.INTERNAL, redact(f"{err.__class__.__name__}: {str(err)[:200]}", key)) from None


def auth_headers(server: Target) -> dict[str, str]:
    key = server.api_key
    return {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else {}


def _model_query(server: Target) -> str:
    return f"?model={quote(server.model, safe='')}" if server.model else ""


async def poll(fetcher: Fetcher, server: Target, *, timeout: float) -> PollResult:
    with _secret_free(server):
        return await _poll(fetcher, server, timeout=timeout)


async def canary(fetcher: Fetcher, server: Target, endpoint: Endpoint, *, tokens: int, timeout: float) -> Tally:
    with _secret_free(server):
        return await _canary(fetcher, server, endpoint, tokens=tokens, timeout=timeout)


async def _poll(fetcher: Fetcher, server: Target, *, timeout: float) -> PollResult:
    headers = auth_headers(server)
    await fetcher.get_json(f"{server.url}/health", headers=headers, timeout=timeout)
    raw_props = await fetcher.get_json(f"{server.url}/props{_model_query(server)}", headers=headers, timeout=timeout)
    props = parse_props(raw_props)
    if server.api_key is not None:
        # model and build become labels; a server that echoes the key there must not put it on /metrics.
        key = server.api_key.get_secret_value()
        props = replace(props, model=redact(props.model, key), build=redact(props.build, key))
    if server.model and server.model not in model_names(raw_props):
        raise ProbeFailure(Reason.MODEL_MISMATCH, f"configured model {server.model!r}, server runs {props.model!r}")
    try:
        raw_slots = await fetcher.get_json(f"{server.url}/slots{_model_query(server)}", headers=headers, timeout=timeout)
    except ProbeFailure as failure:
        if failure.reason is Reason.NOT_SUPPORTED:
            return PollResult(props=props, slots=None)
        raise
    return PollResult(props=props, slots=parse_slots(raw_slots))


async def _canary(fetcher: Fetcher, server: Target, endpoint: Endpoint, *, tokens: int, timeout: float) -> Tally:
    spec = TABLE[endpoint]
    body = spec.body(tokens)
    if server.model:
        body["model"] = server.model
    url, headers = f"{server.url}{spec.path}", auth_headers(server)
    if spec.streaming:
        answer = await fetcher.post_events(url, body, headers=headers, timeout=timeout)
    else:
        answer = await fetcher.post_json(url, body, headers=headers, timeout=timeout)
    return classify(spec.read(answer))
