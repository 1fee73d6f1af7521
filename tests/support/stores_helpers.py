"""Helpers shared by the tiers of test_stores."""

from __future__ import annotations

import time
from typing import Any

from authn_gateway.layers.cache import CacheEntry


def entry(outcome: Any, ttl: float = 60) -> CacheEntry:
    now = time.time()
    return CacheEntry(outcome, now + ttl, now + ttl * 2)
