"""Circuit breaker per backend: the state machine, its layer, memory and Redis state."""

from __future__ import annotations

from .gate import BUSY, CallGate, Ticket
from .machine import Breaker, ProbePermits
from .memory import LocalProbePermits, MemoryOverrides
from .override import Forced, Override, Overrides
from .rates import FailureRate, SlowCalls
from .transitions import CLOSED, HALF_OPEN, OPEN, STATES, Event

__all__ = [
    "BUSY",
    "CLOSED",
    "HALF_OPEN",
    "OPEN",
    "STATES",
    "Breaker",
    "CallGate",
    "Event",
    "FailureRate",
    "Forced",
    "LocalProbePermits",
    "MemoryOverrides",
    "Override",
    "Overrides",
    "ProbePermits",
    "SlowCalls",
    "Ticket",
]
