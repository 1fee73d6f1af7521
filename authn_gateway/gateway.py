"""Assembly: turns a validated config into a running pipeline, and owns its lifecycle."""

from __future__ import annotations

import logging
import os

from backends.base import Backend, BackendConfigError

from .breaker import Breaker, FailureRate
from .bucket import InboundLimiter, TokenBucket
from .cache import ReviewCache
from .config import SECRET_ENV, ConfigError, GatewayConfig
from .keys import TokenHasher
from .metrics import Metrics
from .pipeline import GuardedBackend, Pipeline
from .routing import PrefixRule, Router
from .settings import BackendSettings
from .state import LocalState, StateFactory

log = logging.getLogger(__name__)


def gateway_secret(config: GatewayConfig) -> bytes | None:
    if config.secret is not None:
        return config.secret.get_secret_value().encode()
    from_env = os.environ.get(SECRET_ENV)
    return from_env.encode() if from_env else None


def build_backends(config: GatewayConfig, source: str) -> list[Backend]:
    """Construct every backend; a file or CA bundle it cannot use is a config error."""
    backends: list[Backend] = []
    for i, settings in enumerate(config.backends):
        try:
            backends.append(settings.build())
        except BackendConfigError as exc:
            raise ConfigError(source, [f"backends[{i}] ({settings.name}): {exc}"]) from None
    return backends


def _failure_rate(settings: BackendSettings) -> FailureRate | None:
    rate = settings.breaker.failure_rate
    if rate is None:
        return None
    return FailureRate(rate.threshold, rate.window_seconds, rate.min_calls)


class Gateway:
    """Everything a running gateway holds: config, backends, pipeline, metrics."""

    def __init__(
        self,
        config: GatewayConfig,
        metrics: Metrics | None = None,
        state: StateFactory | None = None,
        source: str = "config",
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.hasher = TokenHasher(gateway_secret(config))
        self.backends = build_backends(config, source)
        self.state = state or self._state_for(config)
        guarded = [self._guard(s, b) for s, b in zip(config.backends, self.backends, strict=True)]
        by_name = {g.name: g for g in guarded}
        router: Router[GuardedBackend] = Router(
            [
                PrefixRule(s.prefix, s.strip_prefix, by_name[s.name])
                for s in config.backends
                if s.prefix is not None
            ],
            [by_name[s.name] for s in config.backends if s.chained],
        )
        inbound = config.inbound_limit
        self.pipeline = Pipeline(
            router,
            guarded,
            InboundLimiter(inbound.rate, inbound.burst) if inbound.enabled else None,
            config.review_deadline_seconds,
            config.reject_service_account_tokens,
            self.metrics,
        )
        self.ready = False

    def _state_for(self, config: GatewayConfig) -> StateFactory:
        if config.redis is None:
            return LocalState(config.cache.max_entries)
        from .fleet import FleetState

        return FleetState(config.redis, self.hasher, self.metrics, config.cache.max_entries)

    def _guard(self, settings: BackendSettings, backend: Backend) -> GuardedBackend:
        name = backend.name
        deadline = settings.timeouts.total_seconds
        breaker = Breaker(
            name,
            settings.breaker.fail_max,
            settings.breaker.reset_timeout_seconds,
            # A probe's permit outlives its call by a margin, then frees itself.
            self.state.probe_permits(name, settings.breaker.half_open_probes, deadline + 1.0),
            self.state.breaker_storage(name),
            on_transition=self.metrics.breaker_transition,
            failure_rate=_failure_rate(settings),
            max_hold=settings.breaker.max_retry_after_seconds,
        )
        self.state.watch_breaker(name, breaker.refresh)
        bucket = TokenBucket(
            f"bucket:{name}", settings.bucket.rate, settings.bucket.burst, self.state.bucket_store()
        )
        backend.call_budget = bucket
        self.metrics.set_breaker_state(name, breaker.state)
        return GuardedBackend(
            backend,
            cache=ReviewCache(self.config.cache_for(settings), self.state.cache_store()),
            flights=self.state.flights(name, deadline, self.metrics.coalesced.labels(name).inc),
            breaker=breaker,
            bucket=bucket,
            max_wait=settings.bucket.max_wait_seconds,
            call_deadline=deadline,
            rules=settings.token_rules,
            audiences=tuple(settings.audiences or self.config.audiences),
            hasher=self.hasher,
            metrics=self.metrics,
        )

    async def start(self) -> None:
        if self.hasher.secret_is_random:
            log.info(
                "no gateway secret configured: using a random one (cache keys "
                "change on restart; set %s or 'secret:' to keep them)",
                SECRET_ENV,
            )
        await self.state.start()
        for backend in self.backends:
            await backend.start()
        self.ready = True

    async def close(self) -> None:
        self.ready = False
        for backend in self.backends:
            try:
                await backend.close()
            except Exception:
                log.exception("backend %s did not close cleanly", backend.name)
        await self.state.close()
