"""The review cache's in-process store: two bounded LRUs (identities, refusals) with
per-entry expiry.

Not cachetools: this is the cache-hit path, and an OrderedDict lookup with the
caller's clock reading costs ~0.1 us where ``TLRUCache[key]`` costs ~0.3 us and reads
its own timer (docs/decisions.md).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from .policy import CacheEntry


class MemoryStore:
    """Two bounded LRUs: identities, and refusals with a capacity of their own.

    A refusal never pushes out an identity, so a flood of random tokens (each one a
    refusal, or no entry at all) cannot evict a known user. A positive entry leaves
    only when its own lifetime ends (``stale_until``), when newer identities fill
    ``max_entries``, or when the IdP refuses that same token later (the refusal
    replaces it). Expired entries are dropped when met or pushed out by size.
    """

    def __init__(
        self,
        max_entries: int,
        max_negative_entries: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._max = max_entries
        self._max_negative = max_negative_entries or max_entries
        self._clock = clock
        self._positive: OrderedDict[bytes, CacheEntry] = OrderedDict()
        self._negative: OrderedDict[bytes, CacheEntry] = OrderedDict()

    def get_now(self, key: bytes, now: float) -> CacheEntry | None:
        segment = self._positive
        entry = segment.get(key)
        if entry is None:
            segment = self._negative
            entry = segment.get(key)
            if entry is None:
                return None
        if entry.stale_until <= now:
            del segment[key]
            return None
        segment.move_to_end(key)
        return entry

    def put_now(self, key: bytes, entry: CacheEntry) -> None:
        if entry.positive:
            segment, other, limit = self._positive, self._negative, self._max
        else:
            segment, other, limit = self._negative, self._positive, self._max_negative
        other.pop(key, None)  # one entry per key: the newer answer wins
        segment[key] = entry
        segment.move_to_end(key)
        while len(segment) > limit:
            segment.popitem(last=False)

    def peek(self, key: bytes, now: float) -> CacheEntry | None:
        return self.get_now(key, now)

    async def get(self, key: bytes) -> CacheEntry | None:
        return self.get_now(key, self._clock())

    async def put(self, key: bytes, entry: CacheEntry) -> None:
        self.put_now(key, entry)

    def __len__(self) -> int:
        return len(self._positive) + len(self._negative)

    async def recheck(self, key: bytes) -> CacheEntry | None:
        return None  # no other process writes here
