"""The cache layer: fresh entries answer; misses make one call per key (coalesced) and
are written back; when anything below cannot answer, a known identity is served stale.

Serve-stale lives here and nowhere else: the breaker, the budget, the deadlines and the
backend only ever say :class:`Unavailable`, and this layer decides what a known user
gets instead. It also answers a known user stale *before* asking, while the refresh
runs in the background, when the IdP is saturated (``saturated(cluster)``: the
concurrency limit has no free slot for a refresh of the review's cluster) or when
stale-while-revalidate is on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from authn_gateway.eager import in_a_task
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.base import Layer
from authn_gateway.layers.cache.metrics import CacheMetrics
from authn_gateway.layers.cache.policy import CacheEntry, PreviousKeys, ReviewCache
from authn_gateway.layers.coalesce import Coalescer
from authn_gateway.layers.concurrency.layer import saturated
from authn_gateway.observe.metrics import Metrics
from authn_gateway.revocation.eviction import Evictor
from authn_gateway.tasks import Background
from backends.base import Authenticated, Authenticator, HeldBack, Unavailable, Verdict
from backends.context import ReviewContext


class CacheLayer(Layer):
    def __init__(
        self,
        inner: Authenticator,
        cache: ReviewCache,
        coalescer: Coalescer,
        hasher: TokenHasher,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        saturated: Callable[[str], bool] | None = None,
        revalidate: bool = False,
        *,
        namespace: str | None = None,
        evictor: Evictor | None = None,
        stale_wait: Callable[[], float | None] | None = None,
    ) -> None:
        super().__init__(inner)
        self.saturated = saturated
        # Seconds a review that has a stale fallback waits for the call (None: the
        # deadline). The shared call is not cancelled: it refreshes the entry.
        self.stale_wait = stale_wait
        self.revalidate = revalidate
        self._refreshing: set[bytes] = set()
        self._background = Background()
        # Keys are per backend *and* per identity-relevant settings (carryover.py): after
        # a reload that changed them, the old entries are never found, so never served.
        self.namespace = namespace or self.name
        self.evictor = evictor
        self.cache = cache
        self.coalescer = coalescer
        self.hasher = hasher
        self.metrics = metrics.group(CacheMetrics)
        self.clock = clock
        # Resolved once: these count every review.
        self._hit = self.metrics.counter(self.name, "hit")
        self._negative_hit = self.metrics.counter(self.name, "negative_hit")
        self._miss = self.metrics.counter(self.name, "miss")

    async def review(self, review: ReviewContext) -> Verdict:
        token, audiences = review.token, review.audiences
        key = self.hasher.cache_key(self.namespace, token, audiences)
        now = self.clock()
        entry = self.cache.peek(key, now)
        if entry is None or now >= entry.fresh_until:
            # Not answerable at once (no fresh local entry): the review carries on in a
            # task from here (authn_gateway/eager.py), with the key computed.
            await in_a_task()
            entry = await self.cache.get(key, self._previous_keys(token, audiences))
        if entry is not None and now < entry.fresh_until:
            (self._hit if entry.positive else self._negative_hit).inc()
            return Verdict(entry.outcome, self.name, cached=True)
        self._miss.inc()
        asked_at = self.evictor.now() if self.evictor is not None else 0.0
        servable = self._servable(entry, asked_at)
        if entry is not None and servable and self._stale_first(key, review.cluster):
            # A known user: answered stale now; the refresh waits its turn meanwhile.
            return self._stale_and_refresh(entry, key, review)
        if not review.miss_allowed():
            # Only reviews that need the IdP pay for the caller's rate: kube-apiserver is
            # one caller for all its users, and a cache hit (no IdP call, microseconds)
            # is never refused, so a burst of junk cannot fail cached users too.
            refused = Verdict(HeldBack("caller exceeded its review rate"), self.name)
            return self._stale_or(entry, refused, asked_at)
        # Only the miss path pays for a timer. Leaving the flight early does not cancel
        # the shared call: other reviews may still be waiting for it.
        deadline = review.deadline
        answer_by = deadline  # the call itself keeps the full deadline
        wait = self.stale_wait() if servable and self.stale_wait is not None else None
        if wait is not None:
            answer_by = min(deadline, asyncio.get_running_loop().time() + wait)
        try:
            async with asyncio.timeout_at(answer_by):
                verdict = await self.coalescer.do(
                    key,
                    # A known user's call takes a free slot or none: no queue.
                    lambda: self._fill(key, review, servable, not servable),
                    lambda: self._recheck(key),
                )
                if _another_clusters_refusal(verdict, review.cluster):
                    # It joined a call another cluster's share or line refused: the IdP
                    # was not asked, and that cluster's storm is not this review's. It
                    # asks under its own cluster's share, once; other reviews of the
                    # token that come meanwhile join this call.
                    verdict = await self.coalescer.do(
                        key,
                        lambda: self._fill(key, review, servable, not servable),
                        lambda: self._recheck(key),
                    )
        except TimeoutError:
            verdict = Verdict(Unavailable("no answer within the review deadline"), self.name)
        if saturated(verdict.outcome) and entry is not None and servable:
            # The slot it saw free was taken before its call ran: stale, refresh queued.
            return self._stale_and_refresh(entry, key, review)
        if isinstance(verdict.outcome, Unavailable):
            return self._stale_or(entry, verdict, asked_at)
        return verdict

    def _stale_and_refresh(self, entry: CacheEntry, key: bytes, review: ReviewContext) -> Verdict:
        if key not in self._refreshing:
            self._refreshing.add(key)
            self._background.spawn(self._refresh(key, review))
        return self._stale(entry)

    def _previous_keys(self, token: str, audiences: tuple[str, ...]) -> PreviousKeys | None:
        """Where replicas on a previous secret keep this answer (only while rotating)."""
        hasher = self.hasher
        if not hasher.previous:
            return None
        return lambda: hasher.previous_cache_keys(self.namespace, token, audiences)

    def _stale_first(self, key: bytes, cluster: str) -> bool:
        if self.revalidate or key in self._refreshing:
            return True  # (a refresh already on its way: no need to wait for it)
        # (Saturated for the review's cluster: the line is fair between clusters.)
        return self.saturated is not None and self.saturated(cluster)

    async def _refresh(self, key: bytes, review: ReviewContext) -> None:
        try:
            await self.coalescer.do(
                key,
                lambda: self._fill(key, review, True),
                lambda: self._recheck(key),
            )
        finally:
            self._refreshing.discard(key)

    async def _fill(
        self,
        key: bytes,
        review: ReviewContext,
        has_fallback: bool = False,
        may_queue: bool = True,
    ) -> Verdict:
        """The one call per key: ask below, write what may be cached (before any lease
        is released, so other replicas find it)."""
        asked_at = self.evictor.now() if self.evictor is not None else 0.0
        # The concurrency limit below lets calls with no fallback go first.
        call = review.for_call(has_fallback=has_fallback, may_queue=may_queue)
        verdict = await self.inner.review(call)
        outcome = verdict.outcome
        if isinstance(outcome, Unavailable):
            return verdict
        # The id the review log shows: of the credential this backend reads (in a chain,
        # another member may re-spell what this one takes as sent).
        token_id = self.hasher.token_id(self.credential(review.token))
        identity = outcome.user if isinstance(outcome, Authenticated) else None
        if self.evictor is not None and self.evictor.evicted_since(
            identity.username if identity else None,
            token_id,
            asked_at,
            identity.credential_ids if identity else (),
        ):
            # Evicted while we asked: the answer is real, but must not outlive the eviction.
            return verdict
        await self.cache.put(key, outcome, self.clock(), token_id)
        return verdict

    async def _recheck(self, key: bytes) -> Verdict | None:
        entry = await self.cache.recheck(key)
        return Verdict(entry.outcome, self.name, cached=True) if entry is not None else None

    def _servable(self, known: CacheEntry | None, asked_at: float) -> bool:
        """A positive entry within the running config's max_stale and the token's
        expiry, that no operator evicted while this review waited: a fallback."""
        if known is None or self.clock() >= self.cache.stale_limit(known):
            return False
        return self.evictor is None or not self.evictor.evicted_since(
            known.username, known.token_id, asked_at, known.credential_ids
        )

    def _stale(self, known: CacheEntry) -> Verdict:
        self.metrics.stale_served(self.name, self.clock() - known.fresh_until)
        return Verdict(known.outcome, self.name, stale=True, cached=True)

    def _stale_or(self, known: CacheEntry | None, verdict: Verdict, asked_at: float) -> Verdict:
        """Last known good, else ``verdict``."""
        if known is not None and self._servable(known, asked_at):
            return self._stale(known)
        return verdict


def _another_clusters_refusal(verdict: Verdict, cluster: str) -> bool:
    """Whether ``verdict`` is a refusal by another cluster's share or line (the review
    joined that cluster's call for the token)."""
    outcome = verdict.outcome
    return isinstance(outcome, HeldBack) and outcome.cluster not in (None, cluster)
