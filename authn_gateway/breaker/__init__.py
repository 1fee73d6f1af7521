"""Circuit breaker per backend: the state machine, its layer, memory and Redis state."""

from __future__ import annotations

from .gate import BUSY, CallGate, Ticket
from .machine import CLOSED, HALF_OPEN, OPEN, STATES, Breaker, ProbePermits
from .memory import LocalProbePermits, MemoryOverrides, memory_storage
from .override import Forced, Override, Overrides
from .rates import FailureRate, SlowCalls

__all__ = [
    "BUSY",
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATES",
    "Breaker",
    "CallGate",
    "FailureRate",
    "Forced",
    "LocalProbePermits",
    "MemoryOverrides",
    "Override",
    "Overrides",
    "ProbePermits",
    "SlowCalls",
    "Ticket",
    "memory_storage",
]
