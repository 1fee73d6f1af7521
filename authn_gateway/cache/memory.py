"""The review cache's in-process store: a bounded LRU with per-entry expiry.

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

    async def recheck(self, key: bytes) -> CacheEntry | None:
        return None  # no other process writes here

    def __len__(self) -> int:
        return len(self._data)
