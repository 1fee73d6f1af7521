"""Single flight: concurrent reviews of one cache key share one backend call.

The shared call runs as its own task. A waiter that goes away (its client
disconnected, its own deadline passed) stops waiting, but the call carries on for
the others; the call's deadline is the caller's business (see the pipeline).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self, on_join: Callable[[], None] | None = None) -> None:
        self._flights: dict[bytes, asyncio.Task[T]] = {}
        self._on_join = on_join

    def __len__(self) -> int:
        return len(self._flights)

    async def do(self, key: bytes, call: Callable[[], Awaitable[T]]) -> T:
        task = self._flights.get(key)
        if task is None:
            task = asyncio.ensure_future(call())
            self._flights[key] = task
            task.add_done_callback(lambda _t: self._flights.pop(key, None))
        elif self._on_join is not None:
            self._on_join()
        # shield: cancelling this waiter must not cancel the call the others wait on.
        return await asyncio.shield(task)
