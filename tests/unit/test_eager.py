"""Running a review eagerly (authn_gateway/eager.py): a coroutine that never waits
finishes at once, outside any task; one that waits carries on, in the task that resumes
it, exactly as if a Task had run it from the start: same result, same exception, same
cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from authn_gateway.eager import Suspended, in_a_task, run_eagerly


class Boom(Exception):
    pass


async def at_once() -> int:
    return 1


async def needs_a_task() -> bool:
    await in_a_task()
    async with asyncio.timeout(5):  # needs a current task
        await asyncio.sleep(0)
    return asyncio.current_task() is not None


async def outside_a_task(coro: Coroutine[Any, Any, Any]) -> Any:
    """``run_eagerly`` as the edge calls it: in a callback of the loop, in no task."""
    loop = asyncio.get_running_loop()
    ran: asyncio.Future[Any] = loop.create_future()

    def callback() -> None:
        assert asyncio.current_task() is None
        ran.set_result(run_eagerly(coro))

    loop.call_soon(callback)
    return await ran


async def test_a_coroutine_that_never_waits_is_done_without_a_task() -> None:
    run = await outside_a_task(at_once())
    assert run == 1  # its value itself: nothing else is allocated


async def test_in_a_task_stops_an_eager_run_and_the_rest_runs_in_the_resuming_task() -> None:
    run = await outside_a_task(needs_a_task())
    assert isinstance(run, Suspended)
    assert await asyncio.create_task(run.resume()) is True


async def test_in_a_task_costs_nothing_inside_a_task() -> None:
    run = run_eagerly(needs_a_task())  # the test's task is current: no stop at in_a_task
    assert isinstance(run, Suspended)  # it stopped at the sleep, not before
    assert await run.resume() is True


async def test_an_exception_before_the_first_wait_propagates_from_run_eagerly() -> None:
    async def fails() -> None:
        raise Boom

    with pytest.raises(Boom):
        run_eagerly(fails())


async def test_an_exception_from_an_awaited_future_reaches_the_coroutine() -> None:
    loop = asyncio.get_running_loop()
    failing: asyncio.Future[int] = loop.create_future()

    async def waits() -> str:
        try:
            await failing
        except Boom:
            return "caught"
        return "not raised"

    run = run_eagerly(waits())
    assert isinstance(run, Suspended)
    loop.call_soon(failing.set_exception, Boom())
    assert await run.resume() == "caught"


async def test_cancelling_the_resuming_task_cancels_the_coroutine_where_it_waits() -> None:
    loop = asyncio.get_running_loop()
    never: asyncio.Future[None] = loop.create_future()
    seen: list[str] = []

    async def waits_forever() -> None:
        try:
            await never
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    run = run_eagerly(waits_forever())
    assert isinstance(run, Suspended)
    task = asyncio.create_task(run.resume())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled"]
    assert never.cancelled()


async def test_closing_a_run_that_is_never_resumed_runs_its_finally() -> None:
    seen: list[str] = []

    async def holds() -> None:
        try:
            await in_a_task()
        finally:
            seen.append("finally")

    run = await outside_a_task(holds())
    assert isinstance(run, Suspended)
    run.close()
    assert seen == ["finally"]


# A coroutine made of steps: return at once, a bare yield (sleep(0)), a future that
# resolves, one that fails, a detach (in_a_task), a timeout that needs a task.
STEPS = st.lists(st.sampled_from(["sleep0", "future", "fail", "detach", "timeout"]), max_size=8)


async def script(steps: list[str]) -> list[str]:
    loop = asyncio.get_running_loop()
    log: list[str] = []
    for step in steps:
        if step == "sleep0":
            await asyncio.sleep(0)
        elif step == "future":
            fut: asyncio.Future[str] = loop.create_future()
            loop.call_soon(fut.set_result, "ok")
            log.append(await fut)
        elif step == "fail":
            bad: asyncio.Future[str] = loop.create_future()
            loop.call_soon(bad.set_exception, Boom())
            try:
                await bad
            except Boom:
                log.append("boom")
        elif step == "detach":
            await in_a_task()
        else:
            await in_a_task()
            async with asyncio.timeout(5):
                await asyncio.sleep(0)
            log.append("timed")
    return log


@settings(max_examples=60, deadline=None)
@given(STEPS)
def test_any_coroutine_run_eagerly_gives_what_a_task_gives(steps: list[str]) -> None:
    async def both() -> tuple[list[str], list[str]]:
        plain = await asyncio.create_task(script(steps))
        run = await outside_a_task(script(steps))
        eager = await run.resume() if isinstance(run, Suspended) else run
        return plain, eager

    plain, eager = asyncio.run(both())
    assert eager == plain, (steps, plain, eager)
