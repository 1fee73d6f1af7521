"""The token bucket's in-process state, and the per-caller inbound limiter."""

from __future__ import annotations

import time
from collections.abc import Callable

from authn_gateway.layers.bucket.fair import ShareState, fair_gcra
from authn_gateway.layers.bucket.gcra import gcra
from authn_gateway.layers.bucket.shares import FairShares


def share_key(key: str, name: str) -> str:
    """Where a cluster's share of the bucket ``key`` is kept (in memory and in Redis)."""
    return f"{{{key}}}:share:{name}"


class MemoryBucketStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._tat: dict[str, float] = {}
        # A cluster's borrowing from the others' shares: (pass, when it last asked).
        self._borrowing: dict[str, tuple[float, float]] = {}
        self._clock = clock

    def take_now(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        tat, wait = gcra(self._tat.get(key, 0.0), self._clock(), interval, burst, max_wait)
        self._tat[key] = tat
        return wait

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        return self.take_now(key, interval, burst, max_wait)

    def take_fair_now(
        self,
        key: str,
        interval: float,
        burst: int,
        max_wait: float,
        shares: FairShares,
        cluster: str,
    ) -> tuple[float | None, str]:
        names = shares.names
        keys = [share_key(key, name) for name in names]
        tat, borrowing = self._tat, self._borrowing
        state = ShareState(
            tat.get(key, 0.0),
            [tat.get(k, 0.0) for k in keys],
            [borrowing.get(k, (0.0, -1e18))[0] for k in keys],
            [borrowing.get(k, (0.0, -1e18))[1] for k in keys],
        )
        own = shares.index(cluster)
        assert own is not None, "a cluster with no share takes from the ceiling (TokenBucket)"
        new, wait, charged = fair_gcra(
            state,
            self._clock(),
            interval,
            burst,
            shares.intervals(interval),
            shares.weights,
            own,
            max_wait,
        )
        borrowing[keys[own]] = (new.passes[own], new.asked[own])
        if wait is None:
            return None, names[own]
        tat[key] = new.ceiling
        tat[keys[charged]] = new.tats[charged]
        return wait, names[charged]

    async def take_fair(
        self,
        key: str,
        interval: float,
        burst: int,
        max_wait: float,
        shares: FairShares,
        cluster: str,
    ) -> tuple[float | None, str]:
        return self.take_fair_now(key, interval, burst, max_wait, shares, cluster)

    def empty(self, key: str, interval: float, burst: int, since: float | None = None) -> None:
        """Start ``key`` as a bucket that was empty at ``since`` (monotonic; default now)
        and has refilled at its rate from then."""
        self._tat[key] = (self._clock() if since is None else since) + burst * interval


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
