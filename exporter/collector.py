"""The Prometheus collector: builds every metric family fresh from a state snapshot on each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.state import Fleet, ServerState


@dataclass(frozen=True)
class ExporterStatus:
    poll_interval: float
    canary_interval: float
    reload_successful: bool = True
    last_reload_success_timestamp: float | None = None


def _seconds(value: float) -> str:
    return f"{value:g}s"


class _Families:
    """Metric families for one scrape; adds each server's static labels to its samples."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str) -> None:
        self.families[name] = GaugeMetricFamily(name, doc, labels=[])

    def counter(self, name: str, doc: str) -> None:
        self.families[name] = CounterMetricFamily(name, doc, labels=[])

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        family = self.families[name]
        sample = f"{name}_total" if family.type == "counter" else name
        family.add_sample(sample, labels, value)


class SpecwatchCollector(Collector):
    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        self._fleet = fleet
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        servers = self._fleet.snapshot()
        out = _Families()
        cached = (
            f"Cached from the last successful canary, refreshed every canary_interval "
            f"(configured: {_seconds(status.canary_interval)})."
        )
        polled = f"From the last poll, every poll_interval (configured: {_seconds(status.poll_interval)})."
        out.gauge("specwatch_up", f"1 when the last poll of /health, /props and /slots got valid answers, else 0. {polled}")
        out.gauge(
            "specwatch_speculation_enabled",
            f"1 when the endpoint named by source reports speculative decoding on, 0 off; absent when unknown. {polled}",
        )
        out.gauge(
            "specwatch_speculation_contradiction",
            f"1 when /slots reports speculation on while /props reports none (a config audit reading /props is misled). {polled}",
        )
        out.gauge("specwatch_slots", f"Total slots (parallel sequences) of the server. {polled}")
        out.gauge("specwatch_server_info", f"Build and model the server reports; always 1. {polled}")
        out.gauge("specwatch_poll_duration_seconds", "Wall time of the last poll.")
        out.gauge("specwatch_last_poll_success_timestamp_seconds", "Unix time of the last successful poll.")
        out.counter("specwatch_poll_failures", "Failed polls by reason (a closed set; see the README).")
        out.gauge(
            "specwatch_canary_placeholder_ratio",
            f"Fill-in (placeholder) logprobs among the canary's tokens after the first. {cached}",
        )
        out.gauge("specwatch_canary_tokens", f"Tokens in the canary's answer. {cached}")
        out.gauge("specwatch_canary_placeholder_tokens", f"Fill-in tokens in the canary's answer. {cached}")
        out.gauge(
            "specwatch_canary_mean_logprob",
            f"Mean logprob of the canary's answer, as an eval would compute it from the values the response carries. {cached}",
        )
        out.gauge("specwatch_canary_draft_tokens", f"Tokens the server drafted for the canary (timings.draft_n), when reported. {cached}")
        out.gauge(
            "specwatch_serving_placeholders",
            f"1 when the last successful canary of any endpoint found a fill-in logprob, else 0. {cached}",
        )
        out.gauge("specwatch_canary_success", "1 when the last canary of the endpoint completed and could be classified, else 0.")
        out.gauge("specwatch_canary_duration_seconds", "Wall time of the last canary of the endpoint.")
        out.gauge("specwatch_canary_last_success_timestamp_seconds", "Unix time of the last successful canary of the endpoint.")
        out.counter("specwatch_canary_failures", "Failed canaries by endpoint and reason (a closed set; see the README).")

        for server in servers:
            self._server(out, server)

        out.gauge("specwatch_build_info", "specwatch's version; always 1.")
        out.add("specwatch_build_info", {"version": __version__}, 1)
        out.gauge("specwatch_poll_interval_seconds", "The configured poll_interval.")
        out.add("specwatch_poll_interval_seconds", {}, status.poll_interval)
        out.gauge("specwatch_canary_interval_seconds", "The configured canary_interval; alerts scale staleness with it.")
        out.add("specwatch_canary_interval_seconds", {}, status.canary_interval)
        out.gauge("specwatch_servers", "Servers this exporter watches.")
        out.add("specwatch_servers", {}, len(servers))
        out.gauge("specwatch_config_last_reload_successful", "1 when the last configuration load or reload succeeded, else 0.")
        out.add("specwatch_config_last_reload_successful", {}, 1 if status.reload_successful else 0)
        if status.last_reload_success_timestamp is not None:
            out.gauge(
                "specwatch_config_last_reload_success_timestamp_seconds",
                "Unix time of the last successful configuration load or reload.",
            )
            out.add("specwatch_config_last_reload_success_timestamp_seconds", {}, status.last_reload_success_timestamp)
        yield from out.families.values()

    @staticmethod
    def _server(out: _Families, server: ServerState) -> None:
        base = {**server.config.labels, "server": server.config.name}
        if server.poll_success is not None:
            out.add("specwatch_up", base, 1 if server.poll_success else 0)
            out.add("specwatch_poll_duration_seconds", base, server.poll_duration_seconds or 0.0)
        if server.last_poll_success_timestamp is not None:
            out.add("specwatch_last_poll_success_timestamp_seconds", base, server.last_poll_success_timestamp)
        for reason, count in sorted(server.poll_failures.items()):
            out.add("specwatch_poll_failures", {**base, "reason": reason.value}, count)
        poll = server.poll
        if poll is not None:
            props_on = poll.props.speculative
            slots_on = poll.slots.speculative if poll.slots is not None else None
            if slots_on is not None:
                out.add("specwatch_speculation_enabled", {**base, "source": "slots"}, int(slots_on))
            if props_on is not None:
                out.add("specwatch_speculation_enabled", {**base, "source": "props"}, int(props_on))
            if slots_on is not None and props_on is not None:
                out.add("specwatch_speculation_contradiction", base, int(slots_on and not props_on))
            slots = poll.props.total_slots if poll.props.total_slots is not None else (poll.slots.count if poll.slots else None)
            if slots is not None:
                out.add("specwatch_slots", base, slots)
            out.add("specwatch_server_info", {**base, "build": poll.props.build, "model": poll.props.model}, 1)
        for endpoint, canary in sorted(server.canaries.items()):
            labels = {**base, "endpoint": endpoint.value}
            out.add("specwatch_canary_success", labels, int(canary.success))
            out.add("specwatch_canary_duration_seconds", labels, canary.duration_seconds)
            if canary.last_success_timestamp is not None:
                out.add("specwatch_canary_last_success_timestamp_seconds", labels, canary.last_success_timestamp)
            verdict = canary.last_result
            if verdict is None:
                continue
            out.add("specwatch_canary_placeholder_ratio", labels, verdict.placeholder_ratio)
            out.add("specwatch_canary_tokens", labels, verdict.tokens)
            out.add("specwatch_canary_placeholder_tokens", labels, verdict.placeholders)
            if verdict.mean_logprob is not None:
                out.add("specwatch_canary_mean_logprob", labels, verdict.mean_logprob)
            if verdict.draft_n is not None:
                out.add("specwatch_canary_draft_tokens", labels, verdict.draft_n)
        for (endpoint, reason), count in sorted(server.canary_failures.items()):
            out.add("specwatch_canary_failures", {**base, "endpoint": endpoint.value, "reason": reason.value}, count)
        serving = server.serving_placeholders
        if serving is not None:
            out.add("specwatch_serving_placeholders", base, int(serving))
