"""The breaker's in-process state beside its state machine: K local probe permits and
the operator overrides."""

from __future__ import annotations

import time
from collections.abc import Callable

from authn_gateway.layers.breaker.override import Forced, Override, renewed


class LocalProbePermits:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._in_flight = 0

    async def try_acquire(self) -> str | None:
        return self.acquire_now()

    def acquire_now(self) -> str | None:
        if self._in_flight >= self._limit:
            return None
        self._in_flight += 1
        return "local"

    def release(self, permit: str) -> None:
        self._in_flight = max(0, self._in_flight - 1)

    def spent(self, permit: str) -> None:
        # In one process the outcome moved the breaker before this runs: free the slot.
        self.release(permit)


class MemoryOverrides:
    """Operator overrides in this process, kept by backend name across reloads."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._forced: dict[str, Forced] = {}

    def current(self, backend: str) -> Forced | None:
        forced = self._forced.get(backend)
        return forced if forced is not None and forced.active(self._clock()) else None

    def set_now(self, backend: str, override: Override, seconds: float, by: str = "") -> None:
        if override is Override.NONE:
            self._forced.pop(backend, None)
            return
        now = self._clock()
        self._forced[backend] = renewed(self.current(backend), override, now, seconds, by)

    async def put(self, backend: str, override: Override, seconds: float, by: str) -> bool:
        self.set_now(backend, override, seconds, by)
        return False

    async def read(self, backend: str) -> Forced | None:
        return self.current(backend)

    def carry_from(self, other: object) -> None:
        """A reload that could not keep the stores (a new secret) keeps the overrides."""
        if isinstance(other, MemoryOverrides):
            self._forced.update(other._forced)
