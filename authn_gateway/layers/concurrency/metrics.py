"""The adaptive concurrency limit's metrics: the limit, calls in flight and waiting,
the wait for a slot, refusals (:class:`ConcurrencyMetrics`)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from authn_gateway.observe.metrics import LATENCY_BUCKETS, PREFIX, MetricsGroup


class ConcurrencyMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.limit = Gauge(
            f"{PREFIX}_concurrency_limit",
            "Adaptive limit on calls in flight to the identity provider.",
            ["backend"],
            registry=r,
        )
        self.in_flight = Gauge(
            f"{PREFIX}_concurrency_in_flight",
            "Calls in flight to the identity provider.",
            ["backend"],
            registry=r,
        )
        self.waiting = Gauge(
            f"{PREFIX}_concurrency_waiting",
            "Calls waiting for a slot under the concurrency limit.",
            ["backend"],
            registry=r,
        )
        self.slot_wait = Histogram(
            f"{PREFIX}_concurrency_slot_wait_seconds",
            "Time a call waited for a slot under the concurrency limit.",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            f"{PREFIX}_concurrency_refusals",
            "Calls refused by the concurrency limit: failing, queue_full, deadline or waited.",
            ["backend", "reason"],
            registry=r,
        )

    def watch(
        self,
        backend: str,
        limit: Callable[[], float],
        in_flight: Callable[[], float],
        waiting: Callable[[], float],
    ) -> None:
        """The limiter's live figures, read at scrape time (a reload's limiter replaces
        the old one's)."""
        self.limit.labels(backend).set_function(limit)
        self.in_flight.labels(backend).set_function(in_flight)
        self.waiting.labels(backend).set_function(waiting)

    def slot_waited(self, backend: str, seconds: float) -> None:
        self.child(self.slot_wait, backend).observe(seconds)

    def refusal(self, backend: str, reason: str) -> None:
        self.child(self.refusals, backend, reason).inc()
