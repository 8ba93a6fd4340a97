"""The gateway's Prometheus metrics: requests, fallbacks, breaker states, time to first token."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from bullpen.gateway.breaker import Breakers

_TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class GatewayMetrics:
    """Counters and histograms by provider id; labelled children are cached per provider.

    The `provider` label is the provider's id (its `key`: a UUID, or `builtin:simulated`),
    never its name: names are a workspace's own words, and /metrics is read by the operator,
    not the tenant; an id also keeps two workspaces' same-named providers apart.
    """

    def __init__(self, registry: CollectorRegistry | None, breakers: Breakers) -> None:
        self.requests = Counter(
            "bullpen_gateway_requests",
            "Requests the gateway sent to providers, by provider and outcome",
            ("provider", "outcome"),
            registry=registry,
        )
        self.fallbacks = Counter(
            "bullpen_gateway_fallbacks",
            "Times the gateway moved past a provider to the next of a route, and why",
            ("provider", "reason"),
            registry=registry,
        )
        self.ttft = Histogram(
            "bullpen_gateway_ttft_seconds",
            "Time from sending a request to a provider to its first content token",
            ("provider",),
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        if registry is not None:
            registry.register(_BreakerStates(breakers))

    def outcome(self, provider: str, outcome: str) -> None:
        """Count one request to `provider` (its id) that ended with `outcome`."""
        self.requests.labels(provider, outcome).inc()

    def fell_back(self, provider: str, reason: str) -> None:
        """Count a move past `provider` for `reason`."""
        self.fallbacks.labels(provider, reason).inc()

    def first_token(self, provider: str, seconds: float) -> None:
        """Observe one time to first token."""
        self.ttft.labels(provider).observe(seconds)


class _BreakerStates(Collector):
    """The state of every breaker, read at scrape time."""

    def __init__(self, breakers: Breakers) -> None:
        self._breakers = breakers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "bullpen_gateway_breaker_state",
            "Circuit breaker per provider: 0 closed, 1 half-open (probing), 2 open (skipped)",
            labels=("provider",),
        )
        for key, _name, breaker_state in sorted(self._breakers.states()):
            family.add_metric((key,), float(int(breaker_state)))
        yield family
