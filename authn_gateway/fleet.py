"""Fleet state: breaker, probe permits, token bucket and coalescing shared through Redis.

Each piece has the same interface as its in-memory twin (see :mod:`state`) and
falls back to it while Redis is down (:class:`RedisLink` decides). Design notes and
the measurements behind them are in docs/decisions.md ("Fleet mode").

* Breaker and in-flight ceiling: one state machine in Redis (:mod:`fleet_breaker`):
  each call is admitted (state check + one of ``max_in_flight`` slots, or a probe
  permit) and settled (fleet-wide consecutive failure count, open at ``fail_max``) by
  a Lua script; transitions are published, and each replica fails fast from its mirror.
* Token bucket: GCRA in one Lua script, on Redis' own clock; the local fallback
  starts empty, and the return to shared mode charges what was spent locally.
* Coalescing: a lease key per cold token; the other replicas wait, bounded, for
  the holder's answer to appear in the shared cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from backends.base import Outcome

from .breaker import CallGate, FailureRate
from .bucket import BucketStore, MemoryBucketStore
from .cache import MemoryStore
from .coalesce import SingleFlight
from .config import RedisSettings
from .fleet_breaker import FleetBreaker, listen
from .fleet_cache import EntryCodec, TieredCacheStore
from .keys import TokenHasher
from .metrics import Metrics
from .pipeline import Verdict
from .redis_link import RedisDown, RedisLink
from .settings import BackendSettings
from .state import local_breaker

log = logging.getLogger(__name__)

# GCRA (see bucket.gcra), atomically, with Redis' clock so replicas agree on "now".
GCRA_TAKE = """
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval
local wait = new_tat - burst * interval - now
if wait > max_wait + 1e-9 then return '-1' end
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX',
           math.ceil((new_tat - now) * 1000) + 1000)
if wait < 0 then wait = 0 end
return string.format('%.6f', wait)
"""

# Back in shared mode: the bucket Redis lost starts empty (not full), and the calls a
# replica made on its own meanwhile (ARGV[3], at most one burst) are charged to it.
BUCKET_RESUME = """
local interval = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '-1')
local empty = now + tonumber(ARGV[2]) * interval
if tat < 0 then
  tat = empty
else
  if tat < now then tat = now end
  tat = math.min(tat + tonumber(ARGV[3]) * interval, empty)
end
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return 1
"""

# Release a lease only if we still hold it.
LEASE_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

REPLICA_ID = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class _Background:
    """Fire-and-forget writes, with references held so they are not collected."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class RedisBucketStore:
    """Fleet-wide GCRA. While Redis is down each replica takes R/N and B/N locally
    (N = ``expected_replicas``), from an *empty* local bucket, so switching to local mode
    never hands out a fresh burst; back in shared mode the calls made locally are charged
    to the shared bucket (at most one burst's worth), and a shared bucket that Redis lost
    meanwhile starts empty, not full."""

    def __init__(self, link: RedisLink, replicas: int, spawn: Callable[[Any], None]) -> None:
        self._link = link
        self._replicas = replicas
        self._spawn = spawn
        self._local = MemoryBucketStore()
        # Per key, during the current local period: calls taken locally.
        self._spent_locally: dict[str, int] = {}
        self._shapes: dict[str, tuple[float, int]] = {}

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
        self._shapes[key] = (interval, burst)
        if self._link.shared:
            redis_key = self._link.key(key)
            try:
                wait = await self._link.script(
                    "bucket_take", GCRA_TAKE, [redis_key], [repr(interval), burst, repr(max_wait)]
                )
            except RedisDown:
                pass
            else:
                seconds = float(wait)
                return None if seconds < 0 else seconds
        n = self._replicas
        local_interval, local_burst = interval * n, max(1, math.ceil(burst / n))
        if key not in self._spent_locally:
            self._spent_locally[key] = 0
            self._local.empty(key, local_interval, local_burst, since=self._link.local_since)
        wait = self._local.take_now(key, local_interval, local_burst, max_wait)
        if wait is not None:
            self._spent_locally[key] += 1
        return wait

    def resumed(self) -> None:
        """Redis answers again: charge what was spent locally to the shared buckets."""
        spent, self._spent_locally = self._spent_locally, {}
        for key, (interval, burst) in self._shapes.items():
            self._spawn(self._resume(key, interval, burst, min(spent.get(key, 0), burst)))

    async def _resume(self, key: str, interval: float, burst: int, calls: int) -> None:
        with contextlib.suppress(RedisDown):
            await self._link.script(
                "bucket_resume",
                BUCKET_RESUME,
                [self._link.key(key)],
                [repr(interval), burst, calls],
            )


class FleetFlight(SingleFlight[Verdict]):
    """Local single flight, plus a Redis lease so one replica asks the IdP per cold token."""

    def __init__(
        self,
        backend: str,
        link: RedisLink,
        cache: TieredCacheStore,
        lease: float,
        wait: float,
        on_join: Callable[[], None],
        background: _Background,
    ) -> None:
        super().__init__(on_join)
        self._backend = backend
        self._link = link
        self._cache = cache
        self._lease_ms = int(lease * 1000)
        self._wait = wait
        self._background = background

    async def do(self, key: bytes, call: Callable[[], Awaitable[Verdict]]) -> Verdict:
        return await super().do(key, lambda: self._fleet_call(key, call))

    async def _fleet_call(self, key: bytes, call: Callable[[], Awaitable[Verdict]]) -> Verdict:
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
        answer = await self._wait_for_holder(key, lease)
        return answer if answer is not None else await call()

    async def _wait_for_holder(self, key: bytes, lease: str) -> Verdict | None:
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
            answer = await self._shared_answer(key)
            if answer is not None or not still_held:
                return answer
        return None

    async def _shared_answer(self, key: bytes) -> Verdict | None:
        entry = await self._cache.get_shared(key)
        if entry is None or time.time() >= entry.fresh_until:
            return None
        self._cache.local.put_now(key, entry)
        outcome: Outcome = entry.outcome
        return Verdict(outcome, self._backend, cached=True)

    async def _release(self, lease: str) -> None:
        # If Redis is down the lease expires on its own.
        with contextlib.suppress(RedisDown):
            await self._link.script("lease_release", LEASE_RELEASE, [lease], [REPLICA_ID])


class FleetState:
    """The StateFactory for fleet mode."""

    def __init__(
        self,
        settings: RedisSettings,
        hasher: TokenHasher,
        metrics: Metrics,
        max_entries: int,
        link: RedisLink | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.link = link or RedisLink(settings, metrics)
        self._background = _Background()
        self._cache = TieredCacheStore(
            MemoryStore(max_entries), self.link, EntryCodec(hasher), metrics
        )
        self._buckets = RedisBucketStore(
            self.link, settings.expected_replicas, self._background.spawn
        )
        self.breakers: dict[str, FleetBreaker] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.link.on_resume(self._resumed)

    def cache_store(self) -> TieredCacheStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker(
        self,
        backend: str,
        settings: BackendSettings,
        slot_ttl: float,
        on_transition: Callable[[str, str, str], None],
        failure_rate: FailureRate | None,
    ) -> CallGate:
        b = settings.breaker
        fleet = FleetBreaker(
            backend,
            b.fail_max,
            b.reset_timeout_seconds,
            b.half_open_probes,
            settings.concurrency.max_in_flight,
            slot_ttl,
            self.link,
            # While Redis is down: this replica's share of the ceiling, its own count.
            local_breaker(
                backend, settings, on_transition, None, share=self.settings.expected_replicas
            ),
            self._background.spawn,
            on_transition,
            failure_rate,
        )
        self.breakers[backend] = fleet
        return fleet

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]:
        wait = min(self.settings.coalesce_wait_seconds, deadline + 0.5)
        return FleetFlight(
            backend, self.link, self._cache, deadline + 0.5, wait, on_join, self._background
        )

    async def start(self) -> None:
        await self.link.start()
        loop = asyncio.get_running_loop()
        if self.breakers:
            channel = next(iter(self.breakers.values())).channel
            observe = self.metrics.breaker_propagation.observe
            self._tasks.append(
                loop.create_task(
                    listen(self.link, channel, self.breakers, observe, self.settings.retry_seconds)
                )
            )
            self._tasks.append(loop.create_task(self._sync_breakers()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.link.close()

    def _resumed(self) -> None:
        self._buckets.resumed()
        for fleet in self.breakers.values():
            fleet.resumed()

    async def _sync_breakers(self) -> None:
        """A slow safety net under the published transitions (a message lost while the
        subscriber reconnected): read every breaker's state each sync period."""
        names = list(self.breakers)
        while True:
            await asyncio.sleep(self.settings.breaker_sync_seconds)
            if not self.link.shared:
                continue

            async def read(r: Any) -> list[list[bytes | None]]:
                pipe = r.pipeline(transaction=False)
                for name in names:
                    pipe.hmget(self.breakers[name].keys.state, "state", "opened_at")
                return list(await pipe.execute())

            try:
                states = await self.link.run("breaker_sync", read)
            except RedisDown:
                continue
            for name, (state, opened) in zip(names, states, strict=True):
                self.breakers[name].adopt(state.decode() if state else "closed", float(opened or 0))
