"""Prometheus metrics, one registry per process built by the composition root."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class _Gauges(Collector):
    """Gauges read at scrape time from live objects (no bookkeeping on hot paths)."""

    def __init__(self, readers: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self._readers = readers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (doc, read) in self._readers.items():
            yield GaugeMetricFamily(name, doc, value=read())


def build_registry(readers: dict[str, tuple[str, Callable[[], float]]]) -> CollectorRegistry:
    """A registry with process metrics and the given live gauges."""
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    registry.register(_Gauges(readers))
    return registry
