"""The cache layer's metrics: lookups, stale answers, entries, and the shared tier's
signatures, previous-key lookups and write-back (:class:`CacheMetrics`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from authn_gateway.observe.metrics import PREFIX, Count, MetricsGroup

# Stale entries are served for up to max_stale (default 1 h, at most keep_stale: 24 h)
# past their TTL.
STALE_AGE_BUCKETS = (
    1.0,
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1200.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    86400.0,
)


class CacheMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        #: authn_gateway_cache_lookups_total.
        self.lookups = LookupTally()
        r.register(self.lookups)
        self.entries = Gauge(
            f"{PREFIX}_cache_entries", "Entries in the in-process review cache.", registry=r
        )
        self.negatives_unshared = Counter(
            f"{PREFIX}_cache_negatives_unshared",
            "Refusals kept out of Redis because this minute's fleet-wide budget "
            "(cache.max_negative_entries) was spent: a flood of invalid tokens.",
            registry=r,
        )
        self.user_capped = Counter(
            f"{PREFIX}_cache_user_capped",
            "Identities pushed out of the in-process cache by a newer one of the same user "
            "past cache.max_entries_per_user: one account minting many tokens.",
            registry=r,
        )
        self.tampered_entries = Counter(
            f"{PREFIX}_cache_tampered_entries",
            "Shared-cache entries ignored because their signature did not verify.",
            registry=r,
        )
        self.previous_key_lookups = Counter(
            f"{PREFIX}_cache_previous_key_lookups",
            "Shared-tier misses looked up again under a previous secret's key, by result "
            "(found: answered and re-written under the current key; missing).",
            ["result"],
            registry=r,
        )
        # Write-back after Redis comes back (it may have come back empty).
        self.written_back = Counter(
            f"{PREFIX}_cache_written_back",
            "Live local identities written back to Redis when sharing resumed, by result "
            "(written; kept: Redis already held an entry for that key; repaired: one that a "
            "review found missing in Redis, written back at once).",
            ["result"],
            registry=r,
        )
        self.shared_identities = Gauge(
            f"{PREFIX}_shared_cache_identities",
            "Identities (positive entries) in the shared Redis cache under this gateway's "
            "key prefix, as counted by its index: written and not yet expired or evicted.",
            registry=r,
        )
        self.stale_answers = Counter(
            f"{PREFIX}_stale_answers",
            "Authenticated answers served from cache because the backend could not answer.",
            ["backend"],
            registry=r,
        )
        self.stale_age = Histogram(
            f"{PREFIX}_stale_age_seconds",
            "How long past its fresh TTL each entry served stale was.",
            ["backend"],
            buckets=STALE_AGE_BUCKETS,
            registry=r,
        )
        self.max_stale = Gauge(
            f"{PREFIX}_cache_max_stale_seconds",
            "The running config's cache.max_stale_seconds per backend: how long past its "
            "TTL a known identity may still be served while the backend cannot answer.",
            ["backend"],
            registry=r,
        )

    def counter(self, backend: str, result: str) -> Count:
        """The lookup count for one backend and result, to keep and increment."""
        return self.lookups.count(backend, result)

    def lookup(self, backend: str, result: str) -> None:
        self.lookups.count(backend, result).inc()

    def stale_served(self, backend: str, age: float) -> None:
        self.lookups.count(backend, "stale_served").inc()
        self.child(self.stale_answers, backend).inc()
        self.child(self.stale_age, backend).observe(age)

    def set_max_stale(self, backend: str, seconds: float) -> None:
        self.child(self.max_stale, backend).set(seconds)


class LookupTally(Collector):
    """Cache lookups by backend and result as plain integers, sampled at scrape time:
    a lookup runs on every review, and a prometheus_client child's ``inc()`` takes a
    lock (as review/metrics.py's ``ReviewTally``). Only the event loop writes."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], Count] = {}

    def count(self, backend: str, result: str) -> Count:
        """The count for one backend and result; the same object for the process's life
        (a reload's new layers keep counting where the old ones were)."""
        found = self._counts.get((backend, result))
        if found is None:
            found = self._counts[(backend, result)] = Count()
        return found

    def collect(self) -> Iterator[Metric]:
        lookups = CounterMetricFamily(
            f"{PREFIX}_cache_lookups",
            "Cache lookups by result: hit, negative_hit, miss, stale_served.",
            labels=["backend", "result"],
        )
        for labels, count in list(self._counts.items()):
            lookups.add_metric(list(labels), count.value)
        yield lookups
