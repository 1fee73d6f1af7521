"""The breaker's in-process state: pybreaker's memory storage and K local probe permits."""

from __future__ import annotations

import pybreaker


def memory_storage() -> pybreaker.CircuitBreakerStorage:
    return pybreaker.CircuitMemoryStorage(pybreaker.STATE_CLOSED)


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
