"""The concurrency-limit layer: a call goes to the IdP only with a slot under the
adaptive limit, and every call's latency feeds the limit.

It sits above the breaker: a call waits here for its slot, and only then does the
breaker admit it (state check, fleet in-flight slot, probe permit), so a queued call
holds none of those, and a call that queued while the breaker was closed is refused if
it opened meanwhile. The breaker never sees this layer's refusals (:class:`HeldBack`:
the IdP was not asked); its own (open, fleet ceiling) come back here as calls never
sent, which teach the limit nothing. The cache layer above says, in the review's
``has_fallback``, whether the review could be answered stale: such calls wait behind
those for never-seen tokens of its cluster; the line is fair between clusters
(``review.cluster``, :mod:`.fair`). With ``may_queue`` false a call takes a free slot or none
(answered :data:`SATURATED`, not counted), and the cache layer then answers stale and
queues the refresh in the background: a review cannot know at its own check that a
slot stays free (other reviews' calls may take it before its call runs), and a refresh
queued behind never-seen tokens held its review for seconds.
"""

from __future__ import annotations

from authn_gateway.layers.base import Layer
from authn_gateway.layers.concurrency.metrics import ConcurrencyMetrics
from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Priority, Refusal, Slot
from authn_gateway.layers.metrics import ClusterMetrics
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticator, HeldBack, Unavailable, Verdict
from backends.context import ReviewContext

SATURATED = HeldBack("IdP saturated: no call slot in time")


def saturated(outcome: object) -> bool:
    """Whether ``outcome`` is this layer's refusal (of any cluster's line)."""
    return isinstance(outcome, HeldBack) and outcome.reason == SATURATED.reason


class ConcurrencyLayer(Layer):
    def __init__(self, inner: Authenticator, limiter: ConcurrencyLimiter, metrics: Metrics) -> None:
        super().__init__(inner)
        self.limiter = limiter
        self.metrics = metrics.group(ConcurrencyMetrics)
        self.clusters = metrics.group(ClusterMetrics)

    async def review(self, review: ReviewContext) -> Verdict:
        priority = Priority.HAS_FALLBACK if review.has_fallback else Priority.NO_FALLBACK
        cluster = review.cluster
        if review.may_queue:
            slot: Slot | Refusal = await self.limiter.acquire(priority, review.deadline, cluster)
        elif (free := self.limiter.try_acquire(priority, cluster)) is not None:
            slot = free
        else:
            # Not counted: the refresh it queues is.
            return Verdict(HeldBack(SATURATED.reason, cluster=cluster), self.name)
        if isinstance(slot, Refusal):
            self.metrics.refusal(self.name, slot.value)
            self.clusters.refused(self.name, cluster, slot.value)
            return Verdict(HeldBack(SATURATED.reason, cluster=cluster), self.name)
        self.metrics.slot_waited(self.name, slot.waited)
        self.clusters.waited(self.name, cluster, slot.waited)
        try:
            verdict = await self.inner.review(review)
            outcome = verdict.outcome
            # A failure or timeout is a drop; a call held back below was never sent, and
            # one that timed out waiting for our own loop says nothing about the IdP.
            dropped = isinstance(outcome, Unavailable) and outcome.blames_idp
            rtt = verdict.call_seconds
            if rtt is not None:
                # The whole time on the wire: whether or not the answer waited for our
                # loop, a queue at the IdP must show (the safe side for the IdP).
                rtt += verdict.unread_seconds
            self.limiter.release(slot, rtt, dropped)
        finally:
            if not slot.done:
                self.limiter.release(slot, rtt=None)  # cancelled: nothing learnt
        return verdict
