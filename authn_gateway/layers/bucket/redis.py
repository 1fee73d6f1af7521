"""The fleet-wide token bucket: GCRA in one Lua script, on Redis' own clock.

While Redis is down each replica takes R/N and B/N locally (N = the fleet's share,
:class:`authn_gateway.fleet.fleet_size.FleetSize`: ``expected_replicas`` or more),
from an *empty* local bucket, so switching to local mode never hands out a fresh
burst. Back in shared mode the calls made locally are charged to the shared bucket (at
most one burst's worth), and a shared bucket that Redis lost meanwhile starts empty,
not full (``resume.lua``).

A bucket shared between clusters (``fair_take.lua``, :mod:`.fair`) keeps each share
beside the ceiling, in the ceiling's hash slot (Redis Cluster runs a script on one
slot); while Redis is down each replica shares its R/N the same way, and only the
ceiling's local spending is charged back.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

from authn_gateway.fleet.redis_link import RedisDown, RedisLink, lua_script
from authn_gateway.layers.bucket.memory import MemoryBucketStore, share_key
from authn_gateway.layers.bucket.shares import FairShares

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
        self._shapes: dict[str, tuple[float, int]] = {}
        link.on_resume(self.resumed)

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        self._shapes[key] = (interval, burst)
        redis_key = self._link.key(key)
        args = [repr(interval), burst, repr(max_wait)]

        async def remote(r: Any) -> float | None:
            seconds = float(await self._link.script_on(r, GCRA_TAKE, [redis_key], args))
            return None if seconds < 0 else seconds

        def local() -> float | None:
            local_interval, local_burst = self._local_shape(key, interval, burst)
            wait = self._local.take_now(key, local_interval, local_burst, max_wait)
            if wait is not None:
                self._spent_locally[key] += 1
            return wait

        return await self._link.either("bucket_take", remote, local)

    async def take_fair(
        self,
        key: str,
        interval: float,
        burst: int,
        max_wait: float,
        shares: FairShares,
        cluster: str,
    ) -> tuple[float | None, str]:
        self._shapes[key] = (interval, burst)
        ceiling = self._link.key(key)
        keys = [ceiling, *(share_key(ceiling, name) for name in shares.names)]
        own = shares.index(cluster)
        assert own is not None, "a cluster with no share takes from the ceiling (TokenBucket)"
        args = [
            repr(interval),
            burst,
            repr(max_wait),
            own,
            *map(repr, shares.intervals(interval)),
            *map(repr, shares.weights),
        ]

        async def remote(r: Any) -> tuple[float | None, str]:
            seconds, charged = await self._link.script_on(r, FAIR_TAKE, keys, args)
            if float(seconds) < 0:
                return None, shares.names[own]
            return float(seconds), shares.names[int(charged)]

        def local() -> tuple[float | None, str]:
            local_interval, local_burst = self._local_shape(key, interval, burst)
            wait, charged = self._local.take_fair_now(
                key, local_interval, local_burst, max_wait, shares, cluster
            )
            if wait is not None:
                self._spent_locally[key] += 1
            return wait, charged

        return await self._link.either("bucket_take", remote, local)

    def _local_shape(self, key: str, interval: float, burst: int) -> tuple[float, int]:
        """The bucket's 1/N while Redis is down; started empty on the first local call."""
        n = self._share()
        local_interval, local_burst = interval * n, max(1, math.ceil(burst / n))
        if key not in self._spent_locally:
            # Empty as of the switch to local mode (or now, for one late answer),
            # refilling at R/N since then.
            self._spent_locally[key] = 0
            since = None if self._link.shared else self._link.local_since
            self._local.empty(key, local_interval, local_burst, since=since)
        return local_interval, local_burst

    def resumed(self) -> None:
        """Redis answers again: charge what was spent locally to the shared buckets."""
        spent, self._spent_locally = self._spent_locally, {}
        for key, (interval, burst) in self._shapes.items():
            self._spawn(self._resume(key, interval, burst, min(spent.get(key, 0), burst)))

    async def _resume(self, key: str, interval: float, burst: int, calls: int) -> None:
        with contextlib.suppress(RedisDown):
            args = [repr(interval), burst, calls]
            await self._link.script("bucket_resume", RESUME, [self._link.key(key)], args)
