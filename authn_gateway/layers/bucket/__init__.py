"""The outbound token bucket (GCRA) and the per-caller inbound limiter."""

from __future__ import annotations

from authn_gateway.layers.bucket.gcra import EPSILON, BucketStore, TokenBucket, gcra
from authn_gateway.layers.bucket.memory import InboundLimiter, MemoryBucketStore
from backends.durations import per_second

__all__ = [
    "EPSILON",
    "BucketStore",
    "InboundLimiter",
    "MemoryBucketStore",
    "TokenBucket",
    "gcra",
    "per_second",
]
