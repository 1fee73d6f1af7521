"""The breaker layer: no call while the backend's breaker is open; every call's outcome
fed back; the IdP's Retry-After holds it open."""

from __future__ import annotations

from backends.base import Authenticator, HeldBack, Unavailable, Verdict

from ..layer import Layer
from .machine import Breaker

_OPEN = Unavailable("circuit breaker open")


class BreakerLayer(Layer):
    def __init__(self, inner: Authenticator, breaker: Breaker) -> None:
        super().__init__(inner)
        self.breaker = breaker

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        breaker = self.breaker
        ticket = await breaker.admit()
        if ticket is None:
            return Verdict(_OPEN, self.name)
        verdict = await self.inner.review(token, audiences, deadline)
        outcome = verdict.outcome
        if isinstance(outcome, HeldBack):
            breaker.release(ticket)  # our own budget said no; the IdP is not at fault
            return verdict
        breaker.record(ticket, outcome)
        if isinstance(outcome, Unavailable) and outcome.retry_after:
            # The IdP told us when to come back; no call before then, from any path.
            breaker.hold_open(outcome.retry_after)
        return verdict
