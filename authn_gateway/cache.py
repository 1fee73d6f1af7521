"""Positive/negative review cache with serve-stale, over a small storage interface.

The policy (what to store, for how long, when a stale answer may be used) lives in
:class:`ReviewCache`. Where entries live is a :class:`CacheStore`: in process
(:class:`MemoryStore`, an LRU) or tiered over Redis (:mod:`authn_gateway.redis_store`).

Times are Unix wall-clock seconds because entries travel between processes and
token expiries are reported by IdPs in wall-clock time.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from backends.base import Authenticated, Outcome, Rejected

from .settings import CacheSettings


@dataclass(frozen=True, slots=True)
class CacheEntry:
    outcome: Authenticated | Rejected
    # Until then the entry answers reviews on its own.
    fresh_until: float
    # Until then it may answer when the IdP cannot (positive entries only).
    stale_until: float

    @property
    def positive(self) -> bool:
        return isinstance(self.outcome, Authenticated)


class CacheStore(Protocol):
    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        """The in-process tier only, without awaiting: the cache-hit fast path."""
        ...

    async def get(self, key: bytes) -> CacheEntry | None:
        """Every tier (Redis after a local miss)."""
        ...

    async def put(self, key: bytes, entry: CacheEntry) -> None: ...

    def __len__(self) -> int: ...


class MemoryStore:
    """Bounded LRU. Expired entries are dropped when met or pushed out by size."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.time) -> None:
        self._max = max_entries
        self._clock = clock
        self._data: OrderedDict[bytes, CacheEntry] = OrderedDict()

    def get_now(self, key: bytes, now: float) -> CacheEntry | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry.stale_until <= now:
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return entry

    def put_now(self, key: bytes, entry: CacheEntry) -> None:
        self._data[key] = entry
        self._data.move_to_end(key)
        while len(self._data) > self._max:
            self._data.popitem(last=False)

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self.get_now(key, now)

    async def get(self, key: bytes) -> CacheEntry | None:
        return self.get_now(key, self._clock())

    async def put(self, key: bytes, entry: CacheEntry) -> None:
        self.put_now(key, entry)

    def __len__(self) -> int:
        return len(self._data)


class ReviewCache:
    """What is cached, for how long, and whether an entry is fresh or only stale."""

    def __init__(self, settings: CacheSettings, store: CacheStore) -> None:
        self.settings = settings
        self.store = store

    def entry_for(self, outcome: Outcome, now: float) -> CacheEntry | None:
        """The entry to store for an outcome, or None when it must not be cached."""
        s = self.settings
        if isinstance(outcome, Authenticated):
            limit = outcome.expires_at if outcome.expires_at is not None else float("inf")
            if limit <= now or s.positive_ttl_seconds <= 0:
                return None
            fresh = min(now + s.positive_ttl_seconds, limit)
            return CacheEntry(outcome, fresh, min(fresh + s.max_stale_seconds, limit))
        if isinstance(outcome, Rejected):
            if s.negative_ttl_seconds <= 0:
                return None
            jitter = 1.0 + random.uniform(-s.negative_jitter, s.negative_jitter)
            fresh = now + s.negative_ttl_seconds * jitter
            return CacheEntry(outcome, fresh, fresh)
        # Unavailable is never cached: the next review must be free to ask again.
        return None

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self.store.peek(key, now)

    async def get(self, key: bytes) -> CacheEntry | None:
        return await self.store.get(key)

    async def put(self, key: bytes, outcome: Outcome, now: float) -> None:
        entry = self.entry_for(outcome, now)
        if entry is not None:
            await self.store.put(key, entry)
