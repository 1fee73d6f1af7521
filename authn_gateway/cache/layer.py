"""The cache layer: fresh entries answer; misses make one call per key (coalesced) and
are written back; when anything below cannot answer, a known identity is served stale.

Serve-stale lives here and nowhere else: the breaker, the budget, the deadlines and the
backend only ever say :class:`Unavailable`, and this layer decides what a known user
gets instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from backends.base import Authenticator, Unavailable, Verdict

from ..coalesce import Coalescer
from ..keys import TokenHasher
from ..layer import Layer
from ..metrics import Metrics
from .policy import CacheEntry, ReviewCache


class CacheLayer(Layer):
    def __init__(
        self,
        inner: Authenticator,
        cache: ReviewCache,
        coalescer: Coalescer,
        hasher: TokenHasher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(inner)
        self.cache = cache
        self.coalescer = coalescer
        self.hasher = hasher
        self.metrics = metrics
        self.clock = clock
        # Resolved once: these count every review.
        self._hit = metrics.cache_counter(self.name, "hit")
        self._negative_hit = metrics.cache_counter(self.name, "negative_hit")
        self._miss = metrics.cache_counter(self.name, "miss")

    async def review(self, token: str, audiences: tuple[str, ...], deadline: float) -> Verdict:
        key = self.hasher.cache_key(self.name, token, audiences)
        now = self.clock()
        entry = self.cache.peek(key, now)
        if entry is None or now >= entry.fresh_until:
            entry = await self.cache.get(key)  # the shared tier, with Redis
        if entry is not None and now < entry.fresh_until:
            (self._hit if entry.positive else self._negative_hit).inc()
            return Verdict(entry.outcome, self.name, cached=True)
        self._miss.inc()
        # Only the miss path pays for a timer. Leaving the flight early does not cancel
        # the shared call: other reviews may still be waiting for it.
        try:
            async with asyncio.timeout_at(deadline):
                verdict = await self.coalescer.do(
                    key,
                    lambda: self._fill(key, token, audiences, deadline),
                    lambda: self._recheck(key),
                )
        except TimeoutError:
            verdict = Verdict(Unavailable("no answer within the review deadline"), self.name)
        if isinstance(verdict.outcome, Unavailable):
            return self._stale_or(entry, verdict)
        return verdict

    async def _fill(
        self, key: bytes, token: str, audiences: tuple[str, ...], deadline: float
    ) -> Verdict:
        """The one call per key: ask below, write what may be cached (before any lease
        is released, so other replicas find it)."""
        verdict = await self.inner.review(token, audiences, deadline)
        if not isinstance(verdict.outcome, Unavailable):
            await self.cache.put(key, verdict.outcome, self.clock())
        return verdict

    async def _recheck(self, key: bytes) -> Verdict | None:
        entry = await self.cache.recheck(key)
        return Verdict(entry.outcome, self.name, cached=True) if entry is not None else None

    def _stale_or(self, known: CacheEntry | None, verdict: Verdict) -> Verdict:
        """Last known good: a positive entry within max_stale and the token's expiry."""
        if known is not None and known.positive and self.clock() < known.stale_until:
            self.metrics.cache(self.name, "stale_served")
            return Verdict(known.outcome, self.name, stale=True, cached=True)
        return verdict
