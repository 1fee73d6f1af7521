"""The fleet-wide token bucket: GCRA in one Lua script, on Redis' own clock.

While Redis is down each replica takes R/N and B/N locally (N = the fleet's share,
:class:`authn_gateway.fleet.fleet_size.FleetSize`: ``expected_replicas`` or more),
from an *empty* local bucket, so switching to local mode never hands out a fresh
burst. Back in shared mode the calls made locally are charged to the shared bucket (at
most one burst's worth), and a shared bucket that Redis lost meanwhile starts empty,
not full (``resume.lua``).

A bucket shared between clusters (``fair_take.lua``, :mod:`.fair`) keeps each share in
the bucket's hash slot (Redis Cluster runs a script on one slot); while Redis is down
each replica shares its R/N the same way, each share empty as of the switch, and each
share is charged back what it spent locally.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

from authn_gateway.fleet.redis_link import RedisDown, RedisLink, lua_script
from authn_gateway.layers.bucket.memory import MemoryBucketStore, borrowing_key, share_key
from authn_gateway.layers.bucket.shares import SharedBucket

GCRA_TAKE = lua_script(__package__, "gcra_take.lua")
FAIR_TAKE = lua_script(__package__, "fair_take.lua")
RESUME = lua_script(__package__, "resume.lua")


class RedisBucketStore:
    def __init__(
        self, link: RedisLink, share: Callable[[], int], spawn: Callable[[Awaitable[Any]], None]
    ) -> None:
        self._link = link
        self._share = share
        self._spawn = spawn
        self._local = MemoryBucketStore()
        # Per key, during the current local period: calls taken locally.
        self._spent_locally: dict[str, int] = {}
        # Per key: its interval and burst (a share's burst is a fraction of calls).
        self._shapes: dict[str, tuple[float, float]] = {}
        link.on_resume(self.resumed)

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        self._shapes[key] = (interval, burst)
        redis_key = self._link.key(key)
        args = [repr(interval), burst, repr(max_wait)]

        async def remote(r: Any) -> float | None:
            seconds = float(await self._link.script_on(r, GCRA_TAKE, [redis_key], args))
            return None if seconds < 0 else seconds

        def local() -> float | None:
            n = self._share()
            # 1/N of the rate, at least one call's burst.
            local_interval = interval * n
            local_burst = max(1, math.ceil(burst / n))
            self._local_shape(key, interval, local_burst * local_interval)
            wait = self._local.take_now(key, local_interval, local_burst, max_wait)
            if wait is not None:
                self._spent_locally[key] += 1
            return wait

        return await self._link.either("bucket_take", remote, local)

    async def take_fair(
        self, bucket: SharedBucket, max_wait: float, cluster: str | None
    ) -> tuple[float | None, str | None]:
        shares, link = bucket.shares, self._link
        keys = [link.key(share_key(bucket.key, name)) for name in shares.names]
        keys += [link.key(borrowing_key(bucket.key, name)) for name in shares.names]
        own = None if cluster is None else shares.index(cluster)
        args = [
            repr(bucket.tau),
            repr(max_wait),
            -1 if own is None else own,
            *map(repr, bucket.intervals),
            *map(repr, shares.weights),
        ]

        async def remote(r: Any) -> tuple[float | None, str | None]:
            seconds, charged = await link.script_on(r, FAIR_TAKE, keys, args)
            if float(seconds) < 0:
                return None, None
            return float(seconds), shares.names[int(charged)]

        def local() -> tuple[float | None, str | None]:
            for name, interval in zip(shares.names, bucket.intervals, strict=True):
                # Each share's 1/N, empty as of the switch, like the plain bucket's.
                self._local_shape(share_key(bucket.key, name), interval, bucket.tau)
            wait, charged = self._local.take_fair_now(
                bucket, max_wait, cluster, scale=self._share()
            )
            if charged is not None:
                self._spent_locally[share_key(bucket.key, charged)] += 1
            return wait, charged

        for name, interval in zip(shares.names, bucket.intervals, strict=True):
            # Back in shared mode each share is charged what it spent locally.
            self._shapes[share_key(bucket.key, name)] = (interval, bucket.tau / interval)
        return await link.either("bucket_take", remote, local)

    def _local_shape(self, key: str, interval: float, tau: float) -> tuple[float, float]:
        """The bucket's 1/N while Redis is down (its interval N times longer, its
        tolerance the same); started empty on the first local call."""
        n = self._share()
        local_interval = interval * n
        if key not in self._spent_locally:
            # Empty as of the switch to local mode (or now, for one late answer),
            # refilling at R/N since then.
            self._spent_locally[key] = 0
            since = None if self._link.shared else self._link.local_since
            self._local.empty(key, local_interval, tau / local_interval, since=since)
        return local_interval, tau

    def resumed(self) -> None:
        """Redis answers again: charge what was spent locally to the shared buckets."""
        spent, self._spent_locally = self._spent_locally, {}
        for key, (interval, burst) in self._shapes.items():
            self._spawn(self._resume(key, interval, burst, min(spent.get(key, 0), burst)))

    async def _resume(self, key: str, interval: float, burst: float, calls: float) -> None:
        with contextlib.suppress(RedisDown):
            args = [repr(interval), repr(burst), repr(calls)]
            await self._link.script("bucket_resume", RESUME, [self._link.key(key)], args)
