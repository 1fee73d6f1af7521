"""The authorization webhook's metrics: decisions by answer (as plain integers, counted
on every review), decisions answered from the cache, and the policy's reloads and state
(:class:`AuthorizationMetrics`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from authn_gateway.observe.metrics import PREFIX, Count, MetricsGroup, counter_family

#: The answers a decision can give; ``unavailable``: no policy could decide, and the
#: configured ``on_error`` answer was given.
ANSWERS = ("allowed", "denied", "no_opinion", "unavailable")


class AuthorizationMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.tally = DecisionTally()
        registry.register(self.tally)
        #: Bound once: these run on every review.
        self.decision = self.tally.decision
        self.cache_hit = self.tally.cache_hits.inc
        self.reloads = Counter(
            f"{PREFIX}_authorization_policy_reloads",
            "Authorization policy files read again after a change, by result (loaded; "
            "refused: invalid or unreadable, the policy in force was kept).",
            ["result"],
            registry=registry,
        )
        for result in ("loaded", "refused"):
            self.reloads.labels(result)
        self.rules = Gauge(
            f"{PREFIX}_authorization_policy_rules",
            "Rules of the authorization policy in force (both formats together).",
            registry=registry,
        )
        self.refused = Gauge(
            f"{PREFIX}_authorization_policy_refused",
            "1 while the policy file's current content is refused (invalid or "
            "unreadable) and the previous policy, or none, is in force.",
            registry=registry,
        )

    def reload(self, result: str) -> None:
        self.child(self.reloads, result).inc()


class DecisionTally(Collector):
    """SubjectAccessReviews answered, by apiVersion, answer and the caller's cluster, as
    plain integers sampled at scrape time (the review path's ReviewTally does the same,
    for the same reason: an ``inc()`` of prometheus_client takes a lock on every review).

    ``cluster`` is a configured cluster's name or ``default`` (authn_gateway/config/
    clusters.py: at most 256), so the series stay bounded by the config whoever calls."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}
        self.cache_hits = Count()

    def decision(self, api_version: str, answer: str, cluster: str) -> None:
        key = (api_version, answer, cluster)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        yield counter_family(
            f"{PREFIX}_authorization_decisions",
            "SubjectAccessReviews answered, by answer: allowed, denied, no_opinion "
            "(no rule matched: kube-apiserver asks its next authorizer), unavailable (no "
            "policy could decide: authorization.on_error was answered); and by the "
            "caller's cluster.",
            ["api_version", "answer", "cluster"],
            self._counts.items(),
        )
        hits = CounterMetricFamily(
            f"{PREFIX}_authorization_cache_hits",
            "SubjectAccessReviews answered from the decision cache (authorization.cache).",
        )
        hits.add_metric([], self.cache_hits.value)
        yield hits
