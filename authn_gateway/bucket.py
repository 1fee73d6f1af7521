"""Token bucket on calls to each backend, as GCRA over a small storage interface.

limits (5.x) offers fixed and sliding windows but no token bucket, and its
cheapest strategy costs ~6.5 us per hit in memory (docs/decisions.md). A token
bucket with rate R and burst B is one number per key under GCRA: the theoretical
arrival time (TAT) of the next call. That number lives in a :class:`BucketStore`:
:class:`MemoryBucketStore` here, an atomic Lua script in
:mod:`authn_gateway.redis_store` for a fleet-wide budget.

Rates are written the way limits writes them ("50/second", "3000/minute") and
parsed by limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import limits


def per_second(rate: str | float) -> float:
    """``"50/second"``, ``"3000/minute"`` or a plain number per second."""
    if isinstance(rate, int | float):
        return float(rate)
    item = limits.parse(rate)
    return item.amount / item.get_expiry()


def gcra(
    tat: float, now: float, interval: float, burst: int, max_wait: float
) -> tuple[float, float | None]:
    """One GCRA step. Returns (new TAT, seconds to wait) or (old TAT, None) when refused.

    A call is allowed when, after it, no more than ``burst`` calls are "ahead" of
    the steady rate; a call that would be allowed within ``max_wait`` reserves its
    slot and waits for it.
    """
    new_tat = max(tat, now) + interval
    allow_at = new_tat - burst * interval
    wait = allow_at - now
    # The tolerance absorbs float rounding, which could refuse an idle bucket's first call.
    if wait > max_wait + EPSILON:
        return tat, None
    return new_tat, max(0.0, wait)


EPSILON = 1e-9


class BucketStore(Protocol):
    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        """Seconds to wait before the call may go (0 = now), or None when refused."""
        ...


class MemoryBucketStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._tat: dict[str, float] = {}
        self._clock = clock

    def take_now(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        tat, wait = gcra(self._tat.get(key, 0.0), self._clock(), interval, burst, max_wait)
        self._tat[key] = tat
        return wait

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        return self.take_now(key, interval, burst, max_wait)

    def empty(self, key: str, interval: float, burst: int, since: float | None = None) -> None:
        """Start ``key`` as a bucket that was empty at ``since`` (monotonic; default now)
        and has refilled at its rate from then."""
        self._tat[key] = (self._clock() if since is None else since) + burst * interval


class TokenBucket:
    """R calls per second with bursts up to B, for one key (a backend, or a caller)."""

    def __init__(self, key: str, rate_per_second: float, burst: int, store: BucketStore) -> None:
        self.key = key
        self.interval = 1.0 / rate_per_second
        self.burst = burst
        self.store = store

    async def acquire(self, max_wait: float = 0.0) -> bool:
        wait = await self.store.take(self.key, self.interval, self.burst, max_wait)
        if wait is None:
            return False
        if wait > 0:
            await asyncio.sleep(wait)
        return True


class InboundLimiter:
    """Per-caller bucket, in process. Synchronous: it runs on every review."""

    def __init__(self, rate_per_second: float, burst: int, max_callers: int = 100_000) -> None:
        self._interval = 1.0 / rate_per_second
        self._burst = burst
        self._max_callers = max_callers
        self._store = MemoryBucketStore()

    def allow(self, caller: str) -> bool:
        store = self._store
        if len(store._tat) > self._max_callers:
            # Callers idle long enough have full buckets again; forgetting them is exact.
            now = time.monotonic()
            store._tat = {k: v for k, v in store._tat.items() if v > now}
        return store.take_now(caller, self._interval, self._burst, 0.0) is not None
