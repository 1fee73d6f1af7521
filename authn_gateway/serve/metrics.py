"""The server's own metrics: requests refused before any review, admin API requests
refused for their credentials, and config reloads (:class:`ServeMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

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
        self.config_reloads = Counter(
            f"{PREFIX}_config_reloads",
            "Config reloads (SIGHUP), by result: applied, or refused (the previous config "
            "keeps serving; the 'config reload refused' log line says why).",
            ["result"],
            registry=registry,
        )
        for result in ("applied", "refused"):
            self.config_reloads.labels(result)
        # Prometheus' and Alertmanager's own name for it; the alert is on it.
        self.config_last_reload_successful = Gauge(
            f"{PREFIX}_config_last_reload_successful",
            "1 if the last config reload (SIGHUP) applied the file, or none was tried since "
            "start-up; 0 if it was refused (the previous config keeps serving).",
            registry=registry,
        )
        self.config_last_reload_successful.set(1)

    def bad_request(self, status: int) -> None:
        self.child(self.bad_requests, str(status)).inc()
