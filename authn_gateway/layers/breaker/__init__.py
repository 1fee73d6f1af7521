"""Circuit breaker per backend: the state machine, its layer, memory and Redis state."""

from __future__ import annotations

from authn_gateway.layers.breaker.gate import BUSY, CallGate, Ticket
from authn_gateway.layers.breaker.machine import Breaker, ProbePermits
from authn_gateway.layers.breaker.memory import LocalProbePermits, MemoryOverrides
from authn_gateway.layers.breaker.override import Forced, Override, Overrides
from authn_gateway.layers.breaker.rates import FailureRate, SlowCalls
from authn_gateway.layers.breaker.transitions import CLOSED, HALF_OPEN, OPEN, STATES, Event

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
