"""The same samples as prometheus_client families, for the encoders of the formats the text renderer does not make."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ...core.state import Fleet
from .catalog import FAMILIES, SERVER, Family
from .samples import GROUPS, ExporterStatus, Extra, exporter_families, exporter_samples


class _FamilySink:
    def __init__(self, families: dict[str, Metric], base: dict[str, str]) -> None:
        self._families = families
        self._base = base

    def add(self, family: str, extra: Extra, value: float) -> None:
        self._families[family].add_sample(FAMILIES[family].sample, {**self._base, **dict(extra)}, value)


def _empty(family: Family) -> Metric:
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    return kind(family.name, family.help, labels=[])


class SpecwatchCollector(Collector):
    """Every specwatch family built fresh from a fleet snapshot on each collect(), as client_python's custom collectors."""

    def __init__(self, fleet: Fleet, status: Callable[[], ExporterStatus]) -> None:
        self._fleet = fleet
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        servers = self._fleet.snapshot()
        families = {f.name: _empty(f) for f in SERVER}
        for server in servers:
            out = _FamilySink(families, {**server.config.labels, "server": server.config.name})
            for group in GROUPS:
                group.samples(out, server)
        yield from families.values()
        own = {f.name: _empty(f) for f in exporter_families(status)}
        exporter_samples(_FamilySink(own, {}), status, len(servers))
        yield from own.values()
