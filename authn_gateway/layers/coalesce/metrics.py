"""Coalescing's metric: reviews that waited on another's call (:class:`CoalesceMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class CoalesceMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.waiters = Counter(
            f"{PREFIX}_coalesced_waiters",
            "Reviews that waited on another review's backend call instead of making one.",
            ["backend"],
            registry=registry,
        )
