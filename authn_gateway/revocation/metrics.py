"""Revocation's metrics: evictions and the entries they dropped, the deny list's size,
and the operator actions taken through the admin API (:class:`RevocationMetrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from authn_gateway.observe.metrics import PREFIX, MetricsGroup


class RevocationMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.evictions = Counter(
            f"{PREFIX}_evictions",
            "Evictions applied here, by subject kind (user, token, credential) and source "
            "(admin: asked here; fleet: announced by another replica).",
            ["kind", "source"],
            registry=r,
        )
        self.evicted_entries = Counter(
            f"{PREFIX}_evicted_entries",
            "Cache entries dropped by evictions, by tier (local, shared).",
            ["tier"],
            registry=r,
        )
        self.deny_entries = Gauge(
            f"{PREFIX}_deny_entries",
            "Entries on the deny list as this replica sees it.",
            registry=r,
        )
        self.admin_actions = Counter(
            f"{PREFIX}_admin_actions",
            "Operator actions taken through the admin API (evict, deny, lift).",
            ["action"],
            registry=r,
        )
