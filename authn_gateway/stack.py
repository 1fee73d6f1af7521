"""Each backend's stack of layers, built in this one place.

``LAYERS`` is the order, outermost first; :func:`build_stack` wraps the backend in
them the way starlette's ``build_middleware_stack`` does. A layer is a factory
``(inner, ctx) -> Authenticator``; adding one (say an adaptive concurrency limit) is a
factory and one entry in the list. See docs/architecture.md for the picture.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from backends.base import Authenticator, Backend
from backends.settings import BackendSettings

from .breaker.layer import BreakerLayer
from .breaker.machine import Breaker, FailureRate
from .bucket.gcra import TokenBucket
from .bucket.layer import BudgetLayer
from .cache.layer import CacheLayer
from .cache.policy import ReviewCache
from .carryover import cache_namespace
from .config import GatewayConfig
from .deadline import DeadlineLayer
from .keys import TokenHasher
from .metrics import Metrics
from .prerejection import TokenRulesFilter
from .revocation.eviction import Evictor
from .stores import Stores


@dataclass
class BackendStack:
    """One backend, its stack, and the parts operators reach (admin routes, metrics)."""

    name: str
    settings: BackendSettings
    backend: Backend
    #: The outermost layer: what the router and the chain call.
    top: Authenticator
    #: The backend's outbound bucket: its stack's budget layer and its follow-up calls.
    bucket: TokenBucket
    breaker: Breaker | None = None
    extras: dict[str, object] = field(default_factory=dict)


@dataclass
class StackContext:
    """What a layer factory may use to build its layer for one backend."""

    settings: BackendSettings
    config: GatewayConfig
    stores: Stores
    metrics: Metrics
    hasher: TokenHasher
    handle: BackendStack
    #: Operator evictions: the cache layer must not write back or serve what was evicted.
    evictor: Evictor | None = None


LayerFactory = Callable[[Authenticator, StackContext], Authenticator]


def token_rules(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return TokenRulesFilter(inner, ctx.settings.token_rules)


def cache_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    name, deadline = ctx.settings.name, ctx.settings.timeouts.total_seconds
    s = ctx.settings
    return CacheLayer(
        inner,
        ReviewCache(ctx.config.cache_for(s), ctx.stores.cache_store()),
        ctx.stores.coalescer(name, deadline, ctx.metrics.coalesced.labels(name).inc),
        ctx.hasher,
        ctx.metrics,
        namespace=cache_namespace(s),
        evictor=ctx.evictor,
        token_prefix=s.prefix if s.strip_prefix and s.prefix else "",
    )


def breaker_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    s, name = ctx.settings.breaker, ctx.settings.name
    rate = s.failure_rate
    breaker = Breaker(
        name,
        s.fail_max,
        s.reset_timeout_seconds,
        # A probe's permit outlives its call by a margin, then frees itself.
        ctx.stores.probe_permits(name, s.half_open_probes, ctx.settings.timeouts.total_seconds + 1),
        ctx.stores.breaker_storage(name),
        on_transition=ctx.metrics.breaker_transition,
        failure_rate=(
            FailureRate(rate.threshold, rate.window_seconds, rate.min_calls) if rate else None
        ),
    )
    ctx.stores.watch_breaker(name, breaker.refresh)
    ctx.metrics.set_breaker_state(name, breaker.state)
    ctx.handle.breaker = breaker
    return BreakerLayer(inner, breaker)


def budget_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return BudgetLayer(inner, ctx.handle.bucket, ctx.settings.bucket.max_wait_seconds, ctx.metrics)


def deadline_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return DeadlineLayer(inner, ctx.settings.timeouts.total_seconds, ctx.metrics)


#: A backend's layers, outermost first.
#: ``token_rules`` only narrows ``could_accept`` (which every layer passes through at no
#: cost), so it sits where a review reaches it least: innermost.
LAYERS: tuple[LayerFactory, ...] = (
    cache_layer,
    breaker_layer,
    budget_layer,
    deadline_layer,
    token_rules,
)


def outbound_bucket(settings: BackendSettings, stores: Stores) -> TokenBucket:
    """The backend's call budget: built before the backend, which is handed it."""
    b = settings.bucket
    return TokenBucket(f"bucket:{settings.name}", b.rate, b.burst, stores.bucket_store())


def build_stack(
    settings: BackendSettings,
    backend: Backend,
    bucket: TokenBucket,
    config: GatewayConfig,
    stores: Stores,
    metrics: Metrics,
    hasher: TokenHasher,
    layers: tuple[LayerFactory, ...] = LAYERS,
    evictor: Evictor | None = None,
) -> BackendStack:
    handle = BackendStack(settings.name, settings, backend, backend, bucket)
    ctx = StackContext(settings, config, stores, metrics, hasher, handle, evictor)
    top: Authenticator = backend
    for make in reversed(layers):
        top = make(top, ctx)
    handle.top = top
    return handle
