"""Where each layer keeps its state: this process (:class:`MemoryStores`) or Redis,
shared by a fleet of replicas (:class:`RedisStores`).

Each store has the same interface in both; the Redis ones fall back to their memory
twin while Redis is down (:meth:`RedisLink.either`). Design notes and the measurements
behind them are in docs/decisions.md ("Fleet mode").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from authn_gateway.config import DenyListSettings, RedisSettings
from authn_gateway.fleet.fleet_size import FleetSize, share_of
from authn_gateway.fleet.metrics import FleetMetrics
from authn_gateway.fleet.redis_link import REPLICA_ID, RedisLink
from authn_gateway.fleet.shared_blobs import RedisSharedBlobs
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.breaker.gate import CallGate, replica_view
from authn_gateway.layers.breaker.machine import Breaker
from authn_gateway.layers.breaker.memory import LocalProbePermits, MemoryOverrides
from authn_gateway.layers.breaker.metrics import BreakerMetrics
from authn_gateway.layers.breaker.override import Overrides
from authn_gateway.layers.breaker.rates import FailureRate, SlowCalls
from authn_gateway.layers.breaker.redis import FleetBreaker
from authn_gateway.layers.breaker.redis_overrides import RedisOverrides
from authn_gateway.layers.breaker.redis_sync import BreakerSync
from authn_gateway.layers.bucket.gcra import BucketStore
from authn_gateway.layers.bucket.memory import MemoryBucketStore
from authn_gateway.layers.bucket.redis import RedisBucketStore
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.layers.cache.policy import CacheStore
from authn_gateway.layers.cache.redis import EntryCodec, TieredCacheStore
from authn_gateway.layers.coalesce import Coalescer
from authn_gateway.layers.coalesce.memory import LocalCoalescer
from authn_gateway.layers.coalesce.redis import LeaseCoalescer
from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation.bus import Bus
from authn_gateway.revocation.denylist import DenyStore
from authn_gateway.revocation.memory import FileDenyStore, LocalBus, MemoryDenyStore
from authn_gateway.revocation.redis import RedisBus, RedisDenyStore, reader_client
from authn_gateway.tasks import Background
from backends.settings import BackendSettings

if TYPE_CHECKING:
    from backends.shared import SharedBlobs


@dataclass(frozen=True)
class BreakerSpec:
    """What a backend's breaker is built from, in memory or in Redis."""

    backend: str
    settings: BackendSettings
    #: How long a dead caller's probe permit or in-flight slot can stay taken.
    slot_ttl: float
    on_transition: Callable[[str, str, str], None]
    failure_rate: FailureRate | None = None
    slow_calls: SlowCalls | None = None


class Stores(Protocol):
    """One instance per gateway; per-backend pieces are made on demand."""

    def cache_store(self) -> CacheStore: ...

    def bucket_store(self) -> BucketStore: ...

    def breaker(self, spec: BreakerSpec) -> CallGate:
        """The backend's breaker and in-flight ceiling."""
        ...

    def coalescer(
        self, backend: str, deadline: float, on_join: Callable[[], None]
    ) -> Coalescer: ...

    def shared_blobs(self, backend: str) -> SharedBlobs | None:
        """Values a backend shares with the fleet (jwt key sets); None without Redis."""
        ...

    def deny_store(self, settings: DenyListSettings) -> DenyStore: ...

    def revocation_bus(self) -> Bus: ...

    def forget_breaker(self, backend: str) -> None:
        """A reload changed this backend's identity: its next breaker starts closed."""
        ...

    def overrides(self) -> Overrides:
        """The operator overrides of every backend's breaker (kept across reloads)."""
        ...

    async def breaker_views(self, gates: dict[str, CallGate]) -> list[dict[str, Any]] | None:
        """Every replica's view of its breakers (``gates``: this replica's); None when
        the shared state does not answer."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryStores:
    def __init__(
        self,
        max_entries: int,
        max_negative_entries: int | None = None,
        max_entries_per_user: int | None = None,
        on_user_capped: Callable[[], None] | None = None,
    ) -> None:
        self._cache = MemoryStore(
            max_entries,
            max_negative_entries,
            max_entries_per_user=max_entries_per_user,
            on_user_capped=on_user_capped,
        )
        self._buckets = MemoryBucketStore()
        # Kept by name so that a reload's new breakers carry on from the old state.
        self._gates: dict[str, tuple[object, CallGate]] = {}
        self._overrides = MemoryOverrides()
        self._deny: DenyStore | None = None

    def cache_store(self) -> MemoryStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker(self, spec: BreakerSpec) -> CallGate:
        # Kept by name, so that a reload's stack carries on from the old state, unless
        # the breaker's own settings changed or the backend's identity did (forget_breaker).
        settings = spec.settings
        kept = self._gates.get(spec.backend)
        if kept is not None and kept[0] == (settings.breaker, settings.concurrency):
            return kept[1]
        gate = local_breaker(spec, overrides=self._overrides)
        self._gates[spec.backend] = ((settings.breaker, settings.concurrency), gate)
        return gate

    def forget_breaker(self, backend: str) -> None:
        # The override is the operator's, by backend name: it stays.
        self._gates.pop(backend, None)

    def overrides(self) -> MemoryOverrides:
        return self._overrides

    async def breaker_views(self, gates: dict[str, CallGate]) -> list[dict[str, Any]] | None:
        return [replica_view(REPLICA_ID, gates, shared=False)]

    def deny_store(self, settings: DenyListSettings) -> DenyStore:
        # One per process, so a reload keeps even a memory-only deny list.
        if self._deny is None:
            self._deny = FileDenyStore(settings.file) if settings.file else MemoryDenyStore()
        return self._deny

    def revocation_bus(self) -> Bus:
        return LocalBus()

    def coalescer(self, backend: str, deadline: float, on_join: Callable[[], None]) -> Coalescer:
        return LocalCoalescer(on_join)

    def shared_blobs(self, backend: str) -> SharedBlobs | None:
        return None  # one process: nothing to share

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
        max_negative_entries: int = 50_000,
        max_entries_per_user: int | None = None,
    ) -> None:
        self.settings = settings
        self.link = link or RedisLink(settings, metrics)
        self._hasher = hasher
        self._background = Background()
        self._cache = TieredCacheStore(
            MemoryStore(
                max_entries,
                max_negative_entries,
                max_entries_per_user=max_entries_per_user,
                on_user_capped=metrics.group(CacheMetrics).user_capped.inc,
            ),
            self.link,
            EntryCodec(hasher),
            metrics,
            max_negative_entries=max_negative_entries,
            write_back_per_second=settings.write_back_per_second,
            count_every_seconds=settings.count_shared_seconds,
        )
        # While Redis is down each replica runs on 1/share of the fleet's bounds.
        self._fleet_size = FleetSize(self.link, settings.expected_replicas, self._reshare)
        fleet_share = metrics.group(FleetMetrics).fleet_share
        self._fleet_size.on_change(fleet_share.set)
        fleet_share.set(self._fleet_size.share)
        self._local_breakers: dict[str, tuple[BackendSettings, Breaker]] = {}
        self._buckets = RedisBucketStore(
            self.link, lambda: self._fleet_size.share, self._background.spawn
        )
        self._overrides = RedisOverrides(self.link, self._background.spawn)
        self._breakers = BreakerSync(
            self.link,
            settings.breaker_sync_seconds,
            settings.retry_seconds,
            metrics.group(BreakerMetrics).propagation.observe,
            self._overrides,
        )

    def cache_store(self) -> TieredCacheStore:
        return self._cache

    def bucket_store(self) -> BucketStore:
        return self._buckets

    def breaker(self, spec: BreakerSpec) -> CallGate:
        settings, b = spec.settings, spec.settings.breaker
        # While Redis is down: this replica's share of the fleet's bounds, its own count.
        # The rate rules stay the fleet breaker's (it applies them to every call).
        local = local_breaker(
            replace(spec, failure_rate=None, slow_calls=None),
            share=self._fleet_size.share,
            overrides=self._overrides,
        )
        self._local_breakers[spec.backend] = (settings, local)
        fleet = FleetBreaker(
            spec.backend,
            b.fail_max,
            b.reset_timeout_seconds,
            b.half_open_probes,
            settings.concurrency.max_limit,
            spec.slot_ttl,
            self.link,
            local,
            self._background.spawn,
            self._overrides,
            spec.on_transition,
            spec.failure_rate,
            spec.slow_calls,
        )
        self._breakers.add(fleet)
        return fleet

    def shared_blobs(self, backend: str) -> SharedBlobs | None:
        return RedisSharedBlobs(self.link, self._hasher, backend)

    def _reshare(self, share: int) -> None:
        for settings, local in self._local_breakers.values():
            local.reshare(local_fail_max(settings, share), local_ceiling(settings, share))

    def forget_breaker(self, backend: str) -> None:
        # The shared state is the fleet's, not this replica's: only stop watching it.
        self._breakers.forget(backend)

    def overrides(self) -> RedisOverrides:
        return self._overrides

    async def breaker_views(self, gates: dict[str, CallGate]) -> list[dict[str, Any]] | None:
        return await self._breakers.views()

    def deny_store(self, settings: DenyListSettings) -> DenyStore:
        return RedisDenyStore(self.link)

    def revocation_bus(self) -> Bus:
        return RedisBus(self.link, reader_client(self.settings), REPLICA_ID)

    def coalescer(self, backend: str, deadline: float, on_join: Callable[[], None]) -> Coalescer:
        wait = min(self.settings.coalesce_wait_seconds, deadline + 0.5)
        return LeaseCoalescer(backend, self.link, deadline + 0.5, wait, on_join, self._background)

    async def start(self) -> None:
        await self.link.start()
        await self._breakers.start()
        self._fleet_size.start()
        self._cache.start()

    async def close(self) -> None:
        await self._fleet_size.close()
        await self._breakers.close()
        await self._cache.close()
        await self.link.close()


def local_breaker(spec: BreakerSpec, share: int = 1, overrides: Overrides | None = None) -> Breaker:
    """An in-process breaker with ``1/share`` of the backend's failures to open and
    in-flight ceiling (``share`` > 1: a fleet replica while Redis is down)."""
    settings, b = spec.settings, spec.settings.breaker
    return Breaker(
        spec.backend,
        local_fail_max(settings, share),
        b.reset_timeout_seconds,
        LocalProbePermits(b.half_open_probes),
        on_transition=spec.on_transition,
        failure_rate=spec.failure_rate,
        slow_calls=spec.slow_calls,
        max_in_flight=local_ceiling(settings, share),
        max_hold=b.max_retry_after_seconds,
        overrides=overrides,
    )


def local_ceiling(settings: BackendSettings, share: int) -> int | None:
    """The breaker's own in-flight slots in one process: none while the adaptive limit
    (limit/, which never exceeds ``max_limit``) is on and this is the whole budget; its
    ``1/share`` of ``max_limit`` when a fleet replica runs without Redis."""
    c = settings.concurrency
    if c.enabled and share == 1:
        return None
    return share_of(c.max_limit, share)


def local_fail_max(settings: BackendSettings, share: int) -> int:
    """Failures that open a breaker in one process: all of ``fail_max`` alone, its
    ``1/share`` in a fleet replica without Redis (so that n replicas together open
    after about ``fail_max``, not n times it)."""
    return share_of(settings.breaker.fail_max, share)
