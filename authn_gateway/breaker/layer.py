"""The breaker layer: no call while the backend's breaker is open; every call's outcome
fed back (with how long it took: slow calls count); the IdP's Retry-After holds it
open."""

from __future__ import annotations

from backends.base import Authenticator, Unavailable, Verdict

from ..layer import Layer
from ..metrics import Metrics
from .machine import Breaker

_OPEN = Unavailable("circuit breaker open")


class BreakerLayer(Layer):
    def __init__(self, inner: Authenticator, breaker: Breaker, metrics: Metrics) -> None:
        super().__init__(inner)
        self.breaker = breaker
        self.metrics = metrics

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        breaker = self.breaker
        ticket = await breaker.admit()
        if ticket is None:
            return Verdict(_OPEN, self.name)
        verdict = await self.inner.review(token, audiences, deadline)
        outcome = verdict.outcome
        if isinstance(outcome, Unavailable) and not outcome.blames_idp:
            breaker.release(ticket)  # our own budget said no, or our own bug
            return verdict
        seconds = verdict.call_seconds
        breaker.record(ticket, outcome, seconds)
        threshold = breaker.slow_threshold
        if threshold is not None and seconds is not None and seconds >= threshold:
            self.metrics.slow_call(self.name)
        if isinstance(outcome, Unavailable) and outcome.retry_after:
            # The IdP told us when to come back; no call before then, from any path.
            breaker.hold_open(outcome.retry_after)
        return verdict
