"""The token bucket's in-process state, and the per-caller inbound limiter."""

from __future__ import annotations

import time
from collections.abc import Callable

from authn_gateway.layers.bucket.fair import NEVER, ShareState, fair_gcra
from authn_gateway.layers.bucket.gcra import gcra
from authn_gateway.layers.bucket.shares import SharedBucket


def share_key(key: str, name: str) -> str:
    """Where a cluster's share of the bucket ``key`` is kept (in memory and in Redis,
    where the braces keep every share of one bucket in one hash slot)."""
    return f"{{{key}}}:share:{name}"


def borrowing_key(key: str, name: str) -> str:
    """Where a cluster's borrowing from the other shares of ``key`` is kept."""
    return share_key(key, name) + ":borrowing"


class MemoryBucketStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._tat: dict[str, float] = {}
        # A cluster's borrowing from the others' shares: (pass, when it last asked, the
        # TAT of its calls at its share's rate).
        self._borrowing: dict[str, tuple[float, float, float]] = {}
        self._clock = clock

    def take_now(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        tat, wait = gcra(self._tat.get(key, 0.0), self._clock(), interval, burst, max_wait)
        self._tat[key] = tat
        return wait

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        return self.take_now(key, interval, burst, max_wait)

    def take_fair_now(
        self, bucket: SharedBucket, max_wait: float, cluster: str | None, scale: int = 1
    ) -> tuple[float | None, str | None]:
        """:meth:`take_fair`, at once; ``scale``: each share at 1/scale of its rate,
        the same tolerance (a replica's part while Redis is down)."""
        shares = bucket.shares
        keys = [share_key(bucket.key, name) for name in shares.names]
        tat, borrowing = self._tat, self._borrowing
        unknown = (0.0, NEVER, 0.0)
        known = [borrowing.get(k, unknown) for k in keys]
        state = ShareState(
            [tat.get(k, 0.0) for k in keys],
            [b[0] for b in known],
            [b[1] for b in known],
            [b[2] for b in known],
        )
        own = None if cluster is None else shares.index(cluster)
        new, wait, charged = fair_gcra(
            state, self._clock(), bucket.tau, bucket.scaled(scale), shares.weights, own, max_wait
        )
        if own is not None:
            borrowing[keys[own]] = (new.passes[own], new.asked[own], new.credits[own])
        if wait is None:
            return None, None
        for k, before, after in zip(keys, state.tats, new.tats, strict=True):
            if after != before:
                tat[k] = after
        return wait, shares.names[charged]

    async def take_fair(
        self, bucket: SharedBucket, max_wait: float, cluster: str | None
    ) -> tuple[float | None, str | None]:
        return self.take_fair_now(bucket, max_wait, cluster)

    def empty(self, key: str, interval: float, burst: float, since: float | None = None) -> None:
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
