"""Background tasks: fire-and-forget ones, with references held so they are not
collected, and stopping a long-running one for sure."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

#: How long a closing component waits for one of its loops to stop.
STOP_PATIENCE = 3.0


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def cancel_and_wait(task: asyncio.Task[Any], patience: float) -> bool:
    """Cancel ``task`` and wait up to ``patience`` seconds for it to end; True if it did.

    A cancellation can be lost inside a client: one that lands as the client's own
    timeout fires comes back as a TimeoutError, which a retrying loop catches (seen
    with redis-py: a replica's shutdown that never ended). So the task is cancelled
    again every tenth of a second until it ends, instead of awaited once forever."""
    loop = asyncio.get_running_loop()
    end = loop.time() + patience
    while not task.done():
        left = end - loop.time()
        if left <= 0:
            return False
        task.cancel()
        await asyncio.wait({task}, timeout=min(0.1, left))
    if not task.cancelled():
        task.exception()  # retrieved: the caller stops it, a failure is not news here
    return True
