"""Scrape helpers for tests: the collector's exposition as a dict of samples."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.state import Fleet
from specwatch.daemon.exposition.registry import SpecwatchCollector
from specwatch.daemon.exposition.samples import ExporterStatus

Samples = dict[tuple[str, tuple], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def exposition(fleet: Fleet) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SpecwatchCollector(fleet, lambda: ExporterStatus(15.0, 60.0, last_reload_success_timestamp=1.0)))
    return generate_latest(registry).decode()


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape(url: str) -> Samples:
    """The samples a running exporter serves at `url`."""
    return parse(httpx.get(url, timeout=10).text)


def find(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of `name` whose labels include `labels`, whatever other labels it has."""
    wanted = set(labels.items())
    matches = [v for (sample, found), v in samples.items() if sample == name and wanted <= set(found)]
    assert len(matches) <= 1, (name, labels, matches)
    return matches[0] if matches else None
