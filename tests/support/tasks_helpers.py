"""Helpers shared by the tiers of test_tasks."""

from __future__ import annotations

import asyncio


async def retrying_loop(swallow: int, turns: list[int], running: list[bool] | None = None) -> None:
    """A loop that retries on TimeoutError, over a call that turns its first
    ``swallow`` cancellations into TimeoutError (as redis-py can); it also ends when
    ``running`` is set false (the tests' own clean-up)."""
    lost = 0
    while running is None or running[0]:
        turns.append(1)
        try:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost >= swallow:
                    raise
                lost += 1
                raise TimeoutError from None
        except TimeoutError:
            continue
