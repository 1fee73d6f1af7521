"""Token bucket on calls to each backend, as GCRA over a small storage interface.

limits (5.x) offers fixed and sliding windows but no token bucket, and its
cheapest strategy costs ~6.5 us per hit in memory (docs/decisions.md). A token
bucket with rate R and burst B is one number per key under GCRA: the theoretical
arrival time (TAT) of the next call. That number lives in a :class:`BucketStore`:
:class:`~.memory.MemoryBucketStore`, or an atomic Lua script
(:class:`~.redis.RedisBucketStore`) for a fleet-wide budget.

Rates are parsed by :func:`backends.durations.per_second` (limits' notation).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from authn_gateway.layers.bucket.shares import FairShares, SharedBucket


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

    async def take_fair(
        self, bucket: SharedBucket, max_wait: float, cluster: str | None
    ) -> tuple[float | None, str | None]:
        """One call of ``cluster`` (None: a follow-up call) from the bucket ``key``
        shared by weight (:mod:`.fair`): seconds to wait (None: refused), and the share
        that paid (the cluster's own, the one it borrowed from; None when refused)."""
        ...


class TokenBucket:
    """R calls per second with bursts up to B, for one key (a backend, or a caller);
    with ``shares``, shared between clusters by weight (:mod:`.fair`)."""

    def __init__(
        self,
        key: str,
        rate_per_second: float,
        burst: int,
        store: BucketStore,
        shares: FairShares | None = None,
    ) -> None:
        self.key = key
        self.interval = 1.0 / rate_per_second
        self.burst = burst
        self.store = store
        self.shares = shares
        self.shared = SharedBucket(key, self.interval, burst, shares) if shares else None

    async def acquire(self, max_wait: float = 0.0) -> bool:
        """A call that no cluster asked for (a review's follow-up): from the share with
        the most left when the bucket is shared."""
        if self.shared is not None:
            wait, _ = await self.store.take_fair(self.shared, max_wait, None)
        else:
            wait = await self.store.take(self.key, self.interval, self.burst, max_wait)
        return await _waited(wait)

    async def acquire_for(self, cluster: str, max_wait: float = 0.0) -> tuple[bool, str | None]:
        """A review's first call, for ``cluster``: whether it may go, and the share that
        paid (its own, a lender's; None when refused, or with no shares)."""
        shared = self.shared
        if shared is None:
            return await self.acquire(max_wait), None
        # A cluster with no share (default, when every caller is in another) is charged
        # as a follow-up is.
        mine = cluster if shared.shares.index(cluster) is not None else None
        wait, paid_by = await self.store.take_fair(shared, max_wait, mine)
        return await _waited(wait), paid_by


async def _waited(wait: float | None) -> bool:
    if wait is None:
        return False
    if wait > 0:
        await asyncio.sleep(wait)
    return True
