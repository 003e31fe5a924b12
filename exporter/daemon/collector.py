"""The Prometheus collector: builds every metric family fresh from a state snapshot on each scrape."""

from __future__ import annotations

import ctypes
import ctypes.util
import gzip
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from exporter import __version__
from exporter.daemon.discovery import SourceStatus
from exporter.daemon.state import CanaryState, Fleet, ModelState, ServerState
from exporter.settings.schema import ServerConfig
from exporter.verdict import Verdict


@dataclass(frozen=True)
class ExporterStatus:
    poll_interval: float
    canary_interval: float
    reload_successful: bool = True
    last_reload_success_timestamp: float | None = None
    configured_servers: int | None = None
    """Servers in the config, static and discovered, before sharding; None: the ones watched."""
    discovery: tuple[SourceStatus, ...] = ()


Extra = tuple[tuple[str, str], ...]


class _ServerLabels:
    """One server's label set, with the label dict and exposition text of each extra-label combination memoised.

    Built once per ServerConfig object, so a scrape neither rebuilds dicts nor sorts and escapes label values.
    """

    __slots__ = ("_dicts", "_endpoints", "_texts", "base", "config")

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.base = {**config.labels, "server": config.name}
        self._dicts: dict[Extra, dict[str, str]] = {}
        self._texts: dict[Extra, str] = {}
        self._endpoints: dict[Extra, tuple[CanaryState, dict[str, str]]] = {}

    def endpoint_lines(self, where: Extra, canary: CanaryState) -> dict[str, str]:
        """Each family's line of one endpoint's canary state (states are immutable: the same one, the same lines)."""
        found = self._endpoints.get(where)
        if found is None or found[0] is not canary:
            if len(self._endpoints) > _MEMO_LIMIT:
                self._endpoints.clear()
            lines = _Text(frozenset())  # no counter among them
            _endpoint_samples(lines, self, where, canary)
            found = self._endpoints[where] = (canary, {name: "".join(text) for name, text in lines.lines.items()})
        return found[1]

    def labels(self, extra: Extra) -> dict[str, str]:
        found = self._dicts.get(extra)
        if found is None:
            if len(self._dicts) > _MEMO_LIMIT:
                self._dicts.clear()  # build/model labels that keep changing must not grow this forever
            found = self._dicts[extra] = {**self.base, **dict(extra)}
        return found

    def text(self, extra: Extra) -> str:
        found = self._texts.get(extra)
        if found is None:
            if len(self._texts) > _MEMO_LIMIT:
                self._texts.clear()
            # generate_latest's form: keys sorted, values escaped the same way.
            found = self._texts[extra] = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(self.labels(extra).items()))
        return found


_MEMO_LIMIT = 1024
_NO_EXTRA: Extra = ()
OUTCOMES = ("success", "failure")
_OUTCOMES: dict[str, Extra] = {outcome: (("outcome", outcome),) for outcome in OUTCOMES}
_VERDICT_LABELS: dict[Verdict, Extra] = {state: (("verdict", state.value),) for state in Verdict}


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


class _Families:
    """Metric families for one scrape, for the registry's encoders."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str) -> None:
        self.families[name] = GaugeMetricFamily(name, doc, labels=[])

    def counter(self, name: str, doc: str) -> None:
        self.families[name] = CounterMetricFamily(name, doc, labels=[])

    def add(self, name: str, labels: _ServerLabels | None, extra: Extra, value: float) -> None:
        family = self.families[name]
        sample = f"{name}_total" if family.type == "counter" else name
        family.add_sample(sample, labels.labels(extra) if labels is not None else dict(extra), value)


class _Text:
    """The same samples as exposition lines, grouped per family in the order they were added."""

    def __init__(self, counters: frozenset[str]) -> None:
        self.lines: dict[str, list[str]] = {}
        self._counters = counters
        # Consecutive samples mostly share one label set (a server's endpoint): skip the memo lookup for them.
        self._last: tuple[_ServerLabels | None, Extra, str] = (None, _NO_EXTRA, "")

    def add(self, name: str, labels: _ServerLabels | None, extra: Extra, value: float) -> None:
        last_labels, last_extra, label_text = self._last
        if labels is None:
            label_text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(extra))
        elif labels is not last_labels or extra is not last_extra:
            label_text = labels.text(extra)
            self._last = (labels, extra, label_text)
        sample = f"{name}_total" if name in self._counters else name
        line = f"{sample}{{{label_text}}} {_number(value)}\n" if label_text else f"{sample} {_number(value)}\n"
        lines = self.lines.get(name)
        if lines is None:
            lines = self.lines[name] = []
        lines.append(line)

    def extend(self, families: dict[str, str]) -> None:
        """Add each family's lines, already written."""
        for name, more in families.items():
            lines = self.lines.get(name)
            if lines is None:
                self.lines[name] = [more]
            else:
                lines.append(more)


_SMALL_INTS = {i: floatToGoString(i) for i in range(-1, 1025)}


def _number(value: float) -> str:
    """floatToGoString, with the small integers most samples carry looked up instead of formatted."""
    if type(value) is int:
        found = _SMALL_INTS.get(value)
        if found is not None:
            return found
    return floatToGoString(value)


Out = _Families | _Text


@dataclass(frozen=True)
class _Family:
    name: str
    kind: str
    doc: str


# Static text: the configured intervals are samples of their own (specwatch_poll_interval_seconds and
# specwatch_canary_interval_seconds), so every header is encoded once.
_CACHED = "Cached from the last successful canary, refreshed every canary_interval."
_POLLED = "From the last poll, every poll_interval."
SERVER_FAMILIES: tuple[_Family, ...] = (
        _Family(
            "specwatch_up", "gauge", f"1 when the last poll of /health, /props and /slots got valid answers, else 0. {_POLLED}"
        ),
        _Family(
            "specwatch_speculation_enabled", "gauge",
            f"1 when the endpoint named by source reports speculative decoding on, 0 off; absent when unknown. {_POLLED}",
        ),
        _Family(
            "specwatch_speculation_contradiction", "gauge",
            "1 when /slots reports speculation on while /props reports none (a config audit reading /props is misled). "
            + _POLLED,
        ),
        _Family("specwatch_slots", "gauge", f"Total slots (parallel sequences) of the server. {_POLLED}"),
        _Family("specwatch_server_info", "gauge", f"Build and model the server reports; always 1. {_POLLED}"),
        _Family("specwatch_poll_duration_seconds", "gauge", "Wall time of the last poll."),
        _Family("specwatch_last_poll_success_timestamp_seconds", "gauge", "Unix time of the last successful poll."),
        _Family("specwatch_polls", "counter", "Polls of the server by outcome (success, failure); both from the first poll."),
        _Family("specwatch_poll_failures", "counter", "Failed polls by reason (a closed set; see the README)."),
        _Family(
            "specwatch_model_loaded", "gauge",
            f"Router models: 1 when the router reports the model loaded, 0 otherwise (never loaded by specwatch). {_POLLED}",
        ),
        _Family(
            "specwatch_canary_placeholder_ratio", "gauge",
            f"Share of the canary's tokens after the first that are fill-ins (placeholder logprobs). {_CACHED}",
        ),
        _Family("specwatch_canary_tokens", "gauge", f"Tokens in the canary's answer. {_CACHED}"),
        _Family(
            "specwatch_canary_placeholder_tokens", "gauge",
            f"Fill-ins (placeholder logprobs: 0.0 with no alternatives) among the canary's tokens. {_CACHED}",
        ),
        _Family(
            "specwatch_canary_mean_logprob", "gauge",
            f"Mean logprob of the canary's answer, as an eval would compute it from the values the response carries. {_CACHED}",
        ),
        _Family(
            "specwatch_canary_draft_tokens", "gauge",
            f"Tokens the server drafted for the canary (timings.draft_n), when reported. {_CACHED}",
        ),
        _Family(
            "specwatch_serving_placeholders", "gauge",
            "1 when the last successful canary of any endpoint found fill-ins (placeholder logprobs), else 0; kept while "
            f"the server is down. specwatch_verdict is the decision alerts and `specwatch check` use. {_CACHED}",
        ),
        _Family(
            "specwatch_verdict", "gauge",
            "The verdict on the server's logprobs; exactly one of the four is 1. clean: every token carries its "
            "alternatives; fill_ins: a canary found fill-ins; unproven: speculating per /slots or /props and no canary "
            "drafted; unchecked: not polled, down, unauthorised, no logprobs, or an endpoint not checked.",
        ),
        _Family(
            "specwatch_canary_success", "gauge",
            "1 when the last canary of the endpoint completed and could be classified, else 0.",
        ),
        _Family("specwatch_canary_duration_seconds", "gauge", "Wall time of the last canary of the endpoint."),
        _Family(
            "specwatch_canary_last_success_timestamp_seconds", "gauge", "Unix time of the last successful canary of the endpoint."
        ),
        _Family("specwatch_canaries", "counter", "Canaries by outcome (success, failure); both from the first canary."),
        _Family("specwatch_canary_failures", "counter", "Failed canaries by endpoint and reason (a closed set; see the README)."),
        _Family(
            "specwatch_canary_requested_tokens", "counter",
            "Tokens the canaries asked the server to generate: the price of watching it, in its own tokens.",
        ),
        _Family("specwatch_canary_generated_tokens", "counter", "Tokens in the answers of successful canaries."),
    )


def _exporter_samples(out: Out, status: ExporterStatus, servers: int) -> list[_Family]:
    """The exporter's own families, after the per-server ones; returns them so the text form can write their headers."""
    families = [
        _Family("specwatch_build_info", "gauge", "specwatch's version; always 1."),
        _Family("specwatch_poll_interval_seconds", "gauge", "The configured poll_interval."),
        _Family("specwatch_canary_interval_seconds", "gauge", "The configured canary_interval; alerts scale staleness with it."),
        _Family("specwatch_servers", "gauge", "Servers this exporter watches (its shard of the configured ones)."),
        _Family(
            "specwatch_configured_servers", "gauge",
            "Servers in the configuration, static and discovered, before sharding: what all replicas together watch.",
        ),
        _Family(
            "specwatch_config_last_reload_successful", "gauge", "1 when the last configuration load or reload succeeded, else 0."
        ),
    ]
    if status.last_reload_success_timestamp is not None:
        families.append(_Family(
            "specwatch_config_last_reload_success_timestamp_seconds", "gauge",
            "Unix time of the last successful configuration load or reload.",
        ))
    if status.discovery:
        families += [
            _Family("specwatch_discovery_targets", "gauge", "Servers a discovery source (file_sd, http_sd) gives now."),
            _Family(
                "specwatch_discovery_refresh_successful", "gauge",
                "1 when the source's last refresh was accepted; 0 when a file or answer was refused (its old targets stay).",
            ),
            _Family(
                "specwatch_discovery_last_success_timestamp_seconds", "gauge", "Unix time of the source's last good refresh."
            ),
        ]
    if isinstance(out, _Families):
        for family in families:
            out.gauge(family.name, family.doc)
    out.add("specwatch_build_info", None, (("version", __version__),), 1)
    out.add("specwatch_poll_interval_seconds", None, _NO_EXTRA, status.poll_interval)
    out.add("specwatch_canary_interval_seconds", None, _NO_EXTRA, status.canary_interval)
    out.add("specwatch_servers", None, _NO_EXTRA, servers)
    out.add("specwatch_configured_servers", None, _NO_EXTRA,
            servers if status.configured_servers is None else status.configured_servers)
    out.add("specwatch_config_last_reload_successful", None, _NO_EXTRA, 1 if status.reload_successful else 0)
    if status.last_reload_success_timestamp is not None:
        out.add("specwatch_config_last_reload_success_timestamp_seconds", None, _NO_EXTRA, status.last_reload_success_timestamp)
    for source in status.discovery:
        where = (("source", source.source),)
        out.add("specwatch_discovery_targets", None, where, source.targets)
        if source.ok is not None:
            out.add("specwatch_discovery_refresh_successful", None, where, int(source.ok))
        if source.last_success_timestamp is not None:
            out.add("specwatch_discovery_last_success_timestamp_seconds", None, where, source.last_success_timestamp)
    return families


# Durations to a tenth of a millisecond and times to the millisecond: the digits beyond are noise, and these values
# change at every poll or canary, so their length is what every scrape formats and compresses.
def _duration(seconds: float) -> float:
    return round(seconds, 4)


def _timestamp(seconds: float) -> float:
    return round(seconds, 3)


def _poll_timing_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    if server.poll_success is not None:
        out.add("specwatch_up", labels, _NO_EXTRA, 1 if server.poll_success else 0)
        out.add("specwatch_poll_duration_seconds", labels, _NO_EXTRA, _duration(server.poll_duration_seconds or 0.0))
    if server.last_poll_success_timestamp is not None:
        out.add("specwatch_last_poll_success_timestamp_seconds", labels, _NO_EXTRA,
                _timestamp(server.last_poll_success_timestamp))


def _poll_count_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    for outcome in OUTCOMES:
        out.add("specwatch_polls", labels, _OUTCOMES[outcome], server.poll_outcomes.get(outcome, 0))
    for reason, count in sorted(server.poll_failures.items()):
        out.add("specwatch_poll_failures", labels, (("reason", reason.value),), count)


def _model_extra(key: str) -> Extra:
    """The model label of a model's series: absent for a server watched without a `model:`."""
    return (("model", key),) if key else _NO_EXTRA


def _poll_answer_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    for key, model in server.models.items():
        extra = _model_extra(key)
        if server.router:
            out.add("specwatch_model_loaded", labels, extra, int(model.loaded))
        poll = model.poll
        if poll is None:
            continue
        props_on = poll.props.speculative
        slots_on = poll.slots.speculative if poll.slots is not None else None
        if slots_on is not None:
            out.add("specwatch_speculation_enabled", labels, (*extra, ("source", "slots")), int(slots_on))
        if props_on is not None:
            out.add("specwatch_speculation_enabled", labels, (*extra, ("source", "props")), int(props_on))
        if slots_on is not None and props_on is not None:
            out.add("specwatch_speculation_contradiction", labels, extra, int(slots_on and not props_on))
        slots = poll.props.total_slots if poll.props.total_slots is not None else (poll.slots.count if poll.slots else None)
        if slots is not None:
            out.add("specwatch_slots", labels, extra, slots)
        # A model's series name it already; a server's one model is named by what it reports.
        out.add("specwatch_server_info", labels, (("build", poll.props.build), *(extra or (("model", poll.props.model),))), 1)


def _canary_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    for key, model in server.models.items():
        _model_canary_samples(out, model, labels, _model_extra(key))


def _model_canary_samples(out: Out, model: ModelState, labels: _ServerLabels, extra: Extra) -> None:
    for endpoint, canary in sorted(model.canaries.items()):
        where = (("endpoint", endpoint.value), *extra)
        if type(out) is _Text:
            # A rotation canary changes one endpoint's state: the other endpoints' lines are reused.
            out.extend(labels.endpoint_lines(where, canary))
        else:
            _endpoint_samples(out, labels, where, canary)
    for outcome in OUTCOMES:
        out.add("specwatch_canaries", labels, (*extra, ("outcome", outcome)), model.canary_outcomes.get(outcome, 0))
    for (endpoint, reason), count in sorted(model.canary_failures.items()):
        out.add("specwatch_canary_failures", labels, (("endpoint", endpoint.value), *extra, ("reason", reason.value)), count)
    out.add("specwatch_canary_requested_tokens", labels, extra, model.canary_tokens.get("requested", 0))
    out.add("specwatch_canary_generated_tokens", labels, extra, model.canary_tokens.get("generated", 0))
    serving = model.serving_fill_ins
    if serving is not None:
        out.add("specwatch_serving_placeholders", labels, extra, int(serving))


def _endpoint_samples(out: Out, labels: _ServerLabels, where: Extra, canary: CanaryState) -> None:
    out.add("specwatch_canary_success", labels, where, int(canary.success))
    out.add("specwatch_canary_duration_seconds", labels, where, _duration(canary.duration_seconds))
    if canary.last_success_timestamp is not None:
        out.add("specwatch_canary_last_success_timestamp_seconds", labels, where, _timestamp(canary.last_success_timestamp))
    tally = canary.tally
    if tally is None:
        return
    out.add("specwatch_canary_placeholder_ratio", labels, where, tally.fill_in_ratio)
    out.add("specwatch_canary_tokens", labels, where, tally.tokens)
    out.add("specwatch_canary_placeholder_tokens", labels, where, tally.fill_ins)
    if tally.mean_logprob is not None:
        out.add("specwatch_canary_mean_logprob", labels, where, tally.mean_logprob)
    if tally.draft_n is not None:
        out.add("specwatch_canary_draft_tokens", labels, where, tally.draft_n)


def _verdict_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    for key, model in server.models.items():
        extra = _model_extra(key)
        verdict = model.decision.verdict
        for state in Verdict:
            out.add("specwatch_verdict", labels, (*extra, *_VERDICT_LABELS[state]), int(state is verdict))


def _poll_samples(out: Out, server: ServerState, labels: _ServerLabels) -> None:
    if type(out) is _Text:
        _poll_lines(out, server, labels)
        return
    _poll_timing_samples(out, server, labels)
    _poll_count_samples(out, server, labels)


def _poll_lines(out: _Text, server: ServerState, labels: _ServerLabels) -> None:
    """_poll_timing_samples() and _poll_count_samples() as text, written out: every poll of every server comes here."""
    lines, base = out.lines, labels.text(_NO_EXTRA)
    if server.poll_success is not None:
        lines["specwatch_up"] = [f"specwatch_up{{{base}}} {'1.0' if server.poll_success else '0.0'}\n"]
        duration = _number(_duration(server.poll_duration_seconds or 0.0))
        lines["specwatch_poll_duration_seconds"] = [f"specwatch_poll_duration_seconds{{{base}}} {duration}\n"]
    if server.last_poll_success_timestamp is not None:
        stamp = _number(_timestamp(server.last_poll_success_timestamp))
        lines["specwatch_last_poll_success_timestamp_seconds"] = [
            f"specwatch_last_poll_success_timestamp_seconds{{{base}}} {stamp}\n"
        ]
    outcomes = server.poll_outcomes
    lines["specwatch_polls"] = [f"specwatch_polls_total{{{labels.text(_OUTCOMES[o])}}} {_number(outcomes.get(o, 0))}\n"
                                for o in OUTCOMES]
    if server.poll_failures:
        lines["specwatch_poll_failures"] = [
            f"specwatch_poll_failures_total{{{labels.text((('reason', reason.value),))}}} {_number(count)}\n"
            for reason, count in sorted(server.poll_failures.items())
        ]


def _poll_key(server: ServerState) -> tuple[object, ...]:
    """What a poll changes every time: its timing and counters."""
    return (server.poll_success, server.poll_duration_seconds, server.last_poll_success_timestamp, server.poll_outcomes,
            server.poll_failures)


def _answers_key(server: ServerState) -> tuple[object, ...]:
    """What the poll-answer lines of a server depend on: a model's fingerprint holds every value they show."""
    return (server.router, tuple((key, m.status, None if m.poll is None else m.seen) for key, m in server.models.items()))


def _canaries_key(server: ServerState) -> tuple[object, ...]:
    """What the canary lines of a server depend on: kept by identity through polls, replaced by each canary."""
    return tuple((key, m.canaries, m.canary_failures, m.canary_outcomes, m.canary_tokens) for key, m in server.models.items())


def _verdict_key(server: ServerState) -> tuple[object, ...]:
    """The verdict of each model: a poll makes a new model state, but rarely another verdict (decided once per state,
    and already by the watcher when it logs a change)."""
    return tuple((key, m.decision.verdict) for key, m in server.models.items())


@dataclass(frozen=True)
class _Group:
    """Per-server lines of some families, a function of `key(server)` alone."""

    build: str
    """The name of the sample function in this module (looked up at each use)."""
    key: Callable[[ServerState], tuple[object, ...]]
    families: tuple[str, ...]


_GROUPS = (
    _Group("_poll_samples", _poll_key,
           ("specwatch_up", "specwatch_poll_duration_seconds", "specwatch_last_poll_success_timestamp_seconds",
            "specwatch_polls", "specwatch_poll_failures")),
    _Group("_poll_answer_samples", _answers_key,
           ("specwatch_model_loaded", "specwatch_speculation_enabled", "specwatch_speculation_contradiction", "specwatch_slots",
            "specwatch_server_info")),
    _Group("_canary_samples", _canaries_key,
           ("specwatch_canary_success", "specwatch_canary_duration_seconds", "specwatch_canary_last_success_timestamp_seconds",
            "specwatch_canary_placeholder_ratio", "specwatch_canary_tokens", "specwatch_canary_placeholder_tokens",
            "specwatch_canary_mean_logprob", "specwatch_canary_draft_tokens", "specwatch_canaries",
            "specwatch_canary_failures", "specwatch_canary_requested_tokens", "specwatch_canary_generated_tokens",
            "specwatch_serving_placeholders")),
    _Group("_verdict_samples", _verdict_key, ("specwatch_verdict",)),
)
_COUNTERS = frozenset(f.name for f in SERVER_FAMILIES if f.kind == "counter")
_UNSET = object()


def _tail(status: ExporterStatus, servers: int) -> bytes:
    """The exporter's own families, after the servers'."""
    out = _Text(frozenset())
    families = _exporter_samples(out, status, servers)
    return "".join([_header(family) + "".join(out.lines.get(family.name, ())) for family in families]).encode()


def _header(family: _Family) -> str:
    name = f"{family.name}_total" if family.kind == "counter" else family.name
    doc = family.doc.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {name} {doc}\n# TYPE {name} {family.kind}\n"


_HEADERS: dict[str, bytes] = {f.name: _header(f).encode() for f in SERVER_FAMILIES}
GZIP_LEVEL = 1  # text metrics shrink about fifteenfold even at the fastest level
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"  # deflate, no name, mtime 0, fastest, unknown OS
_GZIP_LAST_BLOCK = b"\x03\x00"  # an empty final block: ends the deflate stream


def _deflate(*parts: bytes) -> bytes:
    """`parts` as raw deflate blocks ending on a byte boundary, without ending the stream: such runs concatenate."""
    compressor = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)
    return b"".join([*(compressor.compress(part) for part in parts), compressor.flush(zlib.Z_SYNC_FLUSH)])


def _load_crc32_combine() -> Callable[[int, int, int], int] | None:
    """zlib's crc32_combine() from the zlib library Python's own zlib module uses; None where it cannot be loaded."""
    try:
        library = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1")
        combine = library.crc32_combine
    except (OSError, AttributeError):
        return None
    combine.restype, combine.argtypes = ctypes.c_ulong, [ctypes.c_ulong, ctypes.c_ulong, ctypes.c_long]
    return combine if combine(zlib.crc32(b"ab"), zlib.crc32(b"cd"), 2) == zlib.crc32(b"abcd") else None


_crc32_combine = _load_crc32_combine()


def gzip_member(blocks: Sequence[_Block], tail: bytes = b"") -> bytes:
    """One gzip member of the blocks' texts and `tail`, what gzip.compress() of them joined would decompress to: each
    block's deflate run and CRC are computed once, and the CRCs combined (a whole body's CRC took 2 to 9 ms)."""
    crc, size, deflated = 0, 0, [_GZIP_HEADER]
    for block in blocks:
        crc = _crc32_combine(crc, block.crc, len(block.text)) if _crc32_combine else zlib.crc32(block.text, crc)
        size += len(block.text)
        deflated.append(block.run)
    if tail:
        crc = zlib.crc32(tail, crc)
        size += len(tail)
        deflated.append(_deflate(tail))
    deflated += [_GZIP_LAST_BLOCK, struct.pack("<II", crc, size & 0xFFFFFFFF)]
    return b"".join(deflated)


class _Entry:
    """One server's lines, each family's joined, and the key each group of them was built from."""

    __slots__ = ("keys", "labels", "lines", "state")

    def __init__(self, labels: _ServerLabels) -> None:
        self.labels = labels
        self.state: ServerState | None = None
        """The state the lines were last brought up to date with: states are immutable, so the same one needs nothing."""
        self.keys: list[object] = [_UNSET] * len(_GROUPS)
        self.lines: dict[str, str] = {}


class _Block:
    """One family for the whole fleet: its header and every server's lines, in fleet order; its deflate run and CRC."""

    __slots__ = ("_crc", "_run", "text")

    def __init__(self, text: bytes) -> None:
        self.text = text
        self._run: bytes | None = None
        self._crc: int | None = None

    @property
    def run(self) -> bytes:
        if self._run is None:
            self._run = _deflate(self.text)
        return self._run

    @property
    def crc(self) -> int:
        if self._crc is None:
            self._crc = zlib.crc32(self.text)
        return self._crc


class SpecwatchCollector(Collector):
    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        self._fleet = fleet
        self._status = status
        self._labels: dict[str, _ServerLabels] = {}
        self._entries: dict[str, _Entry] = {}
        self._order: tuple[str, ...] = ()
        self._columns: dict[str, list[str]] = {}
        """Each family's lines per server, in fleet order: a block is one join."""
        self._blocks: dict[str, _Block] = {}
        self._prepared: tuple[float, ExporterStatus, list[_Block]] | None = None
        self._render_lock = threading.Lock()

    def _labels_for(self, server: ServerState) -> _ServerLabels:
        found = self._labels.get(server.config.name)
        if found is None or found.config is not server.config:
            found = self._labels[server.config.name] = _ServerLabels(server.config)
        return found

    def collect(self) -> Iterator[Metric]:
        with self._render_lock:  # the memos are shared by scrapes on several HTTP threads
            status = self._status()
            servers = self._fleet.snapshot()
            out = _Families()
            for family in SERVER_FAMILIES:
                (out.counter if family.kind == "counter" else out.gauge)(family.name, family.doc)
            for server in servers:
                labels = self._labels_for(server)
                for group in _GROUPS:
                    globals()[group.build](out, server, labels)
            _exporter_samples(out, status, len(servers))
            self._forget_removed(servers)
        yield from out.families.values()

    def exposition(self) -> bytes:
        """These families in the Prometheus text format, byte for byte what generate_latest() makes of collect()."""
        with self._render_lock:
            blocks, tail = self._current()
            return b"".join([*(block.text for block in blocks), tail])

    def exposition_gzip(self, extra: bytes = b"") -> bytes:
        """exposition() + `extra`, gzipped: each family's deflate run is reused until one of its lines changes."""
        with self._render_lock:
            blocks, tail = self._current()
            return gzip_member(blocks, tail + extra)

    def prepare(self) -> None:
        """Render what changed now, compressed, for the scrapes of the next PREPARED_FOR seconds."""
        with self._render_lock:
            status = self._status()
            blocks, _ = self._render()
            for block in blocks:
                block.run, block.crc  # noqa: B018 - computed once, kept by the block
            self._prepared = (time.monotonic(), status, blocks)

    def _current(self) -> tuple[list[_Block], bytes]:
        """What prepare() made, while it is recent and the servers and settings are the ones it saw; else rendered now.

        A sample is then served up to PREPARED_FOR seconds after its probe recorded it (its value is as old as its
        poll or canary anyway); a reload, or a server added or removed, is served at once.
        """
        prepared, self._prepared = self._prepared, None
        if prepared is not None and time.monotonic() - prepared[0] < PREPARED_FOR:
            _, status, blocks = prepared
            servers = self._fleet.snapshot()
            # Compared by value: a status function may build a new, equal status on every call.
            if status == self._status() and self._order == tuple(s.config.name for s in servers):
                self._prepared = prepared
                return blocks, _tail(status, len(servers))
        return self._render()

    def _render(self) -> tuple[list[_Block], bytes]:
        """Each server family's block, brought up to date, and the exporter's own families.

        generate_latest() took 0.5 s for 1,000 servers. Here label text is built once per server config; a server's
        lines are rebuilt only for the groups of families whose inputs changed (a poll's timing and counters at each
        poll, its answers when they differ, its canary lines after a canary, its verdict when the evidence changes);
        a family's fleet-wide block only when one of its servers' lines did; and its compressed form with it.
        """
        status = self._status()
        servers = self._fleet.snapshot()
        entries = self._entries
        names = tuple(s.config.name for s in servers)
        reordered = names != self._order or len(self._blocks) != len(SERVER_FAMILIES)
        changed: set[str] = set()
        cells: list[tuple[str, int, str]] = []
        ordered: list[_Entry] = []
        build = globals()
        for position, server in enumerate(servers):
            entry = entries.get(names[position])
            if entry is not None and entry.state is server:  # states are immutable: nothing changed, config included
                ordered.append(entry)
                continue
            labels = self._labels_for(server)
            if entry is None or entry.labels is not labels:
                if entry is not None:
                    reordered = True  # its families may now have no line of it: every column is laid anew
                entry = entries[names[position]] = _Entry(labels)
            ordered.append(entry)
            entry.state = server
            keys, lines = entry.keys, entry.lines
            for index, group in enumerate(_GROUPS):
                key = group.key(server)
                if keys[index] is not _UNSET and keys[index] == key:
                    continue
                keys[index] = key
                out = _Text(_COUNTERS)
                build[group.build](out, server, labels)
                for family in group.families:
                    found = out.lines.get(family)
                    text = "".join(found) if found else ""
                    if lines.get(family, "") != text:
                        lines[family] = text
                        changed.add(family)
                        cells.append((family, position, text))
        if reordered:
            self._order = names
            self._forget_removed(servers)
            self._columns = {f: [e.lines.get(f, "") for e in ordered] for f in _HEADERS}
            changed.update(_HEADERS)
        else:
            columns = self._columns
            for family, position, text in cells:
                columns[family][position] = text
        for family in changed:
            self._blocks[family] = _Block(_HEADERS[family] + "".join(self._columns[family]).encode())
        return [self._blocks[f.name] for f in SERVER_FAMILIES], _tail(status, len(servers))

    def _forget_removed(self, servers: list[ServerState]) -> None:
        count = len(servers)
        if len(self._labels) > count or len(self._entries) > count:
            names = {s.config.name for s in servers}
            for memo in (self._labels, self._entries):
                for name in [n for n in memo if n not in names]:
                    del memo[name]

    def memo_sizes(self) -> dict[str, int]:
        """How many servers each per-server memo holds: none beyond the watched ones."""
        return {"labels": len(self._labels), "entries": len(self._entries), "blocks": len(self._blocks)}


class _Delegate:
    """Puts one registry's metrics into another, so OpenMetrics scrapes see everything."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        return self._registry.collect()


class Exposition:
    """What /metrics serves: specwatch's families and the process' own, in the format the scraper asks for."""

    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        self.collector = SpecwatchCollector(fleet, status)
        self._process = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self._process)
        PlatformCollector(registry=self._process)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.registry.register(_Delegate(self._process))
        self._preparing: threading.Thread | None = None
        self._starting = threading.Lock()

    def _prepare_in_background(self) -> None:
        """From the first scrape on, what changed is rendered every PREPARE_SECONDS in a thread of its own.

        A poll changes a server's lines at every poll_interval; rendering them at the scrape made a scrape of 1,000
        servers take 20 ms of CPU (40 ms while the probes held the interpreter half the time). Rendered as they
        change (2% of the daemon's CPU at 1,000 servers), a scrape only joins what is ready. Nothing runs before
        the first scrape.
        """
        if self._preparing is not None:
            return
        with self._starting:  # two first scrapes at once start one thread
            if self._preparing is None:
                self._preparing = threading.Thread(
                    target=_prepare_forever, args=(weakref.ref(self.collector),), name="specwatch-metrics", daemon=True
                )
                self._preparing.start()

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this Accept header (None: the text format)."""
        self._prepare_in_background()
        encoder, content_type = choose_encoder(accept or "")
        if content_type.startswith("text/plain"):
            # The classic text format is what the web handler asks for whenever the scraper accepts it.
            return self.collector.exposition() + generate_latest(self._process), content_type
        return encoder(self.registry), content_type

    def render_gzip(self, accept: str | None) -> tuple[bytes, str]:
        """render(), gzipped; the text format reuses each unchanged family's compressed form."""
        self._prepare_in_background()
        encoder, content_type = choose_encoder(accept or "")
        if content_type.startswith("text/plain"):
            return self.collector.exposition_gzip(generate_latest(self._process)), content_type
        return gzip.compress(encoder(self.registry), compresslevel=GZIP_LEVEL, mtime=0), content_type


PREPARE_SECONDS = 1.0
PREPARED_FOR = 2 * PREPARE_SECONDS
"""How long a scrape serves what the background thread prepared: one period, and another for it to run late."""


def _prepare_forever(collector: weakref.ReferenceType[SpecwatchCollector]) -> None:
    """Prepare the collector's exposition every PREPARE_SECONDS while it exists (a weak reference: it is not kept)."""
    while True:
        time.sleep(PREPARE_SECONDS)
        found = collector()
        if found is None:
            return
        try:
            found.prepare()
        except Exception:  # noqa: BLE001 - a scrape renders again and reports the error itself
            pass
        del found
