"""Stopping a background loop for sure, even when a client loses the cancellation."""

from __future__ import annotations

import asyncio

from authn_gateway.tasks import cancel_and_wait
from tests.support.tasks_helpers import retrying_loop


async def test_a_loop_that_lost_a_cancellation_is_stopped_by_the_next() -> None:
    turns: list[int] = []
    task = asyncio.create_task(retrying_loop(2, turns))
    await asyncio.sleep(0.01)
    # Awaited once after one cancel(), this task would run forever.
    assert await cancel_and_wait(task, 5.0)
    assert task.cancelled() and len(turns) == 3


async def test_a_task_that_never_ends_is_given_up_after_the_patience() -> None:
    running = [True]
    task = asyncio.create_task(retrying_loop(10**9, [], running))
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await cancel_and_wait(task, 0.3)
    assert 0.25 <= loop.time() - started < 2.0
    assert not task.done()
    running[0] = False  # the test's own clean-up: its next lost cancellation ends it
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert task.done()


async def test_a_task_that_failed_or_finished_counts_as_stopped() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    failed = asyncio.create_task(fails())
    await asyncio.sleep(0)
    assert await cancel_and_wait(failed, 1.0)
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    assert await cancel_and_wait(done, 1.0)
