"""Coalescing across the fleet: a Redis lease per cold key, so one replica asks the IdP.

The other replicas wait, bounded, for the holder's answer to appear in the shared
cache (``recheck``), then ask the IdP themselves if it never does (the holder died,
or the IdP could not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from authn_gateway.fleet.redis_link import REPLICA_ID, RedisDown, RedisLink, lua_script
from authn_gateway.layers.coalesce.memory import Call, Recheck
from authn_gateway.tasks import Background
from backends.base import Verdict
from backends.durations import whole_ms
from backends.flight import SingleFlight

LEASE_RELEASE = lua_script(__package__, "lease_release.lua")


class LeaseCoalescer:
    """Local single flight, plus a Redis lease per key."""

    def __init__(
        self,
        backend: str,
        link: RedisLink,
        lease: float,
        wait: float,
        on_join: Callable[[], None] | None,
        background: Background,
    ) -> None:
        self.flights: SingleFlight[Verdict] = SingleFlight(on_join)
        self._backend = backend
        self._link = link
        self._lease_ms = whole_ms(lease)
        self._wait = wait
        self._background = background

    def __len__(self) -> int:
        return len(self.flights)

    async def do(self, key: bytes, call: Call, recheck: Recheck) -> Verdict:
        return await self.flights.do(key, lambda: self._fleet_call(key, call, recheck))

    async def _fleet_call(self, key: bytes, call: Call, recheck: Recheck) -> Verdict:
        lease = self._link.key("lease", self._backend, key.hex())
        try:
            held = await self._link.run(
                "lease", lambda r: r.set(lease, REPLICA_ID, nx=True, px=self._lease_ms)
            )
        except RedisDown:
            return await call()
        if held:
            try:
                return await call()
            finally:
                self._background.spawn(self._release(lease))
        answer = await self._wait_for_holder(lease, recheck)
        return answer if answer is not None else await call()

    async def _wait_for_holder(self, lease: str, recheck: Recheck) -> Verdict | None:
        """The holder's cached answer, or None if it gave none (died, or IdP unavailable)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait
        delay = 0.01
        while loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
            try:
                still_held = await self._link.run("lease_check", lambda r: r.exists(lease))
            except RedisDown:
                return None
            # Read after the lease check: the holder writes the entry before releasing.
            answer = await recheck()
            if answer is not None or not still_held:
                return answer
        return None

    async def _release(self, lease: str) -> None:
        # If Redis is down the lease expires on its own.
        with contextlib.suppress(RedisDown):
            await self._link.script("lease_release", LEASE_RELEASE, [lease], [REPLICA_ID])
