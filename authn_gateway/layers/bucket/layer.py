"""The budget layer: the review's first call to the IdP takes from the backend's
outbound token bucket (its follow-up calls take from the same bucket, handed to the
backend at construction)."""

from __future__ import annotations

from authn_gateway.layers.base import Layer
from authn_gateway.layers.bucket.gcra import TokenBucket
from authn_gateway.layers.bucket.metrics import LimiterMetrics
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticator, HeldBack, Verdict
from backends.context import ReviewContext

_REFUSED = HeldBack("outbound rate limit reached")


class BudgetLayer(Layer):
    def __init__(
        self, inner: Authenticator, bucket: TokenBucket, max_wait: float, metrics: Metrics
    ) -> None:
        super().__init__(inner)
        self.bucket = bucket
        self.max_wait = max_wait
        self.limiters = metrics.group(LimiterMetrics)

    async def review(self, review: ReviewContext) -> Verdict:
        if not await self.bucket.acquire(self.max_wait):
            self.limiters.refusal("outbound", self.name)
            return Verdict(_REFUSED, self.name)
        return await self.inner.review(review)
