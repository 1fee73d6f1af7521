"""Helpers shared by the tiers of test_hostile."""

from __future__ import annotations

import time

from authn_gateway.layers.cache.policy import CacheEntry
from backends.base import (
    Authenticated,
    Rejected,
)

# What kube-apiserver passes on: any text a client sent, bytes that are not UTF-8 as U+FFFD.
NON_ASCII = ("good-é1", "good-\ufffd", "good-\u0663", "ключ-good", "good-\u202etxt", "good-✓")


def cached(outcome: Authenticated | Rejected, ttl: float = 60) -> CacheEntry:
    now = time.time()
    return CacheEntry(outcome, now + ttl, now + ttl * 2)
