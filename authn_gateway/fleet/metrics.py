"""The fleet's metrics: the Redis link (errors, latency, shared or local mode), the
fleet share a replica runs on while Redis is down, and the key ids of the gateway
secret that replicas must share to share a cache (:class:`FleetMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from authn_gateway.observe.metrics import LATENCY_BUCKETS, PREFIX, MetricsGroup


class FleetMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.redis_errors = Counter(
            f"{PREFIX}_redis_errors",
            "Failed or timed-out Redis operations.",
            ["operation"],
            registry=r,
        )
        self.redis_latency = Histogram(
            f"{PREFIX}_redis_duration_seconds",
            "Latency of Redis operations.",
            ["operation"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.redis_mode = Gauge(
            f"{PREFIX}_redis_mode",
            "Fleet state mode (1 = current): shared, local or none.",
            ["mode"],
            registry=r,
        )
        self.redis_mode_changes = Counter(
            f"{PREFIX}_redis_mode_changes",
            "Switches between shared and local fleet state, by the mode switched to. A gauge "
            "sampled every scrape misses a few seconds in local mode; this does not.",
            ["to"],
            registry=r,
        )
        self.fleet_share = Gauge(
            f"{PREFIX}_fleet_share",
            "n, the larger of redis.expected_replicas and the replicas seen heartbeating in "
            "Redis in the last 15 s: while Redis is down each replica runs on 1/n of the "
            "fleet's bucket, failures to open and in-flight ceiling.",
            registry=r,
        )
        # Secret rotation (docs/operations.md, "Rotate the gateway secret").
        self.secret_info = Gauge(
            f"{PREFIX}_secret_info",
            "Key ids (non-secret fingerprints) of the gateway secret in use (role=current) "
            "and of previous_secrets still accepted when reading (role=previous). More than "
            "one current key id in a fleet: its replicas do not share a cache.",
            ["key_id", "role"],
            registry=r,
        )
