"""Where the resilience layers keep their state.

:class:`LocalState` keeps everything in this process. The Redis-backed version
(:mod:`authn_gateway.fleet`) fills the same slots so that a fleet of replicas
shares cache, breaker, bucket and coalescing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from .breaker import Breaker, CallGate, FailureRate, LocalProbePermits
from .bucket import BucketStore, MemoryBucketStore
from .cache import CacheStore, MemoryStore
from .coalesce import SingleFlight
from .pipeline import Verdict
from .settings import BackendSettings


class StateFactory(Protocol):
    """One instance per gateway; per-backend pieces are made on demand."""

    def cache_store(self) -> CacheStore: ...

    def bucket_store(self) -> BucketStore: ...

    def breaker(
        self,
        backend: str,
        settings: BackendSettings,
        slot_ttl: float,
        on_transition: Callable[[str, str, str], None],
        failure_rate: FailureRate | None,
    ) -> CallGate:
        """The backend's breaker and in-flight ceiling; ``slot_ttl`` bounds how long a
        dead caller's probe permit or slot can stay taken."""
        ...

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]: ...

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

    def breaker(
        self,
        backend: str,
        settings: BackendSettings,
        slot_ttl: float,
        on_transition: Callable[[str, str, str], None],
        failure_rate: FailureRate | None,
    ) -> CallGate:
        return local_breaker(backend, settings, on_transition, failure_rate)

    def flights(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> SingleFlight[Verdict]:
        return SingleFlight(on_join)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def local_breaker(
    backend: str,
    settings: BackendSettings,
    on_transition: Callable[[str, str, str], None] | None,
    failure_rate: FailureRate | None,
    share: int = 1,
) -> Breaker:
    """An in-process breaker with ``1/share`` of the backend's in-flight ceiling."""
    b = settings.breaker
    return Breaker(
        backend,
        b.fail_max,
        b.reset_timeout_seconds,
        LocalProbePermits(b.half_open_probes),
        on_transition=on_transition,
        failure_rate=failure_rate,
        max_in_flight=max(1, math.ceil(settings.concurrency.max_in_flight / share)),
    )
