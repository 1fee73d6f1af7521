"""Fleet state: breaker, probe permits, token bucket and coalescing shared through Redis.

Each piece has the same interface as its in-memory twin (see :mod:`state`) and
falls back to it while Redis is down (:class:`RedisLink` decides). Design notes and
the measurements behind them are in docs/decisions.md ("Fleet mode").

* Breaker: pybreaker's storage keeps a local copy, so ``admit()`` never waits on
  Redis. Local transitions are written to a Redis hash (newest wins, by time) and
  every replica reads the hashes every ``breaker_sync_seconds``. Failure counts
  stay per replica; the open/half-open/closed state is the fleet's.
* Half-open probes: a Redis sorted-set semaphore with expiring members, so K
  probes in total, and a dead probe's permit frees itself.
* Token bucket: GCRA in one Lua script, on Redis' own clock.
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
from datetime import UTC, datetime
from typing import Any

import pybreaker

from backends.base import Outcome

from .breaker import LocalProbePermits, ProbePermits
from .bucket import BucketStore, MemoryBucketStore
from .cache import MemoryStore
from .coalesce import SingleFlight
from .config import RedisSettings
from .fleet_cache import EntryCodec, TieredCacheStore
from .keys import TokenHasher
from .metrics import Metrics
from .pipeline import Verdict
from .redis_link import RedisDown, RedisLink

log = logging.getLogger(__name__)

# Newest write wins, so a slow replica cannot roll the fleet back to an old state.
BREAKER_WRITE = """
local current = tonumber(redis.call('HGET', KEYS[1], 'updated_at') or '0')
if tonumber(ARGV[3]) > current then
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'opened_at', ARGV[2], 'updated_at', ARGV[3])
  return 1
end
return 0
"""

# A counting semaphore whose members expire: a probe that dies frees its permit.
PROBE_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

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


class SharedBreakerStorage(pybreaker.CircuitMemoryStorage):  # type: ignore[misc]
    """pybreaker storage: reads are local; state changes are published to Redis."""

    def __init__(self, backend: str, link: RedisLink, background: _Background) -> None:
        super().__init__(pybreaker.STATE_CLOSED)
        self.key = link.key("breaker", backend)
        self._link = link
        self._background = background
        self.updated_at = 0.0
        self._write_pending = False

    @property
    def state(self) -> str:
        return str(self._state)

    @state.setter
    def state(self, state: str) -> None:
        self._state = state
        self._changed()

    @property
    def opened_at(self) -> datetime | None:
        return self._opened_at

    @opened_at.setter
    def opened_at(self, value: datetime) -> None:
        self._opened_at = value
        self._changed()

    def _changed(self) -> None:
        self.updated_at = time.time()
        if not self._write_pending:
            # open() sets opened_at then state: one write carries both.
            self._write_pending = True
            self._background.spawn(self.push())

    async def push(self) -> None:
        self._write_pending = False
        opened = self._opened_at.timestamp() if self._opened_at is not None else 0.0
        args = (self._state, repr(opened), repr(self.updated_at))
        with contextlib.suppress(RedisDown):
            await self._link.script("breaker_write", BREAKER_WRITE, [self.key], list(args))

    def apply_remote(self, fields: dict[bytes, bytes]) -> bool:
        """Adopt a newer state written by another replica; True if anything changed."""
        try:
            updated = float(fields[b"updated_at"])
            state = fields[b"state"].decode()
            opened = float(fields[b"opened_at"])
        except (KeyError, ValueError):
            return False
        if updated <= self.updated_at or state not in (
            pybreaker.STATE_CLOSED,
            pybreaker.STATE_OPEN,
            pybreaker.STATE_HALF_OPEN,
        ):
            return False
        self.updated_at = updated
        self._state = state
        self._opened_at = datetime.fromtimestamp(opened, UTC) if opened else None
        return True


class RedisProbePermits:
    def __init__(
        self, backend: str, limit: int, ttl: float, link: RedisLink, background: _Background
    ) -> None:
        self._key = link.key("probes", backend)
        self._limit = limit
        self._ttl_ms = int(ttl * 1000)
        self._link = link
        self._background = background
        self._local = LocalProbePermits(limit)

    async def try_acquire(self) -> str | None:
        if not self._link.shared:
            return self._local.acquire_now()
        permit = f"{REPLICA_ID}-{secrets.token_hex(4)}"
        try:
            got = await self._link.script(
                "probe_acquire", PROBE_ACQUIRE, [self._key], [self._limit, self._ttl_ms, permit]
            )
        except RedisDown:
            return self._local.acquire_now()
        return permit if got == 1 else None

    def release(self, permit: str) -> None:
        if permit == "local":
            self._local.release(permit)
            return

        # If Redis is down the member expires on its own.
        self._background.spawn(
            self._link.best_effort("probe_release", lambda r: r.zrem(self._key, permit))
        )

    def spent(self, permit: str) -> None:
        # Keep the member until it expires: another replica may still see "half-open"
        # for up to one sync period after this probe reopened or closed the breaker, and
        # must not take a second probe in the meantime.
        if permit == "local":
            self._local.release(permit)


class RedisBucketStore:
    """Fleet-wide GCRA; while Redis is down, each replica takes R/N and B/N locally."""

    def __init__(self, link: RedisLink, replicas: int) -> None:
        self._link = link
        self._replicas = replicas
        self._local = MemoryBucketStore()

    async def take(self, key: str, interval: float, burst: int, max_wait: float) -> float | None:
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
        return self._local.take_now(key, interval * n, max(1, math.ceil(burst / n)), max_wait)


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
        self.link = link or RedisLink(settings, metrics)
        self._background = _Background()
        self._cache = TieredCacheStore(
            MemoryStore(max_entries), self.link, EntryCodec(hasher), metrics
        )
        self._buckets = RedisBucketStore(self.link, settings.expected_replicas)
        self._breakers: dict[str, SharedBreakerStorage] = {}
        self._on_breaker_change: dict[str, Callable[[], object]] = {}
        self._sync: asyncio.Task[None] | None = None
        self.link.on_resume(self._push_breakers)

    def cache_store(self) -> TieredCacheStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage:
        storage = SharedBreakerStorage(backend, self.link, self._background)
        self._breakers[backend] = storage
        return storage

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        self._on_breaker_change[backend] = refresh

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits:
        return RedisProbePermits(backend, limit, ttl, self.link, self._background)

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]:
        wait = min(self.settings.coalesce_wait_seconds, deadline + 0.5)
        return FleetFlight(
            backend, self.link, self._cache, deadline + 0.5, wait, on_join, self._background
        )

    async def start(self) -> None:
        await self.link.start()
        self._sync = asyncio.get_running_loop().create_task(self._sync_breakers())

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.cancel()
        await self.link.close()

    def _push_breakers(self) -> None:
        for storage in self._breakers.values():
            self._background.spawn(storage.push())

    async def _sync_breakers(self) -> None:
        names = list(self._breakers)
        while True:
            await asyncio.sleep(self.settings.breaker_sync_seconds)
            if not self.link.shared or not names:
                continue

            async def read(r: Any) -> list[dict[bytes, bytes]]:
                pipe = r.pipeline(transaction=False)
                for name in names:
                    pipe.hgetall(self._breakers[name].key)
                return list(await pipe.execute())

            try:
                states = await self.link.run("breaker_sync", read)
            except RedisDown:
                continue
            for name, fields in zip(names, states, strict=True):
                if self._breakers[name].apply_remote(fields):
                    refresh = self._on_breaker_change.get(name)
                    if refresh is not None:
                        refresh()
