"""The review cache: policy, the layer, and its memory and Redis stores."""

from __future__ import annotations

from .memory import MemoryStore
from .policy import CacheEntry, CacheStore, ReviewCache

__all__ = ["CacheEntry", "CacheStore", "MemoryStore", "ReviewCache"]
