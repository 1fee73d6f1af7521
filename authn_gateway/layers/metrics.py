"""What the layers count per cluster (issue 37): each cluster's calls to an IdP, their
wait for a concurrency slot, and the calls the gateway's own limits did not send.

Label values are the configured cluster names and ``default`` (callers in no cluster):
the pipeline maps every caller to one of them, so the series are bounded by the config.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from authn_gateway.observe.metrics import LATENCY_BUCKETS, PREFIX, MetricsGroup


class ClusterMetrics(MetricsGroup):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.calls = Counter(
            f"{PREFIX}_cluster_idp_calls",
            "Calls to the identity provider by cluster, as the budget let them go: paid "
            "from the cluster's own share of the bucket, or borrowed from another's.",
            ["backend", "cluster", "share"],
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_cluster_queue_wait_seconds",
            "Time a cluster's call waited for a slot under the concurrency limit.",
            ["backend", "cluster"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.shed = Counter(
            f"{PREFIX}_cluster_shed",
            "A cluster's calls the gateway's own limits did not send to the identity "
            "provider: the concurrency limit's refusals by reason, the bucket's (bucket).",
            ["backend", "cluster", "reason"],
            registry=r,
        )

    def called(self, backend: str, cluster: str, paid_by: str) -> None:
        share = "own" if paid_by == cluster else "borrowed"
        self.child(self.calls, backend, cluster, share).inc()

    def waited(self, backend: str, cluster: str, seconds: float) -> None:
        self.child(self.queue_wait, backend, cluster).observe(seconds)

    def refused(self, backend: str, cluster: str, reason: str) -> None:
        self.child(self.shed, backend, cluster, reason).inc()
