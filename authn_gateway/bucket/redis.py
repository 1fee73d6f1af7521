"""The fleet-wide token bucket: GCRA in one Lua script, on Redis' own clock."""

from __future__ import annotations

import math
from typing import Any

from ..redis_link import RedisLink, lua_script
from .memory import MemoryBucketStore

GCRA_TAKE = lua_script(__package__, "gcra_take.lua")


class RedisBucketStore:
    """Fleet-wide GCRA; while Redis is down, each replica takes R/N and B/N locally."""

    def __init__(self, link: RedisLink, replicas: int) -> None:
        self._link = link
        self._replicas = replicas
        self._local = MemoryBucketStore()

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        redis_key = self._link.key(key)
        args = [repr(interval), burst, repr(max_wait)]

        async def remote(r: Any) -> float | None:
            seconds = float(await self._link.script_on(r, GCRA_TAKE, [redis_key], args))
            return None if seconds < 0 else seconds

        def local() -> float | None:
            n = self._replicas
            return self._local.take_now(key, interval * n, max(1, math.ceil(burst / n)), max_wait)

        return await self._link.either("bucket_take", remote, local)
