"""Putting back what the shared tier lost: write-back, read-repair and the epoch marker.

Redis may lose entries without any call failing: FLUSHALL, a memory-only restart
between two calls, ``maxmemory`` evicting keys. A pod started then, during an IdP
outage, finds nothing for users the other pods still serve from their local tiers
(issue 32: 2 replicas, FLUSHALL, the IdP refusing, a pod restarted 8 s later: 0 of 5
known users served). Three mechanisms close that window:

* **Write-back** (:meth:`SharedTierRepair.write_back`): when sharing resumes, or when
  the epoch marker says Redis was emptied, every live local identity is written back,
  at most ``redis.write_back_per_second``, most recently used first, ``SET NX``.
* **The epoch marker**, a key with a random value set once in an empty Redis, that only
  goes when everything goes. It is read every :data:`EPOCH_CHECK_SECONDS` (one
  pipelined SET NX + GET), not only at each count (``redis.count_shared_seconds``,
  15 s): a FLUSHALL is noticed within a second, before a pod restarted after it starts.
* **Read-repair** (:meth:`SharedTierRepair.missing`): a review that reads Redis for an
  identity this replica holds live locally, and finds nothing, writes it back at once
  (``SET NX``, in the background, within the same per-second budget). It reaches keys
  that a whole-cache event does not announce (``maxmemory`` evictions, a DEL) and puts
  the users being reviewed right now ahead of a long write-back.

An eviction must not be undone by either: the operator's eviction drops the local
entry before it deletes the shared one, on every replica, so a read-repair that finds
the local entry gone once its write has landed deletes what it wrote (see
:meth:`SharedTierRepair._repair`). Only identities are repaired; the local tier holds
at most ``max_entries_per_user`` per user, so the per-user bound in Redis holds too.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from authn_gateway.fleet.redis_link import RedisLink
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.layers.cache.policy import CacheEntry
from authn_gateway.observe.metrics import Metrics
from authn_gateway.tasks import STOP_PATIENCE, Background, cancel_and_wait

log = logging.getLogger(__name__)

# Write-back batches per second (each one pipeline): rate / this entries in each, at
# most WRITE_BACK_MAX_BATCH (~8 commands each), well within a Redis call's deadline.
WRITE_BACK_BATCHES_PER_SECOND = 10
WRITE_BACK_MAX_BATCH = 200
# How often the epoch marker is read: the longest a FLUSHALL goes unnoticed while no
# Redis call fails. One pipelined round trip per replica and second.
EPOCH_CHECK_SECONDS = 1.0

#: Writes ``items`` (key, entry) to Redis with client ``r`` at time ``now``, ``SET NX``
#: when the flag says so; which ones were written (TieredCacheStore._write).
WriteItems = Callable[[Any, list[tuple[bytes, CacheEntry]], float, bool], Awaitable[list[bool]]]


class SharedTierRepair:
    def __init__(
        self,
        local: MemoryStore,
        link: RedisLink,
        write: WriteItems,
        redis_key: Callable[[bytes], str],
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        per_second: int = 500,
        count_every_seconds: float = 15.0,
    ) -> None:
        self._local = local
        self._link = link
        self._write = write
        self._redis_key = redis_key
        self._metrics = metrics.group(CacheMetrics)
        self._clock = clock
        self._rate = per_second
        self._count_every = count_every_seconds
        self.live_key = link.key("cache-live")
        # Set once in an empty Redis; see _noticed.
        self._epoch_key = link.key("cache-epoch")
        self._epoch: bytes | None = None
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._background = Background()
        # Read-repair: keys being written, and this second's budget.
        self._repairing: set[bytes] = set()
        self._repair_second = 0
        self._repairs_this_second = 0
        self._written_back = self._metrics.written_back.labels("written")
        self._kept = self._metrics.written_back.labels("kept")
        self._repaired = self._metrics.written_back.labels("repaired")
        link.on_resume(self._resumed)

    # ---- read-repair ----

    def missing(self, key: bytes, entry: CacheEntry) -> None:
        """Redis lacks ``key``, which this replica holds live as ``entry``: write it back
        in the background (within the budget; one write per key at a time)."""
        if not entry.positive or key in self._repairing or not self._link.shared:
            return
        second = int(self._clock())
        if second != self._repair_second:
            self._repair_second, self._repairs_this_second = second, 0
        if self._repairs_this_second >= self._rate:
            return  # the next review of this user tries again
        self._repairs_this_second += 1
        self._repairing.add(key)
        self._background.spawn(self._repair(key, entry))

    async def _repair(self, key: bytes, entry: CacheEntry) -> None:
        try:
            now = self._clock()
            if self._local.get_now(key, now) is None:
                return  # evicted (or expired) since the read
            done = await self._link.best_effort(
                "cache_read_repair", lambda r: self._write(r, [(key, entry)], now, True)
            )
            if not done or not done[0]:
                return  # Redis down, or another replica wrote it meanwhile
            if self._local.get_now(key, self._clock()) is None:
                # An eviction dropped the local entry while the write was on its way; its
                # delete in Redis may have gone first. Ours goes now.
                await self._link.best_effort("cache_read_repair", lambda r: self._undo(r, key))
                return
            self._repaired.inc()
        finally:
            self._repairing.discard(key)

    async def _undo(self, r: Any, key: bytes) -> None:
        pipe = r.pipeline(transaction=False)
        pipe.delete(self._redis_key(key))
        pipe.zrem(self.live_key, key)
        await pipe.execute()

    # ---- write-back of everything, when Redis came back or was emptied ----

    def _resumed(self) -> None:
        # Whatever Redis lost while it was away (maybe everything) is written back.
        self._spawn("write_back", self.write_back())

    def _spawn(self, name: str, coro: Any) -> None:
        running = self._tasks.get(name)
        if running is not None:
            running.cancel()  # a write-back from an earlier episode: start over
        self._tasks[name] = asyncio.get_running_loop().create_task(coro)

    async def write_back(self) -> int:
        """Write this replica's live local identities to Redis, where none is stored under
        their keys; stops when Redis fails again. The number written."""
        rate = self._rate
        batch = min(WRITE_BACK_MAX_BATCH, max(1, rate // WRITE_BACK_BATCHES_PER_SECOND))
        identities = self._local.live_identities(self._clock)
        written = kept = 0
        while chunk := list(itertools.islice(identities, batch)):
            write = self._batch_writer(chunk)
            done = await self._link.best_effort("cache_write_back", write)
            if done is None:
                log.warning(
                    "redis: failed again during the write-back of local identities "
                    "(%d written); the rest stay local until it answers",
                    written,
                )
                return written
            added = sum(done)
            written, kept = written + added, kept + len(chunk) - added
            self._written_back.inc(added)
            self._kept.inc(len(chunk) - added)
            await asyncio.sleep(len(chunk) / rate)
        log.info(
            "redis: sharing resumed; wrote back %d live local identities "
            "(%d were in Redis already)",
            written,
            kept,
        )
        await self.count_shared(notice_emptied=False)
        return written

    def _batch_writer(self, chunk: list[tuple[bytes, CacheEntry]]) -> Callable[[Any], Any]:
        now = self._clock()
        return lambda r: self._write(r, chunk, now, True)

    # ---- counting, and noticing an emptied Redis ----

    async def count_shared(self, notice_emptied: bool = True) -> int | None:
        """Identities in Redis under this prefix (expired ones dropped from the count
        first), exported as a gauge; None while Redis is down. Reads the epoch too."""
        now_ms = int(self._clock() * 1000)
        epoch = os.urandom(8).hex().encode()

        async def count(r: Any) -> tuple[int, bytes | None]:
            pipe = r.pipeline(transaction=False)
            pipe.zremrangebyscore(self.live_key, "-inf", now_ms)
            pipe.zcard(self.live_key)
            pipe.set(self._epoch_key, epoch, nx=True)
            pipe.get(self._epoch_key)
            _, n, _, seen = await pipe.execute()
            return int(n), seen

        counted = await self._link.best_effort("cache_count", count)
        if counted is None:
            return None
        n, seen = counted
        self._metrics.shared_identities.set(n)
        self._noticed(seen, notice_emptied)
        return n

    async def check_epoch(self) -> None:
        """Read the epoch marker (setting it in an empty Redis); write back on a change."""
        epoch = os.urandom(8).hex().encode()

        async def read(r: Any) -> bytes | None:
            pipe = r.pipeline(transaction=False)
            pipe.set(self._epoch_key, epoch, nx=True)
            pipe.get(self._epoch_key)
            _, seen = await pipe.execute()
            return seen  # type: ignore[no-any-return]

        if self._link.shared:
            seen = await self._link.best_effort("cache_epoch", read)
            if seen is not None:
                self._noticed(seen, True)

    def _noticed(self, seen: bytes | None, notice_emptied: bool) -> None:
        """A Redis that lost its data without this replica seeing an error (FLUSHALL, or
        a restart between two calls) has a new marker: write back."""
        if notice_emptied and self._epoch is not None and seen != self._epoch:
            running = self._tasks.get("write_back")
            if running is None or running.done():
                log.warning(
                    "redis: the shared cache was emptied (FLUSHALL, or a restart without "
                    "persistence); writing back live local identities"
                )
                self._spawn("write_back", self.write_back())
        self._epoch = seen

    async def _watch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_count = loop.time()
        while True:
            if loop.time() >= next_count:
                await self.count_shared()
                next_count = loop.time() + self._count_every
            else:
                await self.check_epoch()
            await asyncio.sleep(min(EPOCH_CHECK_SECONDS, self._count_every))

    def start(self) -> None:
        self._spawn("count", self._watch_forever())

    async def close(self) -> None:
        for name, task in list(self._tasks.items()):
            if not await cancel_and_wait(task, STOP_PATIENCE):
                log.warning("shared cache: the %s task did not stop; left behind", name)
        self._tasks.clear()
