"""Each backend's stack of layers, built in this one place.

``LAYERS`` is the order, outermost first; :func:`build_stack` wraps the backend in
them the way starlette's ``build_middleware_stack`` does. A layer is a factory
``(inner, ctx) -> Authenticator``; adding one (say an adaptive concurrency limit) is a
factory and one entry in the list. See docs/architecture.md for the picture.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from authn_gateway.config import GatewayConfig
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.breaker.gate import CallGate
from authn_gateway.layers.breaker.layer import BreakerLayer, OpenBreakerLayer
from authn_gateway.layers.breaker.metrics import BreakerMetrics
from authn_gateway.layers.breaker.override import Override
from authn_gateway.layers.breaker.rates import FailureRate, SlowCalls
from authn_gateway.layers.bucket.gcra import TokenBucket
from authn_gateway.layers.bucket.layer import BudgetLayer
from authn_gateway.layers.bucket.shares import FairShares
from authn_gateway.layers.cache.layer import CacheLayer
from authn_gateway.layers.cache.policy import ReviewCache
from authn_gateway.layers.coalesce.metrics import CoalesceMetrics
from authn_gateway.layers.concurrency.layer import ConcurrencyLayer
from authn_gateway.layers.concurrency.metrics import ConcurrencyMetrics
from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Priority
from authn_gateway.layers.concurrency.vegas import VegasLimit, VegasSettings
from authn_gateway.layers.deadline.layer import DeadlineLayer
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.carryover import cache_namespace
from authn_gateway.review.clusters import ClusterMap
from authn_gateway.review.prerejection import TokenRulesFilter
from authn_gateway.review.stores import BreakerSpec, Stores
from authn_gateway.revocation.eviction import Evictor
from backends.base import Authenticator, Backend
from backends.settings import BackendSettings


@dataclass
class StackParts:
    """What a backend's layers share, built before any layer (:func:`build_parts`), so
    no factory depends on another having run first: the outbound bucket, and for a
    backend that calls its IdP per review, its breaker and its concurrency limit."""

    bucket: TokenBucket
    breaker: CallGate | None = None
    limiter: ConcurrencyLimiter | None = None


@dataclass
class BackendStack:
    """One backend, its stack, and the parts operators reach (admin routes, metrics)."""

    name: str
    settings: BackendSettings
    backend: Backend
    #: The outermost layer: what the router and the chain call.
    top: Authenticator
    parts: StackParts
    #: The factories ``top`` was built from, outermost first (:func:`layers_for`).
    layers: tuple[LayerFactory, ...] = ()

    @property
    def bucket(self) -> TokenBucket:
        return self.parts.bucket

    @property
    def breaker(self) -> CallGate | None:
        return self.parts.breaker


@dataclass
class StackContext:
    """What a layer factory may use to build its layer for one backend."""

    settings: BackendSettings
    config: GatewayConfig
    stores: Stores
    metrics: Metrics
    hasher: TokenHasher
    parts: StackParts
    #: Operator evictions: the cache layer must not write back or serve what was evicted.
    evictor: Evictor | None = None


LayerFactory = Callable[[Authenticator, "StackContext"], Authenticator]


# ---- the parts ----------------------------------------------------------------------


def bucket_shares(config: GatewayConfig) -> FairShares | None:
    """How each backend's IdP is shared between clusters (None: no clusters)."""
    return ClusterMap(config.clusters, config.server).shares()


def outbound_bucket(
    settings: BackendSettings, stores: Stores, shares: FairShares | None = None
) -> TokenBucket:
    """The backend's call budget: built before the backend, which is handed it; shared
    between clusters by ``shares`` when clusters are configured."""
    b = settings.bucket
    return TokenBucket(f"bucket:{settings.name}", b.rate, b.burst, stores.bucket_store(), shares)


def build_parts(
    settings: BackendSettings,
    backend: Backend,
    bucket: TokenBucket,
    config: GatewayConfig,
    stores: Stores,
    metrics: Metrics,
) -> StackParts:
    if not backend.remote or not backend.calls_idp_per_review:
        # Static tokens call nobody; a local verifier (jwt) makes no IdP call per review,
        # so a crafted token must not count as the IdP failing, and it has no IdP queue
        # to protect. Its own IdP calls (key fetches) carry their own protection.
        return StackParts(bucket)
    return StackParts(
        bucket,
        fleet_breaker(settings, stores, metrics),
        concurrency_limiter(settings, config, metrics) if settings.concurrency.enabled else None,
    )


def fleet_breaker(settings: BackendSettings, stores: Stores, metrics: Metrics) -> CallGate:
    """The backend's breaker: in this process, or the fleet's in Redis (fleet/stores.py)."""
    s, name = settings.breaker, settings.name
    rate, slow = s.failure_rate, s.slow_calls
    breakers = metrics.group(BreakerMetrics)
    breaker = stores.breaker(
        BreakerSpec(
            name,
            settings,
            # A probe's permit and an in-flight slot outlive their call by a margin, then
            # free themselves.
            slot_ttl=settings.timeouts.total_seconds + 1,
            on_transition=breakers.transition,
            failure_rate=(
                FailureRate(rate.threshold, rate.window_seconds, rate.min_calls) if rate else None
            ),
            slow_calls=(
                SlowCalls(
                    slow.duration_threshold_seconds or settings.timeouts.total_seconds / 2,
                    FailureRate(slow.rate_threshold, slow.window_seconds, slow.min_calls),
                )
                if slow
                else None
            ),
        )
    )
    breakers.set_state(name, breaker.state)
    breakers.set_override(name, breaker.forced())
    return breaker


#: Extra IdP latency below this share of the call timeout (20 ms of 1 s) does not shrink
#: the limit: well under a brownout's queueing (50 ms a call here), above the gateway's jitter.
NEGLIGIBLE_DELAY_SHARE = 0.02


def concurrency_limiter(
    settings: BackendSettings, config: GatewayConfig, metrics: Metrics
) -> ConcurrencyLimiter:
    c = settings.concurrency
    # Each replica limits its own calls; in a fleet each aims at its share of the IdP's
    # queue, and starts from its share of the first round, so the fleet's total stays
    # what one replica would keep (three replicas at 20 each sent 60 calls to an IdP
    # serving 4 before any had measured it: loadtests.clusters, docs/operations.md).
    share = config.redis.expected_replicas if config.redis is not None else 1
    initial = max(c.min_limit, math.ceil(c.initial_limit / share))
    shares = bucket_shares(config)
    limiter = ConcurrencyLimiter(
        VegasLimit(
            VegasSettings(
                initial=initial,
                min_limit=c.min_limit,
                max_limit=c.max_limit,
                alpha=c.queue_low / share,
                beta=c.queue_high / share,
                # Relative to the review's own deadline, so nothing is tuned per IdP.
                negligible_delay=NEGLIGIBLE_DELAY_SHARE * settings.timeouts.total_seconds,
            )
        ),
        # The line is fair between clusters by the same weights as the bucket.
        weights=dict(zip(shares.names, shares.weights, strict=True)) if shares else None,
    )
    metrics.group(ConcurrencyMetrics).watch(
        settings.name, lambda: limiter.limit, lambda: limiter.in_flight, limiter.waiting
    )
    return limiter


# ---- the layers ---------------------------------------------------------------------


def cache_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    name, deadline = ctx.settings.name, ctx.settings.timeouts.total_seconds
    s = ctx.settings
    cache = ctx.config.cache_for(s)
    limiter = ctx.parts.limiter
    waiters = ctx.metrics.group(CoalesceMetrics).waiters
    return CacheLayer(
        inner,
        ReviewCache(cache, ctx.stores.cache_store()),
        ctx.stores.coalescer(name, deadline, waiters.labels(name).inc),
        ctx.hasher,
        ctx.metrics,
        # Known users are answered stale while their refresh waits for a slot.
        saturated=(
            (lambda cluster: limiter.would_wait(Priority.HAS_FALLBACK, cluster))
            if limiter is not None
            else None
        ),
        revalidate=cache.stale_while_revalidate,
        namespace=cache_namespace(s),
        evictor=ctx.evictor,
        stale_wait=forced_closed_wait(
            ctx.parts.breaker, s.breaker.forced_closed_stale_wait_seconds
        ),
    )


def forced_closed_wait(breaker: CallGate | None, seconds: float) -> Callable[[], float | None]:
    """How long a review with a stale entry may wait for the IdP: ``seconds`` while an
    operator forces the breaker closed (nothing else then sheds a hanging IdP), else no
    bound of its own."""

    def wait() -> float | None:
        if breaker is not None and breaker.override is Override.FORCED_CLOSED:
            return seconds
        return None

    return wait


def open_breaker_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    assert ctx.parts.breaker is not None, "only in the stack of a backend with a breaker"
    return OpenBreakerLayer(inner, ctx.parts.breaker)


def concurrency_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    assert ctx.parts.limiter is not None, "only in the stack of a backend with a limit"
    return ConcurrencyLayer(inner, ctx.parts.limiter, ctx.metrics)


def breaker_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    assert ctx.parts.breaker is not None, "only in the stack of a backend with a breaker"
    return BreakerLayer(inner, ctx.parts.breaker, ctx.metrics)


def budget_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return BudgetLayer(inner, ctx.parts.bucket, ctx.settings.bucket.max_wait_seconds, ctx.metrics)


def deadline_layer(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return DeadlineLayer(inner, ctx.settings.timeouts.total_seconds, ctx.metrics)


def token_rules(inner: Authenticator, ctx: StackContext) -> Authenticator:
    return TokenRulesFilter(inner, ctx.settings.token_rules)


#: A backend's layers, outermost first.
#: ``token_rules`` only narrows ``could_accept`` (which every layer passes through at no
#: cost), so it sits where a review reaches it least: innermost.
#: ``concurrency_layer`` is above the breaker: a call waits for its local slot first and
#: is admitted by the breaker (state check, fleet in-flight slot, probe permit) only when
#: it is about to go out, so no queued call holds a fleet slot or a probe's permit, and
#: none that queued while the breaker was closed goes out after it opened. The breaker
#: never sees the limiter's refusals (the IdP was not asked). ``open_breaker_layer``
#: above it fails fast, with no I/O and no wait for a slot, while the breaker is known
#: open. The limit is above the budget: the bucket stays the hard rate ceiling.
LAYERS: tuple[LayerFactory, ...] = (
    cache_layer,
    open_breaker_layer,
    concurrency_layer,
    breaker_layer,
    budget_layer,
    deadline_layer,
    token_rules,
)

#: A backend that verifies tokens itself (jwt: ``calls_idp_per_review = False``): its
#: answers are cached, but a review makes no IdP call, so no breaker, limit or budget:
#: a crafted token must not count as the IdP failing or spend the bucket. Its own IdP
#: calls (key fetches) take from the bucket and carry their own floor and back-off.
LOCAL_VERIFIER_LAYERS: tuple[LayerFactory, ...] = (cache_layer, deadline_layer, token_rules)

#: A backend that makes no remote call (static tokens): a deadline and its exception
#: guard, and the token rules. No cache, breaker or budget, which would protect nothing
#: and let anyone lock it out (``Backend.remote``).
LOCAL_LAYERS: tuple[LayerFactory, ...] = (deadline_layer, token_rules)


def layers_for(backend: Backend, settings: BackendSettings) -> tuple[LayerFactory, ...]:
    """The real stack of ``backend``, outermost first: every factory in it builds a layer."""
    if not backend.remote:
        return LOCAL_LAYERS
    if not backend.calls_idp_per_review:
        return LOCAL_VERIFIER_LAYERS
    if not settings.concurrency.enabled:
        return tuple(f for f in LAYERS if f is not concurrency_layer)
    return LAYERS


def build_stack(
    settings: BackendSettings,
    backend: Backend,
    bucket: TokenBucket,
    config: GatewayConfig,
    stores: Stores,
    metrics: Metrics,
    hasher: TokenHasher,
    layers: tuple[LayerFactory, ...] | None = None,
    evictor: Evictor | None = None,
) -> BackendStack:
    """Build the backend's parts, then wrap ``backend`` in ``layers`` (by default
    :func:`layers_for` the backend) the way starlette builds its middleware stack."""
    if layers is None:
        layers = layers_for(backend, settings)
    parts = build_parts(settings, backend, bucket, config, stores, metrics)
    ctx = StackContext(settings, config, stores, metrics, hasher, parts, evictor)
    top: Authenticator = backend
    for make in reversed(layers):
        top = make(top, ctx)
    return BackendStack(settings.name, settings, backend, top, parts, layers)
