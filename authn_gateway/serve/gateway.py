"""Assembly: turns a validated config into a running pipeline, and owns its lifecycle."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from authn_gateway.authorization.metrics import AuthorizationMetrics
from authn_gateway.authorization.webhook import AuthorizationWebhook, match_condition_warning
from authn_gateway.config import SECRET_ENV, ConfigError, GatewayConfig
from authn_gateway.edge.metrics import EdgeMetrics
from authn_gateway.fleet.metrics import FleetMetrics
from authn_gateway.fleet.redis_link import REPLICA_ID
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.breaker.memory import MemoryOverrides
from authn_gateway.layers.breaker.metrics import BreakerMetrics
from authn_gateway.layers.bucket.memory import InboundLimiter
from authn_gateway.layers.bucket.metrics import LimiterMetrics
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.layers.coalesce.metrics import CoalesceMetrics
from authn_gateway.layers.concurrency.metrics import ConcurrencyMetrics
from authn_gateway.layers.deadline.metrics import CallMetrics
from authn_gateway.layers.metrics import ClusterMetrics
from authn_gateway.observe.metrics import Metrics, MetricsGroup
from authn_gateway.observe.readiness import ReadinessGate
from authn_gateway.review.carryover import identity_fingerprint
from authn_gateway.review.clusters import ClusterMap
from authn_gateway.review.markers import Markers
from authn_gateway.review.metrics import ReviewMetrics
from authn_gateway.review.pipeline import Pipeline
from authn_gateway.review.routing import Audiences, NotForCluster, PrefixRule, Router, chain_of
from authn_gateway.review.stack import BackendStack, build_stack, outbound_bucket
from authn_gateway.review.stores import MemoryStores, Stores
from authn_gateway.revocation.actions import Revocations
from authn_gateway.revocation.denylist import DenyList
from authn_gateway.revocation.eviction import Evictor
from authn_gateway.revocation.metrics import RevocationMetrics
from authn_gateway.serve.metrics import ServeMetrics
from backends.base import Authenticator, Backend, BackendConfigError
from backends.budget import UNLIMITED, CallBudget
from backends.settings import BackendSettings

log = logging.getLogger(__name__)

#: Every part's metrics (each declared beside its part). A gateway builds them all
#: whatever its config, so the families it exports, and the zeros of those without
#: labels, do not come and go with Redis, a breaker or a concurrency limit.
METRICS_GROUPS: tuple[type[MetricsGroup], ...] = (
    ReviewMetrics,
    ServeMetrics,
    EdgeMetrics,
    CacheMetrics,
    CoalesceMetrics,
    BreakerMetrics,
    ConcurrencyMetrics,
    LimiterMetrics,
    ClusterMetrics,
    CallMetrics,
    FleetMetrics,
    RevocationMetrics,
    AuthorizationMetrics,
)


def gateway_secret(config: GatewayConfig) -> bytes | None:
    if config.secret is not None:
        return config.secret.get_secret_value().encode()
    from_env = os.environ.get(SECRET_ENV)
    return from_env.encode() if from_env else None


def previous_secrets(config: GatewayConfig) -> list[bytes]:
    return [s.get_secret_value().encode() for s in config.previous_secrets]


def build_backends(
    config: GatewayConfig, source: str, budgets: Sequence[CallBudget] | None = None
) -> list[Backend]:
    """Construct every backend; a file or CA bundle it cannot use is a config error."""
    backends: list[Backend] = []
    for i, settings in enumerate(config.backends):
        try:
            backends.append(settings.build(budgets[i] if budgets else UNLIMITED))
        except BackendConfigError as exc:
            raise ConfigError(source, [f"backends[{i}] ({settings.name}): {exc}"]) from None
    return backends


def _can_carry(previous: Gateway | None, config: GatewayConfig) -> bool:
    """Whether a reload can keep the previous gateway's stores (and its keys)."""
    if previous is None:
        return False
    old = previous.config
    return (
        gateway_secret(old) == gateway_secret(config)
        and previous_secrets(old) == previous_secrets(config)
        and old.redis == config.redis
        and old.cache.max_entries == config.cache.max_entries
    )


def _forget_changed(old: GatewayConfig, new: GatewayConfig, stores: Stores) -> None:
    before = {s.name: identity_fingerprint(s) for s in old.backends}
    kept, changed = [], []
    for settings in new.backends:
        if before.get(settings.name) == identity_fingerprint(settings):
            kept.append(settings.name)
        else:
            changed.append(settings.name)
            stores.forget_breaker(settings.name)
    log.info(
        "config reload: kept cache, breaker and bucket of backends [%s]; "
        "identity settings changed (answers asked again) for [%s]",
        ", ".join(kept),
        ", ".join(changed),
    )


class Gateway:
    """Everything a running gateway holds: config, backends, their stacks, the pipeline."""

    def __init__(
        self,
        config: GatewayConfig,
        metrics: Metrics | None = None,
        stores: Stores | None = None,
        source: str = "config",
        backends: list[Backend] | None = None,
        previous: Gateway | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        for group in METRICS_GROUPS:
            self.metrics.group(group)  # once per registry: a reload's are there already
        carried = _can_carry(previous, config) if stores is None else False
        self.hasher: TokenHasher
        self.stores: Stores
        if carried and previous is not None:
            # A reload: same state stores and keys, so known users stay known (carryover.py).
            self.hasher, self.stores = previous.hasher, previous.stores
        else:
            self.hasher = TokenHasher(gateway_secret(config), previous_secrets(config))
            self.stores = stores or self._stores_for(config)
            if previous is not None:
                log.warning(
                    "config reload: secret, previous_secrets, redis or cache.max_entries "
                    "changed; the in-process cache, breakers and buckets start empty"
                )
                # An operator's override is not state to lose: it expires on its own.
                overrides = self.stores.overrides()
                if isinstance(overrides, MemoryOverrides):
                    overrides.carry_from(previous.stores.overrides())
        # Stores are closed by whichever gateway holds them last.
        self.owns_stores = True
        self._carried_from = previous if carried else None
        m = config.markers
        self.markers = Markers(m.prefix, m.stale, m.backend)
        self.evictor = Evictor(guard_seconds=config.review_deadline_seconds + 1.0)
        self.evictor.add_tier(self.stores.cache_store())
        self.revocations = Revocations(
            DenyList(self.stores.deny_store(config.deny_list)),
            self.evictor,
            self.stores.revocation_bus(),
            REPLICA_ID,
            sync_seconds=config.deny_list.sync_seconds,
            metrics=self.metrics,
        )
        if previous is not None:
            # Denials are an operator's, like overrides: not lost to a reload.
            self.revocations.deny_list.carry_from(previous.revocations.deny_list)
        self.clusters = ClusterMap(config.clusters, config.server)
        # Each backend is handed its own outbound bucket as the budget for follow-ups.
        shares = self.clusters.shares()
        buckets = [outbound_bucket(s, self.stores, shares) for s in config.backends]
        self.backends = backends or build_backends(config, source, buckets)
        if self._carried_from is not None:
            # After the backends are built: a config error must leave the running one intact.
            _forget_changed(self._carried_from.config, config, self.stores)
        stacks = {
            s.name: build_stack(
                s, b, bucket, config, self.stores, self.metrics, self.hasher, evictor=self.evictor
            )
            for s, b, bucket in zip(config.backends, self.backends, buckets, strict=True)
        }
        self.pipeline = Pipeline(
            self._router(stacks),
            stacks,
            self._inbound(),
            config.review_deadline_seconds,
            config.reject_service_account_tokens,
            self.metrics,
            deny_list=self.revocations.deny_list,
            hasher=self.hasher,
            clusters=self.clusters,
            cluster_routers={
                name: self._router(stacks, name) for name in self.clusters.restricted()
            },
        )
        # The SubjectAccessReview webhook: its policy, read now (a reload while its file
        # is broken keeps the previous gateway's rules), and its decision cache.
        self.authorization: AuthorizationWebhook | None = (
            AuthorizationWebhook(
                config.authorization,
                self.metrics,
                previous.authorization if previous is not None else None,
            )
            if config.authorization is not None
            else None
        )
        if config.authorization is not None:
            # At start, check-config and each reload: the shipped matchCondition reads a
            # marker these settings may not write.
            warning = match_condition_warning(config.markers)
            if warning is not None:
                log.warning("%s", warning)
        self.ready = False
        self.readiness = ReadinessGate(
            [
                (b, s.timeouts.total_seconds)
                for s, b in zip(config.backends, self.backends, strict=True)
            ],
            config.readiness.cold_start_grace_seconds,
        )
        if self._carried_from is not None:
            self._carried_from.owns_stores = False  # built: the stores are ours now

    def _stores_for(self, config: GatewayConfig) -> Stores:
        cache = config.cache
        if config.redis is None:
            return MemoryStores(
                cache.max_entries,
                cache.max_negative_entries,
                cache.max_entries_per_user,
                self.metrics.group(CacheMetrics).user_capped.inc,
            )
        from authn_gateway.review.stores import RedisStores

        return RedisStores(
            config.redis,
            self.hasher,
            self.metrics,
            cache.max_entries,
            max_negative_entries=cache.max_negative_entries,
            max_entries_per_user=cache.max_entries_per_user,
        )

    def _inbound(self) -> InboundLimiter | None:
        inbound = self.config.inbound_limit
        return InboundLimiter(inbound.rate, inbound.burst) if inbound.enabled else None

    def _router(
        self, stacks: dict[str, BackendStack], cluster: str | None = None
    ) -> Router[Authenticator]:
        """The router of every cluster, or of one ``cluster`` that may not use every
        backend: a backend it may not use is not in its chain, and its prefix routes
        to a refusal (:class:`NotForCluster`)."""
        configured = {
            s.name: tuple(s.audiences or self.config.audiences) for s in self.config.backends
        }
        audiences = {name: a for name, a in configured.items() if a}

        def target(inner: Authenticator) -> Authenticator:
            # The audience check wraps whatever decides: one backend or the chain.
            return Audiences(inner, audiences) if audiences else inner

        def allows(settings: BackendSettings, by_prefix: bool) -> bool:
            return cluster is None or self.clusters.allows(cluster, settings, by_prefix)

        def routed(settings: BackendSettings) -> Authenticator:
            if allows(settings, by_prefix=True):
                return target(stacks[settings.name].top)
            assert cluster is not None
            return NotForCluster(cluster, settings.name, stacks[settings.name].top.credential)

        chain = chain_of(
            [
                stacks[s.name].top
                for s in self.config.backends
                if s.chained and allows(s, by_prefix=False)
            ]
        )
        return Router(
            [
                PrefixRule(s.prefix, s.strip_prefix, routed(s))
                for s in self.config.backends
                if s.prefix is not None
            ],
            target(chain) if chain is not None else None,
        )

    async def start(self) -> None:
        if self.hasher.secret_is_random:
            log.info(
                "no gateway secret configured: using a random one (cache keys "
                "change on restart; set %s or 'secret:' to keep them)",
                SECRET_ENV,
            )
        self._export_key_ids()
        if self._carried_from is None:
            await self.stores.start()  # carried stores are running already
        await self.revocations.start()
        if self.authorization is not None:
            await self.authorization.start()
        for backend in self.backends:
            blobs = self.stores.shared_blobs(backend.name)
            if blobs is not None:
                backend.share_with_fleet(blobs)
            await backend.start()
            collector = backend.collector()
            if collector is not None:
                self.metrics.backend_collectors.attach(backend.name, collector)
        for settings, backend in zip(self.config.backends, self.backends, strict=True):
            if backend.remote:  # (remote backends have a cache: stack.layers_for)
                # Set once this config serves (a reload refused in start() leaves the old
                # value): the stale-limit alert compares the time since a success with it.
                cache = self.config.cache_for(settings)
                self.metrics.group(CacheMetrics).set_max_stale(
                    settings.name, cache.max_stale_seconds
                )
        self.ready = True

    def _export_key_ids(self) -> None:
        """authn_gateway_secret_info: which secret this replica writes with and which it
        still reads; two current key ids in one fleet are two caches (an alert)."""
        info = self.metrics.group(FleetMetrics).secret_info
        info.clear()
        if self.hasher.secret_is_random:
            return  # per process, shared with nobody: nothing to compare
        info.labels(self.hasher.key_id.hex(), "current").set(1)
        for previous in self.hasher.previous:
            info.labels(previous.key_id.hex(), "previous").set(1)

    def abandon(self) -> None:
        """A reload that failed after building this gateway: the stores go back."""
        if self._carried_from is not None:
            self._carried_from.owns_stores = True
            self.owns_stores = False

    async def close(self) -> None:
        self.ready = False
        self.readiness.close()
        if self.authorization is not None:
            await self.authorization.close()
        for backend in self.backends:
            collector = backend.collector()
            if collector is not None:
                self.metrics.backend_collectors.detach(backend.name, collector)
            try:
                await backend.close()
            except Exception:
                log.exception("backend %s did not close cleanly", backend.name)
        await self.revocations.close()
        if self.owns_stores:
            await self.stores.close()
