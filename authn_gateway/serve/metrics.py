"""The server's own metrics: requests refused before any review, and admin API
requests refused for their credentials (:class:`ServeMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class ServeMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.bad_requests = Counter(
            f"{PREFIX}_bad_requests",
            "Requests refused before review, by HTTP status.",
            ["status"],
            registry=registry,
        )
        self.admin_auth_failures = Counter(
            f"{PREFIX}_admin_auth_failures",
            "Admin API requests refused for their credentials, by reason (missing: no "
            "bearer token; wrong: a token that is not the admin token; throttled: "
            "refused unchecked after too many failures, see docs/operations.md).",
            ["reason"],
            registry=registry,
        )
        for reason in ("missing", "wrong", "throttled"):
            self.admin_auth_failures.labels(reason)

    def bad_request(self, status: int) -> None:
        self.child(self.bad_requests, str(status)).inc()
