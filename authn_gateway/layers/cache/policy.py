"""Positive/negative review cache policy, over a small storage interface.

The policy (what to store, for how long, when a stale answer may be used) lives in
:class:`ReviewCache`; :mod:`.layer` applies it to reviews. Where entries live is a
:class:`CacheStore`: in process (:class:`~.memory.MemoryStore`, an LRU) or tiered over
Redis (:class:`~.redis.TieredCacheStore`).

Times are Unix wall-clock seconds because entries travel between processes and
token expiries are reported by IdPs in wall-clock time.

How long a known user may be served stale is decided when the entry is read, from
its ``fresh_until`` and the *running* config's ``max_stale_seconds``
(:meth:`ReviewCache.stale_limit`), so that a reload that raises or lowers it applies
to every entry already cached. Storage keeps an identity for ``keep_stale_seconds``
past its TTL (``keep_until``): the ceiling up to which ``max_stale_seconds`` can be
raised later and still reach it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.revocation.subject import Subject
from backends.base import Authenticated, Outcome, Rejected
from backends.settings import CacheSettings

#: The keys previous secrets give a review, with their hashers (secret rotation),
#: computed only when the shared tier misses under the current key.
PreviousKeys = Callable[[], list[tuple[bytes, TokenHasher]]]


@dataclass(frozen=True, slots=True)
class CacheEntry:
    outcome: Authenticated | Rejected
    # Until then the entry answers reviews on its own.
    fresh_until: float
    # The stale limit under the *writer's* config. Never read for serving (the reader's
    # config decides: ReviewCache.stale_limit); kept for replicas of the previous
    # version, which read it from Redis as their limit during a rolling upgrade.
    stale_until: float
    # The reviewed token's log id (``TokenHasher.token_id``), so an operator can evict it.
    token_id: str | None = None
    # Kept in storage until then (past stale_until, for a later raise of max_stale);
    # 0 in entries written by the previous version, which are kept until stale_until.
    keep_until: float = 0.0

    @property
    def kept_until(self) -> float:
        """When storage may drop the entry: no config can serve it past then."""
        return max(self.keep_until, self.stale_until)

    @property
    def positive(self) -> bool:
        return isinstance(self.outcome, Authenticated)

    @property
    def username(self) -> str | None:
        outcome = self.outcome
        return outcome.user.username if isinstance(outcome, Authenticated) else None

    @property
    def credential_ids(self) -> tuple[str, ...]:
        """kube's credential ids (``JTI=...``) the identity carries, so an operator can
        evict by one."""
        outcome = self.outcome
        return outcome.user.credential_ids if isinstance(outcome, Authenticated) else ()


class CacheStore(Protocol):
    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        """The in-process tier only, without awaiting: the cache-hit fast path."""
        ...

    async def get(self, key: bytes, previous: PreviousKeys | None = None) -> CacheEntry | None:
        """Every tier (Redis after a local miss; then under ``previous`` keys)."""
        ...

    async def put(self, key: bytes, entry: CacheEntry) -> None: ...

    async def recheck(self, key: bytes) -> CacheEntry | None:
        """A fresh entry another process wrote since (the shared tier only), kept locally;
        None when there is none, or no shared tier."""
        ...

    def __len__(self) -> int: ...

    # Eviction (authn_gateway.revocation.eviction.EvictableTier).

    async def evict_local(self, subject: Subject) -> int: ...

    async def evict_shared(self, subject: Subject) -> int | None: ...


class ReviewCache:
    """What is cached, for how long, and whether an entry is fresh or only stale."""

    def __init__(self, settings: CacheSettings, store: CacheStore) -> None:
        self.settings = settings
        self.store = store

    def entry_for(
        self, outcome: Outcome, now: float, token_id: str | None = None
    ) -> CacheEntry | None:
        """The entry to store for an outcome, or None when it must not be cached."""
        s = self.settings
        if isinstance(outcome, Authenticated):
            limit = outcome.expires_at if outcome.expires_at is not None else float("inf")
            if limit <= now or s.positive_ttl_seconds <= 0:
                return None
            fresh = min(now + s.positive_ttl_seconds, limit)
            return CacheEntry(
                outcome,
                fresh,
                min(fresh + s.max_stale_seconds, limit),
                token_id,
                keep_until=min(fresh + s.keep_stale_seconds, limit),
            )
        if isinstance(outcome, Rejected):
            if s.negative_ttl_seconds <= 0:
                return None
            jitter = 1.0 + random.uniform(-s.negative_jitter, s.negative_jitter)
            fresh = now + s.negative_ttl_seconds * jitter
            return CacheEntry(outcome, fresh, fresh, token_id)
        # Unavailable is never cached: the next review must be free to ask again.
        return None

    def stale_limit(self, entry: CacheEntry) -> float:
        """Until when ``entry`` may answer stale, under the running config: its TTL's
        end plus ``max_stale_seconds``, never past the token's expiry or what storage
        keeps. 0 for a refusal (never served stale)."""
        outcome = entry.outcome
        if not isinstance(outcome, Authenticated):
            return 0.0
        limit = min(entry.fresh_until + self.settings.max_stale_seconds, entry.kept_until)
        return limit if outcome.expires_at is None else min(limit, outcome.expires_at)

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self.store.peek(key, now)

    async def get(self, key: bytes, previous: PreviousKeys | None = None) -> CacheEntry | None:
        return await self.store.get(key, previous)

    async def recheck(self, key: bytes) -> CacheEntry | None:
        return await self.store.recheck(key)

    async def put(
        self, key: bytes, outcome: Outcome, now: float, token_id: str | None = None
    ) -> None:
        entry = self.entry_for(outcome, now, token_id)
        if entry is not None:
            await self.store.put(key, entry)
