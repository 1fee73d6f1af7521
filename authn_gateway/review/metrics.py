"""The review path's metrics: every review answered and its latency
(:class:`ReviewTally`), local refusals by rule, and deny-list hits (:class:`ReviewMetrics`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from authn_gateway.observe.metrics import BOUND_LABELS, LATENCY_BUCKETS, PREFIX, MetricsGroup


class ReviewMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        #: authn_gateway_reviews_total and authn_gateway_review_duration_seconds.
        self.tally = ReviewTally()
        r.register(self.tally)
        self.prerejected = Counter(
            f"{PREFIX}_prerejected",
            "Tokens rejected locally without an IdP call, by rule.",
            ["reason"],
            registry=r,
        )
        self.deny_hits = Counter(
            f"{PREFIX}_deny_hits",
            "Reviews refused because the deny list names the token, the user or the credential.",
            ["kind"],
            registry=r,
        )
        # Bound once: this runs on every review.
        self.review = self.tally.review

    def prerejection(self, reason: str) -> None:
        self.child(self.prerejected, reason).inc()

    def deny_hit(self, kind: str) -> None:
        self.child(self.deny_hits, kind).inc()


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
        # authn_gateway_cluster_reviews_total: (cluster, answer) -> reviews.
        self._by_cluster: dict[tuple[str, str], int] = {}
        # Per answer: a count per bucket (the last one +Inf), then the sum.
        self._latency: dict[str, list[float]] = {}

    def review(
        self, api_version: str, backend: str, answer: str, seconds: float, cluster: str | None
    ) -> None:
        """One review answered; ``cluster`` None when no clusters are configured (the
        per-cluster family then stays empty: everyone is ``default``)."""
        key = (api_version, backend, answer)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        if cluster is not None:
            by_cluster = self._by_cluster
            per = (cluster, answer)
            by_cluster[per] = by_cluster.get(per, 0) + 1
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
        by_cluster = CounterMetricFamily(
            f"{PREFIX}_cluster_reviews",
            "TokenReviews answered, by the caller's cluster and final answer.",
            labels=["cluster", "answer"],
        )
        for (cluster, answer), reviewed in list(self._by_cluster.items()):
            by_cluster.add_metric([cluster, answer], reviewed)
        yield by_cluster
        latency = HistogramMetricFamily(
            f"{PREFIX}_review_duration_seconds",
            "Time to answer a TokenReview.",
            labels=["answer"],
        )
        for answer, hist in list(self._latency.items()):
            snapshot = list(hist)
            cumulative, buckets = 0.0, []
            for bound, n in zip(BOUND_LABELS, snapshot[:-1], strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric([answer], buckets, snapshot[-1])
        yield latency
