"""The budget layer: the review's first call to the IdP takes from the backend's
outbound token bucket, from its cluster's share when the bucket is shared between
clusters (:mod:`.fair`); its follow-up calls take from the same bucket, handed to the
backend at construction."""

from __future__ import annotations

from authn_gateway.layers.base import Layer
from authn_gateway.layers.bucket.gcra import TokenBucket
from authn_gateway.layers.bucket.metrics import LimiterMetrics
from authn_gateway.layers.metrics import ClusterMetrics
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticator, HeldBack, Verdict
from backends.context import ReviewContext

#: What a review refused by its cluster's share of the bucket is told.
REFUSED = "outbound rate limit reached"


class BudgetLayer(Layer):
    def __init__(
        self, inner: Authenticator, bucket: TokenBucket, max_wait: float, metrics: Metrics
    ) -> None:
        super().__init__(inner)
        self.bucket = bucket
        self.max_wait = max_wait
        self.limiters = metrics.group(LimiterMetrics)
        self.clusters = metrics.group(ClusterMetrics)

    async def review(self, review: ReviewContext) -> Verdict:
        cluster = review.cluster
        allowed, paid_by = await self.bucket.acquire_for(cluster, self.max_wait)
        if not allowed:
            self.limiters.refusal("outbound", self.name)
            self.clusters.refused(self.name, cluster, "bucket")
            return Verdict(HeldBack(REFUSED, cluster=cluster), self.name)
        self.clusters.called(self.name, cluster, paid_by or cluster)
        return await self.inner.review(review)
