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
    Override,
    ProbePermits,
)
from .memory import LocalProbePermits, memory_storage

__all__ = [
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATES",
    "Admission",
    "Breaker",
    "FailureRate",
    "LocalProbePermits",
    "Override",
    "ProbePermits",
    "memory_storage",
]
