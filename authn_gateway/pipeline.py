"""The review path, top to bottom.

    TokenReview in
      -> inbound limit (per caller)
      -> pre-rejection (control characters, service-account JWTs, per-backend rules)
      -> route (prefix, or the chain)
      -> for each backend:  cache -> coalescing -> breaker -> outbound token bucket
                            -> backend call with deadline -> cache write
      -> audiences
    answer out

:class:`Pipeline` holds the gateway-wide steps and :class:`GuardedBackend` the
per-backend ones. Each layer is a small object from its own module, injected here,
so each can be read and tested alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from backends.base import Authenticated, Backend, Outcome, Rejected, Unavailable

from .breaker import Breaker
from .bucket import InboundLimiter, TokenBucket
from .cache import CacheEntry, ReviewCache
from .coalesce import SingleFlight
from .internal_errors import internal_error
from .keys import TokenHasher
from .metrics import Metrics
from .prerejection import prerejection_reason
from .routing import Router, unavailable_in_chain
from .settings import TokenRules

log = logging.getLogger(__name__)

GATEWAY = "gateway"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    # The backend that decided ("gateway" when no backend was asked).
    backend: str
    # Served from the cache past its TTL because the backend could not answer.
    stale: bool = False
    cached: bool = False
    audiences: tuple[str, ...] = ()


class GuardedBackend:
    """One backend behind its cache, coalescing, breaker, bucket and deadline."""

    def __init__(
        self,
        backend: Backend,
        *,
        cache: ReviewCache,
        flights: SingleFlight[Verdict],
        breaker: Breaker,
        bucket: TokenBucket,
        max_wait: float,
        call_deadline: float,
        rules: TokenRules,
        audiences: tuple[str, ...],
        hasher: TokenHasher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.name = backend.name
        self.cache = cache
        self.flights = flights
        self.breaker = breaker
        self.bucket = bucket
        self.max_wait = max_wait
        self.call_deadline = call_deadline
        self.rules = rules
        self.audiences = audiences
        self.hasher = hasher
        self.metrics = metrics
        self.clock = clock
        # Resolved once: these count every review.
        self._hit = metrics.cache_counter(self.name, "hit")
        self._negative_hit = metrics.cache_counter(self.name, "negative_hit")
        self._miss = metrics.cache_counter(self.name, "miss")

    def could_accept(self, token: str) -> bool:
        rules = self.rules
        if not rules.min_length <= len(token) <= rules.max_length:
            return False
        return self.backend.could_accept(token)

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        """Answer from the cache, or from the IdP by ``deadline`` (event-loop time)."""
        key = self.hasher.cache_key(self.name, token, audiences)
        now = self.clock()
        entry = self.cache.peek(key, now)
        if entry is None or now >= entry.fresh_until:
            entry = await self.cache.get(key)  # shared tier, in fleet mode
        if entry is not None and now < entry.fresh_until:
            (self._hit if entry.positive else self._negative_hit).inc()
            return Verdict(entry.outcome, self.name, cached=True)
        self._miss.inc()
        # Only the miss path pays for a timer. Leaving the flight early does not cancel
        # the shared call: other reviews may still be waiting for it.
        try:
            async with asyncio.timeout_at(deadline):
                return await self.flights.do(key, lambda: self._ask_idp(token, key, entry))
        except TimeoutError:
            return self._fallback(entry, Unavailable("no answer within the review deadline"))

    async def _ask_idp(self, token: str, key: bytes, known: CacheEntry | None) -> Verdict:
        ticket = await self.breaker.admit()
        if ticket is None:
            return self._fallback(known, Unavailable("circuit breaker open"))
        if not await self.bucket.acquire(self.max_wait):
            self.breaker.release(ticket)
            self.metrics.limiter_refusal("outbound", self.name)
            return self._fallback(known, Unavailable("outbound rate limit reached"))
        outcome = await self._call(token)
        if isinstance(outcome, Unavailable) and not outcome.blames_idp:
            self.breaker.release(ticket)  # our own budget said no, or our own bug
        else:
            self.breaker.record(ticket, outcome)
        if isinstance(outcome, Unavailable):
            if outcome.retry_after:
                # The IdP told us when to come back; no call before then, from any path.
                self.breaker.hold_open(outcome.retry_after)
            return self._fallback(known, outcome)
        await self.cache.put(key, outcome, self.clock())
        return Verdict(outcome, self.name)

    async def _call(self, token: str) -> Outcome:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.call_deadline):
                outcome = await self.backend.authenticate(token)
        except TimeoutError:
            outcome = Unavailable(f"no answer within {self.call_deadline:g}s")
        except Exception as exc:
            # A bug of ours: not a 500, not an "invalid token", not the IdP's fault.
            outcome = internal_error(self.name, exc, self.metrics)
        self.metrics.backend_outcome(self.name, outcome, time.perf_counter() - started)
        if isinstance(outcome, Unavailable) and outcome.misconfigured:
            self.metrics.misconfigured(self.name)
            log.error("backend %s: configuration problem: %s", self.name, outcome.reason)
        return outcome

    def _fallback(self, known: CacheEntry | None, unavailable: Unavailable) -> Verdict:
        """Last known good: a positive entry within max_stale and the token's expiry."""
        if known is not None and known.positive and self.clock() < known.stale_until:
            self.metrics.cache(self.name, "stale_served")
            return Verdict(known.outcome, self.name, stale=True, cached=True)
        return Verdict(unavailable, self.name)


class Pipeline:
    def __init__(
        self,
        router: Router[GuardedBackend],
        backends: list[GuardedBackend],
        inbound: InboundLimiter | None,
        deadline: float,
        reject_service_accounts: bool,
        metrics: Metrics,
    ) -> None:
        self.router = router
        self.backends = {b.name: b for b in backends}
        self.inbound = inbound
        self.deadline = deadline
        self.reject_service_accounts = reject_service_accounts
        self.metrics = metrics

    async def review(self, token: str, audiences: tuple[str, ...], caller: str) -> Verdict:
        if self.inbound is not None and not self.inbound.allow(caller):
            self.metrics.limiter_refusal("inbound", GATEWAY)
            return Verdict(Unavailable("caller exceeded its review rate"), GATEWAY)

        reason = prerejection_reason(token, self.reject_service_accounts)
        if reason is not None:
            self.metrics.prerejection(reason)
            return Verdict(Rejected(reason), GATEWAY)

        route = self.router.route(token)
        candidates = [b for b in route.backends if b.could_accept(route.token)]
        if not candidates:
            self.metrics.prerejection("no_backend_accepts")
            return Verdict(Rejected("no backend accepts this token's form"), GATEWAY)

        # Every review is answered by this time, whatever the backends do.
        deadline = asyncio.get_running_loop().time() + self.deadline
        if len(candidates) == 1:
            verdict = await candidates[0].review(route.token, audiences, deadline)
        else:
            verdict = await self._chain(candidates, route.token, audiences, deadline)
        return self._apply_audiences(verdict, audiences)

    async def _chain(
        self,
        backends: list[GuardedBackend],
        token: str,
        audiences: tuple[str, ...],
        deadline: float,
    ) -> Verdict:
        """See :mod:`authn_gateway.routing` for the chain's rules."""
        unanswered: list[tuple[str, Unavailable]] = []
        for backend in backends:
            verdict = await backend.review(token, audiences, deadline)
            if isinstance(verdict.outcome, Authenticated):
                return verdict
            if isinstance(verdict.outcome, Unavailable):
                unanswered.append((backend.name, verdict.outcome))
        if len(backends) == 1 or not unanswered:
            return verdict
        return Verdict(unavailable_in_chain(unanswered), unanswered[0][0])

    def _apply_audiences(self, verdict: Verdict, requested: tuple[str, ...]) -> Verdict:
        """Intersect requested with configured audiences; an empty intersection refuses."""
        if not requested or not isinstance(verdict.outcome, Authenticated):
            return verdict
        backend = self.backends.get(verdict.backend)
        configured = backend.audiences if backend is not None else ()
        if not configured:
            # kube-apiserver then applies its own --api-audiences.
            return verdict
        matched = tuple(a for a in requested if a in configured)
        if not matched:
            return Verdict(Rejected("token not valid for the requested audiences"), verdict.backend)
        return Verdict(verdict.outcome, verdict.backend, verdict.stale, verdict.cached, matched)
