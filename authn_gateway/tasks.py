"""Fire-and-forget tasks, with references held so they are not collected."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
