"""Where the resilience layers keep their state.

:class:`LocalState` keeps everything in this process. The Redis-backed version
(:mod:`authn_gateway.redis_store`) fills the same slots so that a fleet of replicas
shares cache, breaker, bucket and coalescing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import pybreaker

from .breaker import LocalProbePermits, ProbePermits
from .bucket import BucketStore, MemoryBucketStore
from .cache import CacheStore, MemoryStore
from .coalesce import SingleFlight
from .pipeline import Verdict


class StateFactory(Protocol):
    """One instance per gateway; per-backend pieces are made on demand."""

    def cache_store(self) -> CacheStore: ...

    def bucket_store(self) -> BucketStore: ...

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage: ...

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits: ...

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]: ...

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        """``refresh`` is called when another replica changed this backend's breaker."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class LocalState:
    def __init__(self, max_entries: int) -> None:
        self._cache = MemoryStore(max_entries)
        self._buckets = MemoryBucketStore()

    def cache_store(self) -> MemoryStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker_storage(self, backend: str) -> pybreaker.CircuitBreakerStorage:
        return pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)

    def probe_permits(self, backend: str, limit: int, ttl: float) -> ProbePermits:
        return LocalProbePermits(limit)

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]:
        return SingleFlight(on_join)

    def watch_breaker(self, backend: str, refresh: Callable[[], object]) -> None:
        return None

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
