"""Single flight: one call per key, waiters may leave without cancelling it."""

from __future__ import annotations

import asyncio

import pytest

from authn_gateway.layers.coalesce import SingleFlight


async def test_concurrent_callers_share_one_call() -> None:
    calls = 0
    joined = 0

    def on_join() -> None:
        nonlocal joined
        joined += 1

    flights: SingleFlight[str] = SingleFlight(on_join)

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "answer"

    results = await asyncio.gather(*(flights.do(b"k", slow) for _ in range(500)))
    assert results == ["answer"] * 500
    assert calls == 1
    assert joined == 499
    assert len(flights) == 0


async def test_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    flights: SingleFlight[str] = SingleFlight()
    finished = asyncio.Event()

    async def slow() -> str:
        await asyncio.sleep(0.05)
        finished.set()
        return "done"

    first = asyncio.ensure_future(flights.do(b"k", slow))
    second = asyncio.ensure_future(flights.do(b"k", slow))
    await asyncio.sleep(0.01)
    first.cancel()
    assert await second == "done"
    assert finished.is_set()


async def test_different_keys_do_not_share() -> None:
    flights: SingleFlight[int] = SingleFlight()
    calls = 0

    async def call() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return calls

    await asyncio.gather(flights.do(b"a", call), flights.do(b"b", call))
    assert calls == 2


async def test_a_failed_call_is_not_remembered() -> None:
    flights: SingleFlight[str] = SingleFlight()

    async def boom() -> str:
        raise RuntimeError("x")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            await flights.do(b"k", boom)
    assert len(flights) == 0
