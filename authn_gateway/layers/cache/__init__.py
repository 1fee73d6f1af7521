"""The review cache: policy, the layer, and its memory and Redis stores."""

from __future__ import annotations

from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.policy import CacheEntry, CacheStore, ReviewCache

__all__ = ["CacheEntry", "CacheStore", "MemoryStore", "ReviewCache"]
