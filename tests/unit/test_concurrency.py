"""Slots under the adaptive limit: how many, who first, and who never waits (injected clock)."""

from __future__ import annotations

import asyncio

from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Priority, Refusal, Slot
from authn_gateway.layers.concurrency.vegas import VegasLimit, VegasSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def limiter(limit: int, clock: Clock, recent_rtt: float | None = 0.05) -> ConcurrencyLimiter:
    settings = VegasSettings(
        initial=limit, min_limit=limit, max_limit=limit, probe_interval=1e9, min_samples=1
    )
    algorithm = VegasLimit(settings, clock)
    if recent_rtt is not None:
        algorithm._recent_rtt = recent_rtt  # as if windows had been measured
    return ConcurrencyLimiter(algorithm, clock)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_no_more_than_the_limit_are_in_flight() -> None:
    clock = Clock()
    lim = limiter(3, clock)
    slots = [lim.try_acquire() for _ in range(4)]
    assert [s is not None for s in slots] == [True, True, True, False]
    assert lim.in_flight == 3


async def test_a_released_slot_goes_to_the_next_waiter_in_order() -> None:
    clock = Clock()
    lim = limiter(1, clock)
    first = lim.try_acquire()
    assert first is not None
    task = asyncio.create_task(lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 1))
    await settle()
    assert lim.waiting() == 1 and not task.done()
    clock.now += 0.01
    lim.release(first, rtt=0.05)
    slot = await task
    assert isinstance(slot, Slot) and abs(slot.waited - 0.01) < 1e-9
    assert lim.in_flight == 1


async def test_calls_without_a_fallback_go_before_refreshes_that_queued_earlier() -> None:
    clock = Clock()
    lim = limiter(1, clock)
    held = lim.try_acquire()
    assert held is not None
    order: list[str] = []

    async def want(name: str, priority: Priority) -> None:
        slot = await lim.acquire(priority, deadline=clock.now + 1)
        assert isinstance(slot, Slot)
        order.append(name)
        lim.release(slot, rtt=0.05)

    refresh = asyncio.create_task(want("refresh", Priority.HAS_FALLBACK))
    await settle()
    cold = asyncio.create_task(want("cold", Priority.NO_FALLBACK))
    await settle()
    lim.release(held, rtt=0.05)
    await asyncio.gather(refresh, cold)
    assert order == ["cold", "refresh"]


async def test_a_refresh_gets_no_free_slot_while_a_cold_call_waits() -> None:
    clock = Clock()
    lim = limiter(1, clock)
    held = lim.try_acquire()
    assert held is not None
    cold = asyncio.create_task(lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 1))
    await settle()
    assert lim.try_acquire(Priority.HAS_FALLBACK) is None
    lim.release(held, rtt=0.05)
    assert isinstance(await cold, Slot)


async def test_a_full_round_already_waiting_refuses_at_once() -> None:
    clock = Clock()
    lim = limiter(2, clock)
    held = [lim.try_acquire(), lim.try_acquire()]
    waiters = [
        asyncio.create_task(lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 1))
        for _ in range(2)
    ]
    await settle()
    # Two wait ahead and two fit in a round: a third would wait past one latency.
    assert await lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 1) is Refusal.QUEUE_FULL
    assert lim.refused[Refusal.QUEUE_FULL] == 1
    for slot in held:
        assert slot is not None
        lim.release(slot, rtt=0.05)
    for w in waiters:
        assert isinstance(await w, Slot)


async def test_a_call_that_cannot_finish_before_its_deadline_is_refused_at_once() -> None:
    clock = Clock()
    lim = limiter(1, clock, recent_rtt=0.2)
    assert lim.try_acquire() is not None
    result = await lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 0.1)
    assert result is Refusal.DEADLINE
    assert lim.waiting() == 0


async def test_a_waiter_whose_review_gave_up_is_never_sent() -> None:
    clock = Clock()
    lim = limiter(2, clock, recent_rtt=0.05)
    held, other = lim.try_acquire(), lim.try_acquire()
    assert held is not None and other is not None
    late = asyncio.create_task(lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 0.08))
    await settle()
    patient = asyncio.create_task(lim.acquire(Priority.HAS_FALLBACK, deadline=clock.now + 5))
    await settle()
    clock.now += 0.09  # past the first waiter's deadline
    lim.release(held, rtt=0.05)
    assert await late is Refusal.WAITED
    # The slot went to the next one in line instead.
    assert isinstance(await patient, Slot)
    assert lim.in_flight == 2


async def test_a_waiter_gives_up_when_its_call_could_no_longer_finish_in_time() -> None:
    clock = Clock()
    lim = limiter(1, clock, recent_rtt=0.05)
    assert lim.try_acquire() is not None
    task = asyncio.create_task(lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 1))
    await settle()
    clock.now += 0.9  # 0.1 s left: still time for a 50 ms call
    lim.expire()
    await settle()
    assert not task.done()
    clock.now += 0.06  # 0.04 s left: too late
    lim.expire()
    assert await task is Refusal.WAITED
    assert lim.waiting() == 0 and lim.in_flight == 1


async def test_finished_calls_feed_the_limit_and_unsent_ones_do_not() -> None:
    clock = Clock()
    settings = VegasSettings(initial=4, min_samples=1, min_window=0.0, probe_interval=1e9)
    algorithm = VegasLimit(settings, clock)
    lim = ConcurrencyLimiter(algorithm, clock)
    slot = lim.try_acquire()
    assert slot is not None
    clock.now += 1
    lim.release(slot, rtt=None)  # never sent: nothing learnt
    assert algorithm.recent_rtt is None
    slot = lim.try_acquire()
    assert slot is not None
    clock.now += 1
    lim.release(slot, rtt=0.07)
    lim.release(slot, rtt=0.07)  # a second release is a no-op
    assert algorithm.recent_rtt == 0.07
    assert lim.in_flight == 0


async def test_event_loop_timers_end_waits_without_an_injected_clock() -> None:
    algorithm = VegasLimit(VegasSettings(initial=1, max_limit=1))
    algorithm._recent_rtt = 0.02
    lim = ConcurrencyLimiter(algorithm)
    assert lim.try_acquire() is not None
    now = asyncio.get_running_loop().time()
    result = await lim.acquire(Priority.NO_FALLBACK, deadline=now + 0.1)
    assert result is Refusal.WAITED
    assert lim.waiting() == 0


async def test_nobody_waits_for_an_idp_not_measured_yet_or_failing() -> None:
    clock = Clock()
    lim = limiter(1, clock, recent_rtt=None)
    held = lim.try_acquire()
    assert held is not None
    assert await lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 5) is Refusal.FAILING
    clock.now += 0.2
    lim.release(held, rtt=1.0, dropped=True)  # it timed out
    held = lim.try_acquire()
    assert held is not None
    assert await lim.acquire(Priority.NO_FALLBACK, deadline=clock.now + 5) is Refusal.FAILING
    assert lim.waiting() == 0
