"""Positive/negative review cache policy, over a small storage interface.

The policy (what to store, for how long, when a stale answer may be used) lives in
:class:`ReviewCache`; :mod:`.layer` applies it to reviews. Where entries live is a
:class:`CacheStore`: in process (:class:`~.memory.MemoryStore`, an LRU) or tiered over
Redis (:class:`~.redis.TieredCacheStore`).

Times are Unix wall-clock seconds because entries travel between processes and
token expiries are reported by IdPs in wall-clock time.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from backends.base import Authenticated, Outcome, Rejected
from backends.settings import CacheSettings

from ..keys import TokenHasher
from ..revocation.subject import Subject

#: The keys previous secrets give a review, with their hashers (secret rotation),
#: computed only when the shared tier misses under the current key.
PreviousKeys = Callable[[], list[tuple[bytes, TokenHasher]]]


@dataclass(frozen=True, slots=True)
class CacheEntry:
    outcome: Authenticated | Rejected
    # Until then the entry answers reviews on its own.
    fresh_until: float
    # Until then it may answer when the IdP cannot (positive entries only).
    stale_until: float
    # The reviewed token's log id (``TokenHasher.token_id``), so an operator can evict it.
    token_id: str | None = None

    @property
    def positive(self) -> bool:
        return isinstance(self.outcome, Authenticated)

    @property
    def username(self) -> str | None:
        outcome = self.outcome
        return outcome.user.username if isinstance(outcome, Authenticated) else None


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
            return CacheEntry(outcome, fresh, min(fresh + s.max_stale_seconds, limit), token_id)
        if isinstance(outcome, Rejected):
            if s.negative_ttl_seconds <= 0:
                return None
            jitter = 1.0 + random.uniform(-s.negative_jitter, s.negative_jitter)
            fresh = now + s.negative_ttl_seconds * jitter
            return CacheEntry(outcome, fresh, fresh, token_id)
        # Unavailable is never cached: the next review must be free to ask again.
        return None

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
