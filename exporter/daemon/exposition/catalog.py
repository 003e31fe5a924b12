"""Every metric family specwatch exports, declared once: name, kind, labels and HELP, as node_exporter's typed descs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...core.evidence import FLOOR, UNIFORM_FLOOR


@dataclass(frozen=True)
class Family:
    name: str
    kind: Literal["gauge", "counter"]
    labels: tuple[str, ...]
    """Labels of its own; a server's series also carry `server`, its static labels and, for a router's model, `model`."""
    help: str

    @property
    def sample(self) -> str:
        """The sample name: counters end in _total."""
        return f"{self.name}_total" if self.kind == "counter" else self.name


# Static text: the configured intervals are samples of their own (specwatch_poll_interval_seconds and
# specwatch_canary_interval_seconds), so every header is encoded once.
_CACHED = "Cached from the last successful canary, refreshed every canary_interval."
_POLLED = "From the last poll, every poll_interval."
_FINGERPRINT = ("peer_group", "build", "file", "ftype", "size", "n_params", "n_vocab", "n_ctx_train", "n_embd")
SERVER: tuple[Family, ...] = (
    Family("specwatch_up", "gauge", (),
           f"1 when the last poll (/props, and /slots when due) got valid answers, else 0. {_POLLED}"),
    Family("specwatch_speculation_enabled", "gauge", ("source",),
           f"1 when the endpoint named by source reports speculative decoding on, 0 off; absent when unknown. {_POLLED}"),
    Family("specwatch_speculation_contradiction", "gauge", (),
           "1 when /slots reports speculation on while /props reports none (a config audit reading /props is misled). "
           + _POLLED),
    Family("specwatch_slots", "gauge", (), f"Total slots (parallel sequences) of the server. {_POLLED}"),
    Family("specwatch_server_info", "gauge", ("build", "model"), f"Build and model the server reports; always 1. {_POLLED}"),
    Family("specwatch_poll_duration_seconds", "gauge", (), "Wall time of the last poll."),
    Family("specwatch_last_poll_success_timestamp_seconds", "gauge", (), "Unix time of the last successful poll."),
    Family("specwatch_polls", "counter", ("outcome",),
           "Polls of the server by outcome (success, failure); both from the first poll."),
    Family("specwatch_poll_failures", "counter", ("reason",), "Failed polls by reason (a closed set; see the README)."),
    Family("specwatch_model_loaded", "gauge", ("model",),
           f"Router models: 1 when the router reports the model loaded, 0 otherwise (never loaded by specwatch). {_POLLED}"),
    Family("specwatch_canary_placeholder_ratio", "gauge", ("endpoint",),
           f"Share of the canary's tokens after the first that are fill-ins (placeholder logprobs). {_CACHED}"),
    Family("specwatch_canary_tokens", "gauge", ("endpoint",),
           "Tokens after the first in the canary's answer: the ones judged (the first is always real), so "
           f"specwatch_canary_placeholder_tokens / specwatch_canary_tokens is the placeholder ratio. {_CACHED}"),
    Family("specwatch_canary_placeholder_tokens", "gauge", ("endpoint",),
           f"Fill-ins (placeholder logprobs: 0.0 with no alternatives) among the canary's tokens after the first. {_CACHED}"),
    Family("specwatch_canary_mean_logprob", "gauge", ("endpoint",),
           f"Mean logprob of the canary's answer, as an eval would compute it from the values the response carries. {_CACHED}"),
    Family("specwatch_canary_draft_tokens", "gauge", ("endpoint",),
           f"Tokens the server drafted for the canary (timings.draft_n), when reported. {_CACHED}"),
    Family("specwatch_serving_placeholders", "gauge", (),
           "1 when the last successful canary of any endpoint found fill-ins (placeholder logprobs), else 0; kept while "
           f"the server is down. specwatch_verdict is the decision alerts and `specwatch check` use. {_CACHED}"),
    Family("specwatch_verdict", "gauge", ("verdict",),
           "The verdict on the server's logprobs; exactly one of the four is 1. clean: every token carries its "
           "alternatives; fill_ins: a canary found fill-ins; unproven: speculating per /slots or /props and no canary "
           "drafted; unchecked: not polled, down, unauthorised, no logprobs, or an endpoint not checked."),
    Family("specwatch_canary_success", "gauge", ("endpoint",),
           "1 when the last canary of the endpoint completed and could be classified, else 0."),
    Family("specwatch_canary_duration_seconds", "gauge", ("endpoint",), "Wall time of the last canary of the endpoint."),
    Family("specwatch_canary_last_success_timestamp_seconds", "gauge", ("endpoint",),
           "Unix time of the last successful canary of the endpoint."),
    Family("specwatch_canary_checked", "gauge", ("endpoint",),
           "1 when the endpoint has had a successful canary since the server was first seen or last changed (a "
           "restart, another build, speculation on or off), 0 while it waits for one: its other canary series are absent."),
    Family("specwatch_model_fingerprint_info", "gauge", _FINGERPRINT,
           "What the server says of its model file without generating a token (/props' build and model_path's file name, "
           f"/v1/models' meta, asked once per process; \"\" where not reported), and its peer group; always 1. {_POLLED}"),
    Family("specwatch_peer_agreement", "gauge", ("peer_group",),
           "1 when the model agrees with its peer group, 0 once it differs: its file's content (quantization, size, "
           "shape) at once, its answers to the peer probe once the sequential test decides; absent for a group of one, "
           "a server taken out of comparisons, or before there is anything to compare."),
    Family("specwatch_peer_evidence", "gauge", ("peer_group",),
           "How far the sequential test has come towards deciding that the model's answers differ from its peer "
           "group's, from 0 to 1 (1: decided); absent while nothing was compared."),
    Family("specwatch_peer_noise_nats", "gauge", (),
           "The model's own noise under its load: the mean, over its last 16 rounds, of how far two copies of the "
           "round's peer-probe prompt asked at once parted, in nats per token compared; absent before it was measured "
           "(and on a server of one slot, which never batches)."),
    Family("specwatch_peer_noisy", "gauge", ("peer_group",),
           "1 when the model's own noise stands 4 times or more over its peer group's (it is held to no more than "
           "that), 0 otherwise; absent while nothing was compared."),
    Family("specwatch_peer_floor_nats", "gauge", ("peer_group",),
           f"The least noise, in nats per token compared, the model's last counted round was scored at: {FLOOR:.2f}, or "
           f"{UNIFORM_FLOOR:.2f} in a group declared deployed alike (peer_uniform) while every member reports one build; "
           "absent while nothing was compared."),
    Family("specwatch_peer_missed_rounds", "gauge", ("peer_group",),
           "Peer-probe rounds in a row its group answered and the model did not: from 3 its agreement is unknown "
           "(specwatch_peer_agreement absent), never \"agrees\"; absent while nothing was compared."),
    Family("specwatch_peer_probes", "counter", ("outcome",),
           "Peer probes by outcome (success, failure), each copy of a burst counted; both from the first."),
    Family("specwatch_peer_probe_failures", "counter", ("reason",),
           "Failed peer probes by reason (a closed set; see the README)."),
    Family("specwatch_canaries", "counter", ("outcome",), "Canaries by outcome (success, failure); both from the first canary."),
    Family("specwatch_canary_failures", "counter", ("endpoint", "reason"),
           "Failed canaries by endpoint and reason (a closed set; see the README)."),
    Family("specwatch_canary_requested_tokens", "counter", (),
           "Tokens the canaries asked the server to generate: the price of watching it, in its own tokens."),
    Family("specwatch_canary_generated_tokens", "counter", (), "Tokens in the answers of successful canaries."),
)

EXPORTER: tuple[Family, ...] = (
    Family("specwatch_build_info", "gauge", ("version",), "specwatch's version; always 1."),
    Family("specwatch_poll_interval_seconds", "gauge", (), "The configured poll_interval."),
    Family("specwatch_canary_interval_seconds", "gauge", (), "The configured canary_interval; alerts scale staleness with it."),
    Family("specwatch_servers", "gauge", (), "Servers this exporter watches (its shard of the configured ones)."),
    Family("specwatch_configured_servers", "gauge", (),
           "Servers in the configuration, static and discovered, before sharding: what all replicas together watch."),
    Family("specwatch_config_last_reload_successful", "gauge", (),
           "1 when the last configuration load or reload succeeded, else 0."),
    Family("specwatch_config_last_reload_success_timestamp_seconds", "gauge", (),
           "Unix time of the last successful configuration load or reload."),
    Family("specwatch_exposition_errors", "counter", (),
           "Renders of /metrics that failed, at a scrape (answered 500) or in the background; the log says why."),
    Family("specwatch_discovery_targets", "gauge", ("source",), "Servers a discovery source (file_sd, http_sd) gives now."),
    Family("specwatch_discovery_refresh_successful", "gauge", ("source",),
           "1 when the source's last refresh was accepted; 0 when a file or answer was refused (its old targets stay)."),
    Family("specwatch_discovery_last_success_timestamp_seconds", "gauge", ("source",),
           "Unix time of the source's last good refresh."),
)

FAMILIES = {family.name: family for family in (*SERVER, *EXPORTER)}
