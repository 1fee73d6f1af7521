"""The rate limiters' refusals (:class:`LimiterMetrics`): the outbound bucket's (this
package's layer), the inbound limit's (its ``InboundLimiter``, charged by the review
path) and the breaker's in-flight ceiling's, by limiter and backend."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class LimiterMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.refusals = Counter(
            f"{PREFIX}_limiter_refusals",
            "Reviews refused by a rate limiter.",
            ["limiter", "backend"],
            registry=registry,
        )

    def refusal(self, limiter: str, backend: str) -> None:
        self.child(self.refusals, limiter, backend).inc()
