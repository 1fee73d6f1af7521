"""The breaker layer: no call while the backend's breaker is open; every call's outcome
fed back (with how long it took: slow calls count); the IdP's Retry-After holds it
open. It sits below the concurrency limit, so a call is admitted (state check, fleet
in-flight slot, probe permit) only when it is about to go out; :class:`OpenBreakerLayer`,
above the limit, fails a review fast while the breaker is known open, with no wait for a
local slot."""

from __future__ import annotations

from authn_gateway.layers.base import Layer
from authn_gateway.layers.breaker.gate import BUSY, CallGate
from authn_gateway.layers.breaker.metrics import BreakerMetrics
from authn_gateway.layers.bucket.metrics import LimiterMetrics
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticator, HeldBack, Unavailable, Verdict
from backends.context import ReviewContext

_OPEN = Unavailable("circuit breaker open")
# The fleet-wide (or, without Redis, per-process) in-flight ceiling: the gateway's own
# refusal, never counted as the IdP failing.
_BUSY = HeldBack("too many calls in flight to the IdP")


class BreakerLayer(Layer):
    def __init__(self, inner: Authenticator, breaker: CallGate, metrics: Metrics) -> None:
        super().__init__(inner)
        self.breaker = breaker
        self.breakers = metrics.group(BreakerMetrics)
        self.limiters = metrics.group(LimiterMetrics)

    async def review(self, review: ReviewContext) -> Verdict:
        breaker = self.breaker
        ticket = await breaker.admit()
        if ticket is None:
            return Verdict(_OPEN, self.name)
        if ticket is BUSY:
            self.limiters.refusal("in_flight", self.name)
            return Verdict(_BUSY, self.name)
        verdict = await self.inner.review(review)
        outcome = verdict.outcome
        if isinstance(outcome, Unavailable) and not outcome.blames_idp:
            breaker.release(ticket)  # our own budget said no, or our own bug
            return verdict
        seconds = verdict.call_seconds
        breaker.record(ticket, outcome, seconds)
        threshold = breaker.slow_threshold
        if threshold is not None and seconds is not None and seconds >= threshold:
            self.breakers.slow_call(self.name)
        if isinstance(outcome, Unavailable) and outcome.retry_after:
            # The IdP told us when to come back; no call before then, from any path.
            breaker.hold_open(outcome.retry_after)
        return verdict


class OpenBreakerLayer(Layer):
    """While the breaker is known open (no I/O), a review fails at once: it neither
    waits for a local concurrency slot nor counts as the limit's refusal."""

    def __init__(self, inner: Authenticator, breaker: CallGate) -> None:
        super().__init__(inner)
        self.breaker = breaker

    async def review(self, review: ReviewContext) -> Verdict:
        if self.breaker.fails_fast():
            return Verdict(_OPEN, self.name)
        return await self.inner.review(review)
