"""Where each layer keeps its state: this process (:class:`MemoryStores`) or Redis,
shared by a fleet of replicas (:class:`RedisStores`).

Each store has the same interface in both; the Redis ones fall back to their memory
twin while Redis is down (:meth:`RedisLink.either`). Design notes and the measurements
behind them are in docs/decisions.md ("Fleet mode").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pybreaker

from .breaker.machine import ProbePermits
from .breaker.memory import LocalProbePermits, memory_storage
from .breaker.redis import BreakerSync, RedisProbePermits
from .bucket.gcra import BucketStore
from .bucket.memory import MemoryBucketStore
from .bucket.redis import RedisBucketStore
from .cache.memory import MemoryStore
from .cache.policy import CacheStore
from .cache.redis import EntryCodec, TieredCacheStore
from .coalesce import Coalescer
from .coalesce.memory import LocalCoalescer
from .coalesce.redis import LeaseCoalescer
from .config import DenyListSettings, RedisSettings
from .keys import TokenHasher
from .metrics import Metrics
from .redis_link import REPLICA_ID, RedisLink
from .revocation.bus import Bus
from .revocation.denylist import DenyStore
from .revocation.memory import FileDenyStore, LocalBus, MemoryDenyStore
from .revocation.redis import RedisBus, RedisDenyStore, reader_client
from .tasks import Background


class Stores(Protocol):
    """One instance per gateway; per-backend pieces are made on demand."""

    def cache_store(self) -> CacheStore: ...

    def bucket_store(self) -> BucketStore: ...

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage: ...

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits: ...

    def coalescer(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> Coalescer: ...

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        """``refresh`` is called when another replica changed this backend's breaker."""
        ...

    def deny_store(self, settings: DenyListSettings) -> DenyStore: ...

    def revocation_bus(self) -> Bus: ...

    def forget_breaker(self, backend: str) -> None:
        """A reload changed this backend's identity: its next breaker starts closed."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryStores:
    def __init__(self, max_entries: int) -> None:
        self._cache = MemoryStore(max_entries)
        self._buckets = MemoryBucketStore()
        # Kept by name so that a reload's new breakers carry on from the old state.
        self._breakers: dict[str, pybreaker.CircuitBreakerStorage] = {}
        self._deny: DenyStore | None = None

    def cache_store(self) -> MemoryStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage:
        storage = self._breakers.get(backend)
        if storage is None:
            storage = self._breakers[backend] = memory_storage()
        return storage

    def forget_breaker(self, backend: str) -> None:
        self._breakers.pop(backend, None)

    def deny_store(self, settings: DenyListSettings) -> DenyStore:
        # One per process, so a reload keeps even a memory-only deny list.
        if self._deny is None:
            self._deny = FileDenyStore(settings.file) if settings.file else MemoryDenyStore()
        return self._deny

    def revocation_bus(self) -> Bus:
        return LocalBus()

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits:
        return LocalProbePermits(limit)

    def coalescer(self, backend: str, deadline: float, on_join: Callable[[], None]) -> Coalescer:
        return LocalCoalescer(on_join)

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class RedisStores:
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
        self._background = Background()
        self._cache = TieredCacheStore(
            MemoryStore(max_entries), self.link, EntryCodec(hasher), metrics
        )
        self._buckets = RedisBucketStore(self.link, settings.expected_replicas)
        self._breakers = BreakerSync(self.link, self._background, settings.breaker_sync_seconds)

    def cache_store(self) -> TieredCacheStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage:
        return self._breakers.storage(backend)

    def forget_breaker(self, backend: str) -> None:
        self._breakers.forget(backend)

    def deny_store(self, settings: DenyListSettings) -> DenyStore:
        return RedisDenyStore(self.link)

    def revocation_bus(self) -> Bus:
        return RedisBus(self.link, reader_client(self.settings), REPLICA_ID)

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        self._breakers.watch(backend, refresh)

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits:
        return RedisProbePermits(backend, limit, ttl, self.link, self._background)

    def coalescer(self, backend: str, deadline: float, on_join: Callable[[], None]) -> Coalescer:
        wait = min(self.settings.coalesce_wait_seconds, deadline + 0.5)
        return LeaseCoalescer(backend, self.link, deadline + 0.5, wait, on_join, self._background)

    async def start(self) -> None:
        await self.link.start()
        self._breakers.start()

    async def close(self) -> None:
        self._breakers.stop()
        await self.link.close()
