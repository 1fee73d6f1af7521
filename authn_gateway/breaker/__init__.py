"""Circuit breaker per backend: the state machine, its layer, memory and Redis state."""

from __future__ import annotations

from .machine import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    STATES,
    Admission,
    Breaker,
    FailureRate,
    ProbePermits,
    SlowCalls,
)
from .memory import LocalProbePermits, MemoryOverrides, memory_storage
from .override import Forced, Override, Overrides

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATES",
    "Admission",
    "Breaker",
    "FailureRate",
    "Forced",
    "LocalProbePermits",
    "MemoryOverrides",
    "Override",
    "Overrides",
    "ProbePermits",
    "SlowCalls",
    "memory_storage",
]
