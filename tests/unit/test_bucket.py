"""GCRA token bucket: burst, steady rate, max_wait reservations, per-caller limiter."""

from __future__ import annotations

import pytest

from authn_gateway.layers.bucket import InboundLimiter, MemoryBucketStore, gcra, per_second


def test_burst_then_steady_rate() -> None:
    clock = [100.0]
    store = MemoryBucketStore(clock=lambda: clock[0])
    allowed = sum(store.take_now("k", 0.1, 5, 0.0) is not None for _ in range(20))
    assert allowed == 5  # the burst
    clock[0] += 0.1
    assert store.take_now("k", 0.1, 5, 0.0) == 0.0
    assert store.take_now("k", 0.1, 5, 0.0) is None
    clock[0] += 1.0
    assert sum(store.take_now("k", 0.1, 5, 0.0) is not None for _ in range(20)) == 5


def test_calls_never_exceed_rate_times_time_plus_burst() -> None:
    clock = [0.0]
    store = MemoryBucketStore(clock=lambda: clock[0])
    allowed = 0
    for _ in range(10_000):  # 10 s of offered load at 1000/s against R=20/s, B=10
        clock[0] += 0.001
        allowed += store.take_now("k", 1 / 20, 10, 0.0) is not None
    assert 10 + 20 * 10 - 1 <= allowed <= 10 + 20 * 10


def test_max_wait_reserves_a_slot_and_reports_the_wait() -> None:
    tat, wait = gcra(tat=10.5, now=10.0, interval=0.5, burst=1, max_wait=1.0)
    assert wait == 0.5
    assert tat == 11.0
    old, refused = gcra(tat=20.0, now=10.0, interval=0.5, burst=1, max_wait=1.0)
    assert refused is None
    assert old == 20.0


def test_keys_are_independent() -> None:
    store = MemoryBucketStore(clock=lambda: 0.0)
    assert store.take_now("a", 1.0, 1, 0.0) is not None
    assert store.take_now("a", 1.0, 1, 0.0) is None
    assert store.take_now("b", 1.0, 1, 0.0) is not None


def test_inbound_limiter_isolates_callers() -> None:
    limiter = InboundLimiter(rate_per_second=1, burst=3)
    assert [limiter.allow("noisy") for _ in range(5)] == [True, True, True, False, False]
    assert limiter.allow("quiet")


@pytest.mark.parametrize(
    ("rate", "expected"), [(5, 5.0), ("600/minute", 10.0), ("2/second", 2.0), ("7200/hour", 2.0)]
)
def test_rates_parse_from_limits_notation(rate: str | float, expected: float) -> None:
    assert per_second(rate) == expected
