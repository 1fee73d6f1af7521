"""Assembly: turns a validated config into a running pipeline, and owns its lifecycle."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from backends.base import Authenticator, Backend, BackendConfigError
from backends.budget import UNLIMITED, CallBudget

from .bucket.memory import InboundLimiter
from .config import SECRET_ENV, ConfigError, GatewayConfig
from .keys import TokenHasher
from .metrics import Metrics
from .pipeline import Pipeline
from .routing import Audiences, PrefixRule, Router, chain_of
from .stack import BackendStack, build_stack, outbound_bucket
from .stores import MemoryStores, Stores

log = logging.getLogger(__name__)


def gateway_secret(config: GatewayConfig) -> bytes | None:
    if config.secret is not None:
        return config.secret.get_secret_value().encode()
    from_env = os.environ.get(SECRET_ENV)
    return from_env.encode() if from_env else None


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


class Gateway:
    """Everything a running gateway holds: config, backends, their stacks, the pipeline."""

    def __init__(
        self,
        config: GatewayConfig,
        metrics: Metrics | None = None,
        stores: Stores | None = None,
        source: str = "config",
        backends: list[Backend] | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.hasher = TokenHasher(gateway_secret(config))
        self.stores = stores or self._stores_for(config)
        # Each backend is handed its own outbound bucket as the budget for follow-ups.
        buckets = [outbound_bucket(s, self.stores) for s in config.backends]
        self.backends = backends or build_backends(config, source, buckets)
        stacks = {
            s.name: build_stack(s, b, bucket, config, self.stores, self.metrics, self.hasher)
            for s, b, bucket in zip(config.backends, self.backends, buckets, strict=True)
        }
        self.pipeline = Pipeline(
            self._router(stacks),
            stacks,
            self._inbound(),
            config.review_deadline_seconds,
            config.reject_service_account_tokens,
            self.metrics,
        )
        self.ready = False

    def _stores_for(self, config: GatewayConfig) -> Stores:
        if config.redis is None:
            return MemoryStores(config.cache.max_entries)
        from .stores import RedisStores

        return RedisStores(config.redis, self.hasher, self.metrics, config.cache.max_entries)

    def _inbound(self) -> InboundLimiter | None:
        inbound = self.config.inbound_limit
        return InboundLimiter(inbound.rate, inbound.burst) if inbound.enabled else None

    def _router(self, stacks: dict[str, BackendStack]) -> Router[Authenticator]:
        configured = {
            s.name: tuple(s.audiences or self.config.audiences) for s in self.config.backends
        }
        audiences = {name: a for name, a in configured.items() if a}

        def target(inner: Authenticator) -> Authenticator:
            # The audience check wraps whatever decides: one backend or the chain.
            return Audiences(inner, audiences) if audiences else inner

        chain = chain_of([stacks[s.name].top for s in self.config.backends if s.chained])
        return Router(
            [
                PrefixRule(s.prefix, s.strip_prefix, target(stacks[s.name].top))
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
        await self.stores.start()
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
        await self.stores.close()
