"""The HTTP edge's metrics: connections, cut-offs, TLS handshakes and certificate expiry.

The edge's counts live in :class:`~.limits.EdgeStats`, kept by the listeners, which
outlive config reloads; :class:`EdgeCollector` reads them at scrape time. The server
hands its listeners to the registry's :class:`EdgeMetrics` group once it has them.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from authn_gateway.edge.limits import EdgeLimits
from authn_gateway.edge.tls import ServerTLS
from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class EdgeMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.collector = EdgeCollector()
        registry.register(self.collector)

    def watch(self, listeners: dict[str, EdgeLimits], tls: ServerTLS | None) -> None:
        """Export these listeners' counts and ``tls``'s certificates from now on."""
        self.collector.listeners = listeners
        self.collector.tls = tls


class EdgeCollector(Collector):
    def __init__(self) -> None:
        self.listeners: dict[str, EdgeLimits] = {}
        self.tls: ServerTLS | None = None

    def collect(self) -> Iterator[Metric]:
        open_ = GaugeMetricFamily(
            f"{PREFIX}_connections_open", "Open client connections.", labels=["listener"]
        )
        limit = GaugeMetricFamily(
            f"{PREFIX}_connections_limit",
            "server.max_connections: connections beyond it are closed at once.",
            labels=["listener"],
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_connections_refused",
            "Connections closed at once because max_connections were open.",
            labels=["listener"],
        )
        timeouts = CounterMetricFamily(
            f"{PREFIX}_request_timeouts",
            "Connections closed because a request head or body did not arrive in time, "
            "or their answers were not read in time (send).",
            labels=["listener", "phase"],
        )
        lingering = CounterMetricFamily(
            f"{PREFIX}_lingering_closes",
            "Connections the gateway ended with a lingering close (answer, then drain).",
            labels=["listener"],
        )
        handshakes = CounterMetricFamily(
            f"{PREFIX}_tls_handshake_failures",
            "TLS handshakes that failed, by reason.",
            labels=["listener", "reason"],
        )
        for name, edge in self.listeners.items():
            stats = edge.stats
            open_.add_metric([name], stats.open_connections)
            limit.add_metric([name], edge.max_connections)
            refused.add_metric([name], stats.refused_connections)
            lingering.add_metric([name], stats.lingering_closes)
            for phase, count in stats.timeouts.items():
                timeouts.add_metric([name, phase], count)
            if edge.tls_context is not None:
                for reason, count in stats.handshake_failures.items():
                    handshakes.add_metric([name, reason], count)
        # Families are exported without TLS too (no samples), so rules and dashboards
        # that name them stay valid on a plain-HTTP gateway.
        expiry = GaugeMetricFamily(
            f"{PREFIX}_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate and of each client CA (Unix time).",
            labels=["role", "subject"],
        )
        for cert in self.tls.expiries if self.tls is not None else ():
            expiry.add_metric([cert.role, cert.subject], cert.not_after)
        yield from (open_, limit, refused, timeouts, lingering, handshakes, expiry)
