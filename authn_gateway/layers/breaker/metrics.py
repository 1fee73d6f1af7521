"""The breaker's metrics: state, transitions, operator overrides, slow calls, and how
fast a transition published in Redis reaches this replica (:class:`BreakerMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from authn_gateway.layers.breaker.override import Forced, Override
from authn_gateway.layers.breaker.transitions import STATES
from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class BreakerMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.state = Gauge(
            f"{PREFIX}_breaker_state",
            "Circuit breaker state per backend (1 = current state).",
            ["backend", "state"],
            registry=r,
        )
        self.transitions = Counter(
            f"{PREFIX}_breaker_transitions",
            "Circuit breaker state changes.",
            ["backend", "from_state", "to_state"],
            registry=r,
        )
        self.override = Gauge(
            f"{PREFIX}_breaker_override",
            "Operator override of a backend's breaker in force (1): none, forced_open or "
            "forced_closed.",
            ["backend", "override"],
            registry=r,
        )
        self.override_since = Gauge(
            f"{PREFIX}_breaker_override_since_timestamp_seconds",
            "When the override in force was first set (renewals keep it); 0 without one.",
            ["backend"],
            registry=r,
        )
        self.override_expiry = Gauge(
            f"{PREFIX}_breaker_override_expiry_timestamp_seconds",
            "When the override in force expires; 0 without one.",
            ["backend"],
            registry=r,
        )
        self.propagation = Histogram(
            f"{PREFIX}_breaker_propagation_seconds",
            "From a breaker transition published in Redis to this replica adopting it.",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.slow_calls = Counter(
            f"{PREFIX}_backend_slow_calls",
            "Calls to an identity provider at or over the breaker's slow-call threshold.",
            ["backend"],
            registry=r,
        )

    def set_state(self, backend: str, state: str) -> None:
        for s in STATES:
            self.child(self.state, backend, s).set(1 if s == state else 0)

    def transition(self, backend: str, old: str, new: str) -> None:
        self.child(self.transitions, backend, old, new).inc()
        self.set_state(backend, new)

    def set_override(self, backend: str, forced: Forced | None) -> None:
        current = forced.override if forced is not None else Override.NONE
        for override in Override:
            self.child(self.override, backend, override.value).set(1 if override is current else 0)
        self.child(self.override_since, backend).set(forced.since if forced else 0)
        self.child(self.override_expiry, backend).set(forced.expires_at if forced else 0)

    def slow_call(self, backend: str) -> None:
        self.child(self.slow_calls, backend).inc()
