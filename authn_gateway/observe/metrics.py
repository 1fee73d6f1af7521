"""Prometheus metrics, all under the ``authn_gateway_`` prefix.

Labels carry backend names, answers and states, never tokens or user names.
Label children are resolved once and kept, so the review hot path pays one
dictionary lookup and an increment.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from authn_gateway.layers.breaker.override import Forced, Override
from authn_gateway.layers.breaker.transitions import STATES
from authn_gateway.observe.logsink import all_sinks
from backends.base import Authenticated, Outcome, Rejected

LOGS = ("review", "audit", "process")

PREFIX = "authn_gateway"

# Reviews answered from cache take ~50 us; IdP calls take 10 ms to seconds.
LATENCY_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

# The histogram's "le" labels, as prometheus_client writes them.
_BOUND_LABELS = [*(repr(float(b)) for b in LATENCY_BUCKETS), "+Inf"]


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


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        #: authn_gateway_reviews_total and authn_gateway_review_duration_seconds.
        self.review_tally = ReviewTally()
        r.register(self.review_tally)
        self.bad_requests = Counter(
            f"{PREFIX}_bad_requests",
            "Requests refused before review, by HTTP status.",
            ["status"],
            registry=r,
        )
        self.backend_calls = Counter(
            f"{PREFIX}_backend_calls",
            "Calls that reached an identity provider, by outcome.",
            ["backend", "outcome"],
            registry=r,
        )
        self.backend_latency = Histogram(
            f"{PREFIX}_backend_call_duration_seconds",
            "Latency of calls to an identity provider.",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.backend_rejections = Counter(
            f"{PREFIX}_backend_rejections",
            "Rejections answered by backend calls, by cause: idp (the IdP refused the token), "
            "unsendable (the protocol cannot carry the token), unmapped (the IdP's answer "
            "lacks what the identity mapping needs, or has more groups than the gateway reads).",
            ["backend", "cause"],
            registry=r,
        )
        self.internal_errors = Counter(
            f"{PREFIX}_internal_errors",
            "Reviews answered 'internal error' (a bug of ours), by where and exception type.",
            ["where", "error"],
            registry=r,
        )
        self.backend_misconfigured = Counter(
            f"{PREFIX}_backend_config_errors",
            "Answers that mean the gateway's own IdP credentials or permissions are wrong.",
            ["backend"],
            registry=r,
        )
        self.breaker_state = Gauge(
            f"{PREFIX}_breaker_state",
            "Circuit breaker state per backend (1 = current state).",
            ["backend", "state"],
            registry=r,
        )
        self.breaker_transitions = Counter(
            f"{PREFIX}_breaker_transitions",
            "Circuit breaker state changes.",
            ["backend", "from_state", "to_state"],
            registry=r,
        )
        self.breaker_override = Gauge(
            f"{PREFIX}_breaker_override",
            "Operator override of a backend's breaker in force (1): none, forced_open or "
            "forced_closed.",
            ["backend", "override"],
            registry=r,
        )
        self.breaker_override_since = Gauge(
            f"{PREFIX}_breaker_override_since_timestamp_seconds",
            "When the override in force was first set (renewals keep it); 0 without one.",
            ["backend"],
            registry=r,
        )
        self.breaker_override_expiry = Gauge(
            f"{PREFIX}_breaker_override_expiry_timestamp_seconds",
            "When the override in force expires; 0 without one.",
            ["backend"],
            registry=r,
        )
        #: authn_gateway_cache_lookups_total.
        self.cache_lookups = LookupTally()
        r.register(self.cache_lookups)
        self.cache_entries = Gauge(
            f"{PREFIX}_cache_entries", "Entries in the in-process review cache.", registry=r
        )
        self.coalesced = Counter(
            f"{PREFIX}_coalesced_waiters",
            "Reviews that waited on another review's backend call instead of making one.",
            ["backend"],
            registry=r,
        )
        self.limited = Counter(
            f"{PREFIX}_limiter_refusals",
            "Reviews refused by a rate limiter.",
            ["limiter", "backend"],
            registry=r,
        )
        self.prerejected = Counter(
            f"{PREFIX}_prerejected",
            "Tokens rejected locally without an IdP call, by rule.",
            ["reason"],
            registry=r,
        )
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
        self.cache_negatives_unshared = Counter(
            f"{PREFIX}_cache_negatives_unshared",
            "Refusals kept out of Redis because this minute's fleet-wide budget "
            "(cache.max_negative_entries) was spent: a flood of invalid tokens.",
            registry=r,
        )
        self.cache_user_capped = Counter(
            f"{PREFIX}_cache_user_capped",
            "Identities pushed out of the in-process cache by a newer one of the same user "
            "past cache.max_entries_per_user: one account minting many tokens.",
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
        self.breaker_propagation = Histogram(
            f"{PREFIX}_breaker_propagation_seconds",
            "From a breaker transition published in Redis to this replica adopting it.",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=r,
        )
        self.cache_tampered_entries = Counter(
            f"{PREFIX}_cache_tampered_entries",
            "Shared-cache entries ignored because their signature did not verify.",
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
        self.cache_previous_key_lookups = Counter(
            f"{PREFIX}_cache_previous_key_lookups",
            "Shared-tier misses looked up again under a previous secret's key, by result "
            "(found: answered and re-written under the current key; missing).",
            ["result"],
            registry=r,
        )
        # Write-back after Redis comes back (it may have come back empty).
        self.cache_written_back = Counter(
            f"{PREFIX}_cache_written_back",
            "Live local identities written back to Redis when sharing resumed, by result "
            "(written; kept: Redis already held an entry for that key; repaired: one that a "
            "review found missing in Redis, written back at once).",
            ["result"],
            registry=r,
        )
        self.shared_cache_identities = Gauge(
            f"{PREFIX}_shared_cache_identities",
            "Identities (positive entries) in the shared Redis cache under this gateway's "
            "key prefix, as counted by its index: written and not yet expired or evicted.",
            registry=r,
        )
        self.concurrency_limit = Gauge(
            f"{PREFIX}_concurrency_limit",
            "Adaptive limit on calls in flight to the identity provider.",
            ["backend"],
            registry=r,
        )
        self.concurrency_in_flight = Gauge(
            f"{PREFIX}_concurrency_in_flight",
            "Calls in flight to the identity provider.",
            ["backend"],
            registry=r,
        )
        self.concurrency_waiting = Gauge(
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
        self.concurrency_refusals = Counter(
            f"{PREFIX}_concurrency_refusals",
            "Calls refused by the concurrency limit: failing, queue_full, deadline or waited.",
            ["backend", "reason"],
            registry=r,
        )
        self.own_delay_seconds = Counter(
            f"{PREFIX}_backend_call_own_delay_seconds",
            "Time answers to IdP calls waited for the gateway's own event loop (CPU "
            "starvation); left out of the latency the concurrency limit and the "
            "slow-call rule see.",
            ["backend"],
            registry=r,
        )
        self.own_timeouts = Counter(
            f"{PREFIX}_backend_own_timeouts",
            "IdP calls that timed out mostly waiting for the gateway's own event loop: "
            "not counted against the IdP.",
            ["backend"],
            registry=r,
        )
        self.slow_calls = Counter(
            f"{PREFIX}_backend_slow_calls",
            "Calls to an identity provider at or over the breaker's slow-call threshold.",
            ["backend"],
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
        self.backend_last_success = Gauge(
            f"{PREFIX}_backend_last_success_timestamp_seconds",
            "Unix time of this process's last definite answer from the backend (a token "
            "accepted, or refused by the IdP). Absent until the first one.",
            ["backend"],
            registry=r,
        )
        self.cache_max_stale = Gauge(
            f"{PREFIX}_cache_max_stale_seconds",
            "The running config's cache.max_stale_seconds per backend: how long past its "
            "TTL a known identity may still be served while the backend cannot answer.",
            ["backend"],
            registry=r,
        )
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
        self.deny_hits = Counter(
            f"{PREFIX}_deny_hits",
            "Reviews refused because the deny list names the token, the user or the credential.",
            ["kind"],
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
        self.admin_auth_failures = Counter(
            f"{PREFIX}_admin_auth_failures",
            "Admin API requests refused for their credentials, by reason (missing: no "
            "bearer token; wrong: a token that is not the admin token; throttled: "
            "refused unchecked after too many failures, see docs/operations.md).",
            ["reason"],
            registry=r,
        )
        for reason in ("missing", "wrong", "throttled"):
            self.admin_auth_failures.labels(reason)
        r.register(LogSinkCollector())
        #: Backends' own metrics (the jwt backend's key fetches).
        self.backend_collectors = BackendCollectors()
        r.register(self.backend_collectors)
        self._children: dict[tuple[Any, ...], Any] = {}
        # Bound once: this runs on every review.
        self.review = self.review_tally.review

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def cache(self, backend: str, result: str) -> None:
        self.cache_lookups.count(backend, result).inc()

    def stale_served(self, backend: str, age: float) -> None:
        self.cache_lookups.count(backend, "stale_served").inc()
        self._child(self.stale_answers, backend).inc()
        self._child(self.stale_age, backend).observe(age)

    def cache_counter(self, backend: str, result: str) -> Count:
        """The lookup count for one backend and result, to keep and increment."""
        return self.cache_lookups.count(backend, result)

    def backend_call(self, backend: str, outcome: str, seconds: float) -> None:
        self._child(self.backend_calls, backend, outcome).inc()
        self._child(self.backend_latency, backend).observe(seconds)

    def backend_outcome(self, backend: str, outcome: Outcome, seconds: float) -> None:
        """One finished backend call: its outcome, latency and, for a rejection, its cause."""
        self.backend_call(backend, type(outcome).__name__.lower(), seconds)
        if isinstance(outcome, Rejected):
            self._child(self.backend_rejections, backend, outcome.cause).inc()
        # The IdP answered: known users' stale limits count from answers like this one.
        # ("unsendable": refused before any call, so it proves nothing about the IdP.)
        if isinstance(outcome, Authenticated) or (
            isinstance(outcome, Rejected) and outcome.cause != "unsendable"
        ):
            self._child(self.backend_last_success, backend).set(time.time())

    def set_max_stale(self, backend: str, seconds: float) -> None:
        self._child(self.cache_max_stale, backend).set(seconds)

    def internal_error(self, where: str, error: str) -> None:
        self._child(self.internal_errors, where, error).inc()

    def limiter_refusal(self, limiter: str, backend: str) -> None:
        self._child(self.limited, limiter, backend).inc()

    def watch_concurrency(
        self,
        backend: str,
        limit: Callable[[], float],
        in_flight: Callable[[], float],
        waiting: Callable[[], float],
    ) -> None:
        """The limiter's live figures, read at scrape time."""
        self.concurrency_limit.labels(backend).set_function(limit)
        self.concurrency_in_flight.labels(backend).set_function(in_flight)
        self.concurrency_waiting.labels(backend).set_function(waiting)

    def slot_waited(self, backend: str, seconds: float) -> None:
        self._child(self.slot_wait, backend).observe(seconds)

    def concurrency_refusal(self, backend: str, reason: str) -> None:
        self._child(self.concurrency_refusals, backend, reason).inc()

    def own_delay(self, backend: str, seconds: float) -> None:
        if seconds > 0:
            self._child(self.own_delay_seconds, backend).inc(seconds)

    def own_timeout(self, backend: str) -> None:
        self._child(self.own_timeouts, backend).inc()

    def slow_call(self, backend: str) -> None:
        self._child(self.slow_calls, backend).inc()

    def prerejection(self, reason: str) -> None:
        self._child(self.prerejected, reason).inc()

    def misconfigured(self, backend: str) -> None:
        self._child(self.backend_misconfigured, backend).inc()

    def set_breaker_state(self, backend: str, state: str) -> None:
        for s in STATES:
            self._child(self.breaker_state, backend, s).set(1 if s == state else 0)

    def breaker_transition(self, backend: str, old: str, new: str) -> None:
        self._child(self.breaker_transitions, backend, old, new).inc()
        self.set_breaker_state(backend, new)

    def set_override(self, backend: str, forced: Forced | None) -> None:
        current = forced.override if forced is not None else Override.NONE
        for override in Override:
            self._child(self.breaker_override, backend, override.value).set(
                1 if override is current else 0
            )
        self._child(self.breaker_override_since, backend).set(forced.since if forced else 0)
        self._child(self.breaker_override_expiry, backend).set(forced.expires_at if forced else 0)


class ReviewTally(Collector):
    """The per-review counter and latency histogram as plain integers, turned into
    samples at scrape time.

    prometheus_client's ``inc()`` and ``observe()`` take a lock and walk the buckets
    in Python on every call; this runs on every review, cache hits included, so a
    review costs a dictionary update and a C bisect here (docs/decisions.md, issue 19).
    Only the event loop writes; a scrape in another thread reads a snapshot.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}
        # Per answer: a count per bucket (the last one +Inf), then the sum.
        self._latency: dict[str, list[float]] = {}

    def review(self, api_version: str, backend: str, answer: str, seconds: float) -> None:
        key = (api_version, backend, answer)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        hist = self._latency.get(answer)
        if hist is None:
            hist = self._latency[answer] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        hist[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        hist[-1] += seconds

    def collect(self) -> Iterator[Metric]:
        reviews = CounterMetricFamily(
            f"{PREFIX}_reviews",
            "TokenReviews answered, by final answer.",
            labels=["api_version", "backend", "answer"],
        )
        for labels, count in list(self._counts.items()):
            reviews.add_metric(list(labels), count)
        yield reviews
        latency = HistogramMetricFamily(
            f"{PREFIX}_review_duration_seconds",
            "Time to answer a TokenReview.",
            labels=["answer"],
        )
        for answer, hist in list(self._latency.items()):
            snapshot = list(hist)
            cumulative, buckets = 0.0, []
            for bound, n in zip(_BOUND_LABELS, snapshot[:-1], strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric([answer], buckets, snapshot[-1])
        yield latency


class Count:
    """One plain integer count; ``inc()`` as a prometheus_client child's, without its lock."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self) -> None:
        self.value += 1


class LookupTally(Collector):
    """Cache lookups by backend and result as plain integers, sampled at scrape time:
    a lookup runs on every review, and a prometheus_client child's ``inc()`` takes a
    lock (as :class:`ReviewTally`). Only the event loop writes."""

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


class BackendCollectors(Collector):
    """The metrics backends export themselves, registered once per process.

    Each backend name maps to the running generation's backend: a reload attaches the
    new one, and closing the old one detaches it only if it is still the current one.
    A backend's counters start again from zero after a reload (``rate()`` handles it).
    """

    def __init__(self) -> None:
        self._current: dict[str, Collector] = {}

    def attach(self, backend: str, collector: Collector) -> None:
        self._current[backend] = collector

    def detach(self, backend: str, collector: Collector) -> None:
        if self._current.get(backend) is collector:
            del self._current[backend]

    def collect(self) -> Iterable[Metric]:
        # Two backends of one kind export the same families: merge their samples.
        families: dict[str, Metric] = {}
        for collector in list(self._current.values()):
            for family in collector.collect():
                merged = families.get(family.name)
                if merged is None:
                    families[family.name] = family
                else:
                    merged.samples.extend(family.samples)
        return list(families.values())


class LogSinkCollector(Collector):
    """The log queues' counts, read at scrape time: the sinks are per process, not per
    config, so they outlive the Metrics of any one reload."""

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily(
            f"{PREFIX}_log_lines_dropped",
            "Log lines dropped unwritten: their reader fell behind and the queue was full.",
            labels=["log"],
        )
        queued = GaugeMetricFamily(
            f"{PREFIX}_log_queue_lines",
            "Log lines waiting for their writer, by destination.",
            labels=["destination"],
        )
        totals = dict.fromkeys(LOGS, 0)
        for sink in all_sinks():
            for log, count in sink.dropped.items():
                totals[log] = totals.get(log, 0) + count
            queued.add_metric([_destination_label(sink.destination)], sink.queued())
        for log, count in totals.items():
            dropped.add_metric([log], count)
        yield dropped
        yield queued


def _destination_label(destination: str) -> str:
    # A file's path is configuration, not a secret, but "file" keeps the label short.
    return destination if destination in ("stderr", "stdout") else "file"
