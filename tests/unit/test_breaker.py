"""The asyncio-correct breaker around pybreaker: counting, K probes, Retry-After, overrides."""

from __future__ import annotations

import asyncio
import contextlib

from authn_gateway.layers.breaker import (
    Breaker,
    FailureRate,
    LocalProbePermits,
    MemoryOverrides,
    Override,
    SlowCalls,
)
from authn_gateway.layers.breaker.layer import BreakerLayer, OpenBreakerLayer
from authn_gateway.layers.concurrency.layer import ConcurrencyLayer
from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter
from authn_gateway.layers.concurrency.vegas import VegasLimit, VegasSettings
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticated, Rejected, Unavailable, UserInfo, Verdict
from backends.context import ReviewContext

DOWN = Unavailable("down")

OK = Authenticated(UserInfo("u"))


def breaker(fail_max: int = 3, reset: float = 0.2, probes: int = 1) -> tuple[Breaker, list[str]]:
    transitions: list[str] = []
    b = Breaker(
        "idp",
        fail_max,
        reset,
        LocalProbePermits(probes),
        on_transition=lambda name, old, new: transitions.append(f"{old}->{new}"),
    )
    return b, transitions


async def fail(b: Breaker, times: int) -> None:
    for _ in range(times):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, DOWN)


async def test_opens_after_fail_max_consecutive_unavailable() -> None:
    b, transitions = breaker(fail_max=3)
    await fail(b, 2)
    assert b.state == "closed"
    await fail(b, 1)
    assert b.state == "open"
    assert await b.admit() is None
    assert transitions == ["closed->open"]


async def test_rejections_are_healthy_answers() -> None:
    b, _ = breaker(fail_max=2)
    for _ in range(10):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, Rejected("bad token"))
    assert b.state == "closed"


async def test_a_success_resets_the_consecutive_count() -> None:
    b, _ = breaker(fail_max=3)
    await fail(b, 2)
    ticket = await b.admit()
    assert ticket is not None
    b.record(ticket, OK)
    await fail(b, 2)
    assert b.state == "closed"


async def test_half_open_admits_exactly_k_probes_concurrently() -> None:
    b, _ = breaker(fail_max=1, reset=0.05, probes=2)
    await fail(b, 1)
    await asyncio.sleep(0.06)
    tickets = [await b.admit() for _ in range(10)]
    probes = [t for t in tickets if t is not None]
    assert len(probes) == 2
    assert b.state == "half-open"


async def test_successful_probe_closes_failed_probe_reopens() -> None:
    b, transitions = breaker(fail_max=1, reset=0.05)
    await fail(b, 1)
    await asyncio.sleep(0.06)
    probe = await b.admit()
    assert probe is not None
    b.record(probe, DOWN)
    assert b.state == "open"
    assert await b.admit() is None
    await asyncio.sleep(0.06)
    probe = await b.admit()
    assert probe is not None
    b.record(probe, OK)
    assert b.state == "closed"
    assert transitions == [
        "closed->open",
        "open->half-open",
        "half-open->open",
        "open->half-open",
        "half-open->closed",
    ]


async def test_unused_ticket_returns_its_probe_permit() -> None:
    b, _ = breaker(fail_max=1, reset=0.05)
    await fail(b, 1)
    await asyncio.sleep(0.06)
    probe = await b.admit()
    assert probe is not None
    assert await b.admit() is None
    b.release(probe)
    assert await b.admit() is not None


async def test_hold_open_stays_open_for_the_time_asked() -> None:
    b, _ = breaker(reset=0.05)
    b.hold_open(0.3)
    assert b.state == "open"
    await asyncio.sleep(0.1)
    assert await b.admit() is None  # reset_timeout alone would have let a probe through
    await asyncio.sleep(0.25)
    assert await b.admit() is not None


async def test_operator_overrides() -> None:
    b, transitions = breaker()
    b.force(Override.FORCED_OPEN)
    assert b.state == "forced_open"
    assert await b.admit() is None
    b.force(Override.FORCED_CLOSED)
    await fail(b, 10)  # disabled: failures do not open it
    assert await b.admit() is not None
    b.force(Override.NONE)
    assert b.state == "closed"
    assert transitions[-1] == "forced_closed->closed"


async def test_release_returns_to_the_machines_own_state_and_overrides_expire() -> None:
    now = [1000.0]
    board = MemoryOverrides(clock=lambda: now[0])
    b = Breaker("idp", 2, 60, LocalProbePermits(1), overrides=board)
    await fail(b, 2)
    assert b.state == "open"
    b.force(Override.FORCED_CLOSED, seconds=30)
    assert b.state == "forced_closed" and b.machine_state == "open"
    first = b.forced()
    assert first is not None and first.expires_at == 1030.0
    now[0] += 10
    b.force(Override.FORCED_CLOSED, seconds=30)  # renewed: the same start, a later end
    renewed = b.forced()
    assert renewed is not None and (renewed.since, renewed.expires_at) == (1000.0, 1040.0)
    b.force(Override.NONE)
    assert b.state == "open"  # not closed: the failures that opened it still count
    assert await b.admit() is None
    b.force(Override.FORCED_OPEN, seconds=5)
    now[0] += 5
    assert b.forced() is None and b.state == "open"  # expired on its own


def test_failure_rate_needs_min_calls_and_forgets_old_calls() -> None:
    clock = [0.0]
    rate = FailureRate(threshold=0.5, window=10.0, min_calls=4, clock=lambda: clock[0])
    assert [rate.add(True) for _ in range(3)] == [False, False, False]  # too few calls
    assert rate.add(False)  # 3 of 4 failed
    clock[0] = 20.0  # all of those are out of the window now
    assert not rate.add(True)
    assert [rate.add(False) for _ in range(3)] == [False, False, False]  # 1 of 4


async def test_flapping_idp_opens_the_breaker_by_failure_rate() -> None:
    transitions: list[str] = []
    b = Breaker(
        "idp",
        5,
        30.0,
        LocalProbePermits(1),
        on_transition=lambda name, old, new: transitions.append(f"{old}->{new}"),
        failure_rate=FailureRate(threshold=0.5, window=60.0, min_calls=10),
    )
    # Every other call fails: never 5 in a row, but half of them.
    for i in range(10):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, DOWN if i % 2 else OK)
    assert b.state == "open"
    assert transitions == ["closed->open"]


async def test_failure_rate_below_threshold_keeps_it_closed() -> None:
    b = Breaker(
        "idp",
        5,
        30.0,
        LocalProbePermits(1),
        failure_rate=FailureRate(threshold=0.5, window=60.0, min_calls=10),
    )
    for i in range(40):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, DOWN if i % 4 == 0 else OK)  # 25 % failures
    assert b.state == "closed"


def slow_breaker(transitions: list[str], fail_max: int = 5, reset: float = 30.0) -> Breaker:
    return Breaker(
        "idp",
        fail_max,
        reset,
        LocalProbePermits(1),
        on_transition=lambda name, old, new: transitions.append(f"{old}->{new}"),
        slow_calls=SlowCalls(0.5, FailureRate(threshold=0.8, window=60.0, min_calls=10)),
    )


async def test_answers_that_come_late_open_the_breaker_by_slow_call_rate() -> None:
    transitions: list[str] = []
    b = slow_breaker(transitions)
    # Every answer is a success, but 9 in 10 took 0.6 s against a 0.5 s threshold.
    for i in range(10):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, OK, 0.1 if i == 0 else 0.6)
    assert b.state == "open"
    assert transitions == ["closed->open"]


async def test_slow_calls_below_the_rate_keep_it_closed() -> None:
    transitions: list[str] = []
    b = slow_breaker(transitions)
    for i in range(40):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, OK, 0.6 if i % 2 else 0.1)  # 50 % slow, under 80 %
    assert b.state == "closed"


async def test_a_call_at_the_threshold_counts_as_slow_and_a_timeout_counts_twice() -> None:
    transitions: list[str] = []
    b = slow_breaker(transitions, fail_max=100)
    for _ in range(10):
        ticket = await b.admit()
        assert ticket is not None
        # A timed-out call is both a failure and slow; fail_max alone would not trip.
        b.record(ticket, DOWN, 0.5)
    assert b.state == "open"


async def test_a_probe_is_judged_by_its_answer_even_when_late() -> None:
    # A restarted IdP's first answer is often slow; one slow probe must not keep it open.
    transitions: list[str] = []
    b = slow_breaker(transitions, fail_max=1, reset=0.05)
    await fail(b, 1)
    await asyncio.sleep(0.06)
    probe = await b.admit()
    assert probe is not None
    b.record(probe, OK, 0.7)
    assert b.state == "closed"
    assert transitions[-2:] == ["open->half-open", "half-open->closed"]


async def test_calls_recorded_without_a_duration_never_count_as_slow() -> None:
    transitions: list[str] = []
    b = slow_breaker(transitions)
    for _ in range(20):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, OK)
    assert b.state == "closed" and b.slow_threshold == 0.5


async def test_a_closed_breaker_starts_with_fresh_rate_windows() -> None:
    transitions: list[str] = []
    b = slow_breaker(transitions, reset=0.05)
    for _ in range(10):
        ticket = await b.admit()
        assert ticket is not None
        b.record(ticket, OK, 0.6)
    assert b.state == "open"
    await asyncio.sleep(0.06)
    probe = await b.admit()
    assert probe is not None
    b.record(probe, OK, 0.05)
    # The slow calls that opened it are forgotten: one more slow call is 1 of 1 in a
    # window that needs 10, not 11 of 12.
    ticket = await b.admit()
    assert ticket is not None
    b.record(ticket, OK, 0.6)
    assert b.state == "closed"
    assert transitions == ["closed->open", "open->half-open", "half-open->closed"]


class Hanging:
    """An IdP call that never ends (cancelled at the test's end)."""

    name = "idp"

    def could_accept(self, token: str) -> bool:
        return True

    def credential(self, token: str) -> str:
        return token

    async def review(self, review: ReviewContext) -> Verdict:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_open_breaker_refuses_before_a_review_waits_for_a_local_slot() -> None:
    """The concurrency limit sits above the breaker's admission; while the breaker is
    known open a review still fails at once, never queued behind calls in flight."""
    b, _ = breaker(reset=60)
    limiter = ConcurrencyLimiter(VegasLimit(VegasSettings(initial=1, min_limit=1, max_limit=1)))
    limiter.algorithm._recent_rtt = 5.0  # measured and healthy: a new call would wait
    metrics = Metrics()
    below = ConcurrencyLayer(BreakerLayer(Hanging(), b, metrics), limiter, metrics)
    top = OpenBreakerLayer(below, b)
    deadline = asyncio.get_running_loop().time() + 60
    hung = asyncio.ensure_future(top.review(ReviewContext("t1", (), deadline)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert limiter.in_flight == 1
    b.hold_open(30)  # opened (Retry-After, another replica) with the slot still held
    waiting = asyncio.ensure_future(top.review(ReviewContext("t2", (), deadline)))
    for _ in range(5):
        await asyncio.sleep(0)
    assert limiter.waiting() == 0
    assert waiting.done()
    assert waiting.result().outcome == Unavailable("circuit breaker open")
    hung.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await hung
