"""Coalescing within this process: a single flight per cache key."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from backends.base import Verdict
from backends.flight import SingleFlight

#: The one call per key, and the read of what another process answered meanwhile.
Call = Callable[[], Awaitable[Verdict]]
Recheck = Callable[[], Awaitable[Verdict | None]]


class LocalCoalescer:
    def __init__(self, on_join: Callable[[], None] | None = None) -> None:
        self.flights: SingleFlight[Verdict] = SingleFlight(on_join)

    def __len__(self) -> int:
        return len(self.flights)

    async def do(self, key: bytes, call: Call, recheck: Recheck) -> Verdict:
        return await self.flights.do(key, call)
