"""The outbound token bucket (GCRA) and the per-caller inbound limiter."""

from __future__ import annotations

from backends.settings import per_second

from .gcra import EPSILON, BucketStore, TokenBucket, gcra
from .memory import InboundLimiter, MemoryBucketStore

__all__ = [
    "EPSILON",
    "BucketStore",
    "InboundLimiter",
    "MemoryBucketStore",
    "TokenBucket",
    "gcra",
    "per_second",
]
