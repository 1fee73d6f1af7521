"""The adaptive limit's rule, on an injected clock against a modelled FIFO IdP.

The model: an IdP with C workers and service time S, fed by a client that always has
more calls than the limit lets out. With L calls in flight it answers min(L, C)/S
calls per second, each after S * max(1, L/C) (FIFO: the L - C extra calls queue).
"""

from __future__ import annotations

import heapq
from collections import deque

from authn_gateway.layers.concurrency.vegas import VegasLimit, VegasSettings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(limit: VegasLimit, clock: Clock, capacity: int, service: float, seconds: float) -> None:
    """Drive ``limit`` for ``seconds`` of model time against the modelled IdP."""
    end = clock.now + seconds
    while clock.now < end:
        in_flight = limit.limit
        clock.now += service / min(in_flight, capacity)
        limit.sample(service * max(1.0, in_flight / capacity), in_flight)


def settled(limit: VegasLimit, clock: Clock, capacity: int, service: float) -> list[int]:
    """The limits seen over 20 more seconds (probe windows left out)."""
    seen = []
    for _ in range(200):
        run(limit, clock, capacity, service, 0.1)
        if not limit.probing:
            seen.append(limit.limit)
    return seen


def assert_near_capacity(seen: list[int], capacity: int, s: VegasSettings) -> None:
    # Keeps the IdP busy (more in flight than its workers) with a short queue.
    assert min(seen) >= capacity + 1, seen
    assert max(seen) <= capacity + s.beta + 2, seen


def test_the_limit_settles_a_few_calls_above_the_idps_capacity() -> None:
    clock = Clock()
    s = VegasSettings()
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.05, seconds=60)
    assert_near_capacity(settled(limit, clock, 4, 0.05), 4, s)
    # The probe windows run at a quarter of the limit: near, if not at, the no-load 50 ms.
    assert limit.base_rtt is not None and 0.0499 <= limit.base_rtt <= 0.065


def test_the_limit_follows_the_capacity_halved_then_doubled() -> None:
    clock = Clock()
    s = VegasSettings()
    limit = VegasLimit(s, clock)
    for capacity in (4, 2, 8, 16):
        run(limit, clock, capacity, 0.05, seconds=60)
        assert_near_capacity(settled(limit, clock, capacity, 0.05), capacity, s)


def test_a_ten_times_slower_idp_needs_no_other_settings() -> None:
    clock = Clock()
    s = VegasSettings()
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.5, seconds=300)
    assert_near_capacity(settled(limit, clock, 4, 0.5), 4, s)


def test_a_limit_started_far_above_capacity_finds_the_no_load_latency() -> None:
    # Started at 100 with an IdP of 4 workers, no call ever sees 50 ms until the
    # probe windows halve the limit.
    clock = Clock()
    s = VegasSettings(initial=100)
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.05, seconds=120)
    assert_near_capacity(settled(limit, clock, 4, 0.05), 4, s)


def test_the_baseline_follows_an_idp_whose_service_time_grew() -> None:
    clock = Clock()
    s = VegasSettings()
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.05, seconds=60)
    # The database got slower: every answer now takes 200 ms at best.
    run(limit, clock, capacity=4, service=0.2, seconds=s.base_horizon + 60)
    assert limit.base_rtt is not None and 0.199 <= limit.base_rtt <= 0.26
    assert_near_capacity(settled(limit, clock, 4, 0.2), 4, s)


def test_a_failed_or_timed_out_call_cuts_the_limit_by_the_backoff() -> None:
    clock = Clock()
    s = VegasSettings(initial=20, min_samples=1, min_window=0.0, probe_interval=1e9)
    limit = VegasLimit(s, clock)
    clock.now = 1.0
    limit.sample(0.05, in_flight=20)  # the first window; the start-up probe follows
    clock.now = 2.0
    limit.sample(0.05, in_flight=10)  # the probe window
    assert not limit.probing
    before = limit.estimate
    clock.now = 3.0
    limit.sample(1.0, in_flight=20, dropped=True)
    assert limit.estimate == before * s.backoff


def test_a_client_using_few_slots_does_not_grow_the_limit() -> None:
    clock = Clock()
    limit = VegasLimit(VegasSettings(initial=20, probe_interval=1e9), clock)
    for _ in range(1000):
        clock.now += 0.01
        limit.sample(0.05, in_flight=3)
    assert limit.limit == 20


def test_one_slow_call_in_a_window_moves_the_limit_by_at_most_one() -> None:
    clock = Clock()
    s = VegasSettings(initial=10, probe_interval=1e9)
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=10, service=0.05, seconds=5)
    before = limit.estimate
    for i in range(s.min_samples):
        clock.now += 0.02
        limit.sample(2.0 if i == 0 else 0.05, in_flight=limit.limit)
    assert abs(limit.estimate - before) <= 1


def test_the_limit_never_leaves_its_bounds() -> None:
    clock = Clock()
    s = VegasSettings(initial=5, min_limit=2, max_limit=12)
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=100, service=0.05, seconds=60)
    assert limit.limit == 12
    for _ in range(100):
        clock.now += 0.2
        limit.sample(1.0, in_flight=12, dropped=True)
    assert limit.limit == 2


def test_a_brownout_after_a_fast_period_is_rebaselined_within_a_probe_interval() -> None:
    # Found in the brownout scenario: 1 ms answers before, 50 ms during. The old
    # baseline would read every call as queued and hold the limit under capacity.
    clock = Clock()
    s = VegasSettings()
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.001, seconds=20)
    run(limit, clock, capacity=4, service=0.05, seconds=s.probe_interval + 5)
    assert limit.base_rtt is not None and limit.base_rtt >= 0.0499
    assert_near_capacity(settled(limit, clock, 4, 0.05), 4, s)


def test_a_few_ms_of_the_callers_own_delay_on_a_fast_idp_does_not_shrink_the_limit() -> None:
    # After a brownout ends the IdP answers in 1 ms; the caller's own work adds half a
    # ms per call in flight, which at 20 in flight reads as "14 calls queued" against
    # the probe's baseline (taken at a quarter of the limit) to the bare Vegas rule.
    def drive(limit: VegasLimit, clock: Clock) -> None:
        for _ in range(4000):
            clock.now += 0.005
            limit.sample(0.001 + 0.0005 * limit.limit, in_flight=limit.limit)

    clock = Clock()
    floored = VegasLimit(VegasSettings(initial=20, negligible_delay=0.05), clock)
    drive(floored, clock)
    assert floored.limit >= 20
    bare = VegasLimit(VegasSettings(initial=20), clock)
    drive(bare, clock)
    assert bare.limit < 20  # the control: without the floor it shrinks


def test_queueing_past_the_negligible_delay_still_holds_the_limit_near_capacity() -> None:
    clock = Clock()
    s = VegasSettings(negligible_delay=0.05)
    limit = VegasLimit(s, clock)
    run(limit, clock, capacity=4, service=0.05, seconds=60)
    seen = settled(limit, clock, 4, 0.05)
    # A queue worth 50 ms more is about 4 calls at 80/s: a few more than without it.
    assert min(seen) >= 5 and max(seen) <= 4 + s.beta + 6, seen


def test_slots_held_by_answers_the_caller_has_not_read_do_not_grow_the_limit() -> None:
    # A starved caller: every slot is full, but the IdP held a third of each call's
    # time (the rest its answer waited unread). The latency shows no queue.
    clock = Clock()
    limit = VegasLimit(VegasSettings(initial=12, probe_interval=1e9), clock)
    for _ in range(2000):
        clock.now += 0.01
        limit.sample(0.05, in_flight=limit.limit, at_idp=limit.limit / 3)
    assert limit.limit == 12
    # The control: the same calls all held by the IdP grow it.
    grown = VegasLimit(VegasSettings(initial=12, probe_interval=1e9), clock)
    for _ in range(2000):
        clock.now += 0.01
        grown.sample(0.05, in_flight=grown.limit)
    assert grown.limit > 12


def simulate(
    limit: VegasLimit,
    clock: Clock,
    capacity: int,
    service: float,
    seconds: float,
) -> list[float]:
    """An event-driven FIFO IdP fed by a client with endless demand: a call goes out
    whenever fewer than ``limit.limit`` are in flight, and its latency reaches the limit
    only when it comes back (unlike :func:`run`, where a new limit acts at once).
    Returns each call's wait in the IdP's queue."""
    end = clock.now + seconds
    busy: list[tuple[float, float, int]] = []  # (done at, sent at, in flight when sent)
    line: deque[tuple[float, int]] = deque()  # (sent at, in flight when sent)
    waits: list[float] = []
    in_flight = 0
    while clock.now < end:
        while in_flight < limit.limit:
            in_flight += 1
            if len(busy) < capacity:
                heapq.heappush(busy, (clock.now + service, clock.now, in_flight))
                waits.append(0.0)
            else:
                line.append((clock.now, in_flight))
        done, sent, seen = heapq.heappop(busy)
        clock.now = done
        in_flight -= 1
        limit.sample(done - sent, seen)
        if line:
            queued, seen_then = line.popleft()
            waits.append(clock.now - queued)
            heapq.heappush(busy, (clock.now + service, queued, seen_then))
    return waits


def test_a_limit_started_during_a_brownout_sheds_the_idps_queue_within_a_second() -> None:
    # Issue 15's brownout from the first call: 4 workers, 50 ms each (80 calls/s). The
    # start at 20 queues 16 calls for one round; the long line is then shed in one step
    # (by one a round trip, it held a 15-call queue for 3 s).
    clock = Clock()
    waits = simulate(VegasLimit(VegasSettings(), clock), clock, 4, 0.05, seconds=20)
    assert len(waits) >= 0.9 * 20 * 80  # the IdP was kept busy
    assert max(waits) >= 0.15  # the first round did queue
    after_first_second = waits[80:]
    assert max(after_first_second) <= 0.125, max(after_first_second)


def test_after_a_change_only_calls_sent_under_the_new_limit_move_it() -> None:
    # Calls sent under the old limit say nothing of the new one: counting them grew the
    # limit by beta every 0.1 s before any call it let out had come back.
    clock = Clock()
    s = VegasSettings(initial=4, probe_interval=1e9)
    limit = VegasLimit(s, clock)
    while not limit.probing:  # the first window (it only measures), 50 ms
        clock.now += 0.03
        limit.sample(0.05, in_flight=4)
    while limit.probing:  # the start-up probe
        clock.now += 0.03
        limit.sample(0.05, in_flight=1)
    clock.now += 0.05  # a round at the full limit, 50 ms: nothing queued, so it grows
    while limit.limit == s.initial:
        clock.now += 0.011
        limit.sample(0.05, in_flight=limit.limit, held=0.05)
    changed_at, grown = clock.now, limit.limit
    assert grown == s.initial + s.beta
    for _ in range(40):  # answers to calls sent before the change, over 1.2 s
        clock.now += 0.03
        limit.sample(0.05, in_flight=10, held=clock.now - changed_at + 0.01)
    assert limit.limit == grown
    for _ in range(10):  # a round of calls sent after it
        clock.now += 0.011
        limit.sample(0.05, in_flight=grown, held=0.05)
    assert limit.limit == grown + s.beta
    # A failure counts whenever its call was sent: backing off waits for no round trip.
    clock.now += 1.0
    limit.sample(1.0, in_flight=grown, dropped=True, held=5.0)
    assert limit.estimate == (grown + s.beta) * s.backoff
