"""Single flight: concurrent callers with one key share one call.

The project's only implementation: the review cache coalesces backend calls with it,
Keystone its service logins and group lookups. The shared call runs as its own task.
A waiter that goes away (its client disconnected, its own deadline passed) stops
waiting, but the call carries on for the others; the call's deadline is the caller's
business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self, on_join: Callable[[], None] | None = None) -> None:
        self._flights: dict[Hashable, asyncio.Task[T]] = {}
        self._on_join = on_join

    def __len__(self) -> int:
        return len(self._flights)

    def busy(self, key: Hashable) -> bool:
        return key in self._flights

    def start(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        """The task running ``key``'s call, started now if there is none."""
        task = self._flights.get(key)
        if task is None:
            task = asyncio.ensure_future(call())
            self._flights[key] = task
            task.add_done_callback(lambda _t: self._flights.pop(key, None))
        return task

    async def do(self, key: Hashable, call: Callable[[], Awaitable[T]]) -> T:
        task = self._flights.get(key)
        if task is None:
            task = self.start(key, call)
        elif self._on_join is not None:
            self._on_join()
        # shield: cancelling this waiter must not cancel the call the others wait on.
        return await asyncio.shield(task)

    async def cancel_all(self) -> None:
        """Cancel every call and let it unwind (before what it uses is closed)."""
        tasks = list(self._flights.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
