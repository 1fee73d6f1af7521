"""Each IdP shared between clusters by weight (issue 37): the concurrency limit's fair
line (layers/concurrency/fair.py) and the bucket's shares (layers/bucket/fair.py)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from authn_gateway.layers.bucket.fair import NEVER, ShareState, fair_gcra
from authn_gateway.layers.bucket.gcra import TokenBucket
from authn_gateway.layers.bucket.memory import MemoryBucketStore
from authn_gateway.layers.bucket.shares import FairShares, SharedBucket
from authn_gateway.layers.concurrency.fair import FairLine, Priority
from authn_gateway.layers.concurrency.slots import ConcurrencyLimiter, Refusal, Slot
from authn_gateway.layers.concurrency.vegas import VegasLimit, VegasSettings
from backends.context import DEFAULT_CLUSTER

NF, HF = Priority.NO_FALLBACK, Priority.HAS_FALLBACK


# ---- the fair line -------------------------------------------------------------------


def served(line: FairLine[str], grants: int) -> list[str]:
    """The clusters of the next ``grants`` waiters, each granted (charged)."""
    order = []
    for _ in range(grants):
        popped = line.pop()
        assert popped is not None
        cluster, _ = popped
        line.charge(cluster)
        order.append(cluster)
    return order


def test_a_cluster_that_queued_later_is_served_before_another_clusters_backlog() -> None:
    line: FairLine[str] = FairLine({"a": 1, "b": 1})
    for i in range(5):
        line.add("a", NF, f"a{i}")
    line.charge("a")  # a's call in flight
    line.add("b", NF, "b0")
    assert served(line, 3) == ["b", "a", "a"]


def test_backlogged_clusters_are_served_in_proportion_to_their_weights() -> None:
    line: FairLine[str] = FairLine({"a": 2, "b": 1})
    for i in range(100):
        line.add("a", NF, f"a{i}")
        line.add("b", NF, f"b{i}")
    order = served(line, 30)
    assert order.count("a") == 20 and order.count("b") == 10


def test_an_idle_cluster_banks_two_turns_and_no_more() -> None:
    line: FairLine[str] = FairLine({"a": 1, "b": 1})
    for i in range(50):
        line.add("a", NF, f"a{i}")
    served(line, 40)  # b asked for nothing meanwhile
    for i in range(10):
        line.add("b", NF, f"b{i}")
    order = served(line, 10)
    # Two turns ahead of a's backlog, then turns alternate: b's idle time bought it
    # no run of ten.
    assert order[:2] == ["b", "b"], order
    assert order.count("b") in (6, 7), order


def test_within_a_cluster_never_seen_tokens_go_before_refreshes() -> None:
    line: FairLine[str] = FairLine()
    line.add("a", HF, "refresh")
    line.add("a", NF, "cold")
    assert line.pop() == ("a", "cold")
    assert line.pop() == ("a", "refresh")


def test_another_clusters_refresh_goes_before_a_storm_of_never_seen_tokens() -> None:
    line: FairLine[str] = FairLine({"a": 1, "b": 1})
    for i in range(20):
        line.add("a", NF, f"a{i}")
    served(line, 2)
    line.add("b", HF, "b-refresh")
    assert served(line, 1) == ["b"]


def test_ahead_counts_only_the_turns_that_come_first_in_fair_order() -> None:
    line: FairLine[str] = FairLine({"a": 1, "b": 1})
    for i in range(50):
        line.add("a", NF, f"a{i}")
    # a's 50 are all ahead of a new a; a new b waits one turn of a's at most.
    assert line.ahead("a", NF) == 50
    assert line.ahead("b", NF) <= 1
    line.add("b", NF, "b0")
    assert line.ahead("b", NF) <= 3


@settings(max_examples=60, deadline=None)
@given(
    weights=st.tuples(st.integers(1, 5), st.integers(1, 5)),
    grants=st.integers(1, 200),
)
def test_while_both_wait_neither_is_ahead_of_its_share_by_more_than_a_turn(
    weights: tuple[int, int], grants: int
) -> None:
    wa, wb = weights
    line: FairLine[str] = FairLine({"a": wa, "b": wb})
    for i in range(500):
        line.add("a", NF, f"a{i}")
        line.add("b", NF, f"b{i}")
    order = served(line, grants)
    # Stride scheduling: service normalised by weight differs by at most one turn.
    lag = order.count("a") / wa - order.count("b") / wb
    assert abs(lag) <= 1 / wa + 1 / wb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fixed_limiter(limit: int, clock: Clock, weights: dict[str, float]) -> ConcurrencyLimiter:
    s = VegasSettings(
        initial=limit, min_limit=limit, max_limit=limit, probe_interval=1e9, min_samples=1
    )
    algorithm = VegasLimit(s, clock)
    algorithm._recent_rtt = 0.05  # as if windows had been measured
    return ConcurrencyLimiter(algorithm, clock, weights)


async def test_a_storming_clusters_line_is_full_while_another_cluster_still_queues() -> None:
    clock = Clock()
    lim = fixed_limiter(4, clock, {"a": 1, "b": 1})
    held = [lim.try_acquire(NF, "a") for _ in range(4)]
    assert all(isinstance(s, Slot) for s in held)
    storm = [asyncio.create_task(lim.acquire(NF, clock.now + 5, "a")) for _ in range(10)]
    await asyncio.sleep(0)
    refused = [t.result() for t in storm if t.done()]
    assert refused and all(r is Refusal.QUEUE_FULL for r in refused)
    login = asyncio.create_task(lim.acquire(NF, clock.now + 5, "b"))
    await asyncio.sleep(0)
    assert not login.done()  # queued, not refused
    first = held[0]
    assert first is not None
    lim.release(first, rtt=0.05)
    assert isinstance(await login, Slot)  # the next slot is b's
    for task in storm:
        task.cancel()
    await asyncio.gather(*storm, return_exceptions=True)


async def test_only_the_longest_line_is_refused_after_one_round() -> None:
    clock = Clock()
    lim = fixed_limiter(2, clock, {"a": 1, "b": 1})
    held = [lim.try_acquire(NF, "a") for _ in range(2)]
    waiting = [asyncio.create_task(lim.acquire(NF, clock.now + 5, "a")) for _ in range(6)]
    logins = [asyncio.create_task(lim.acquire(NF, clock.now + 5, "b")) for _ in range(3)]
    await asyncio.sleep(0)
    # a's line (the longest) holds one round (2); b's three wait within two rounds.
    assert sum(t.done() for t in waiting) == 4
    assert not any(t.done() for t in logins)
    assert lim.waiting(cluster="b") == 3
    for slot in held:
        assert slot is not None
        lim.release(slot, rtt=0.05)
    for task in [*waiting, *logins]:
        task.cancel()
    await asyncio.gather(*waiting, *logins, return_exceptions=True)


async def test_a_saturated_limit_is_saturated_for_every_cluster() -> None:
    clock = Clock()
    lim = fixed_limiter(1, clock, {"a": 1, "b": 1})
    assert lim.try_acquire(NF, "a") is not None
    assert lim.would_wait(HF, "a") and lim.would_wait(HF, "b")


# ---- the bucket's shares -------------------------------------------------------------

SHARES = FairShares.of({"a": 1.0, "b": 1.0, DEFAULT_CLUSTER: 1.0})


def run_bucket(
    rate: float, burst: int, shares: FairShares, offered: dict[str, float], seconds: float
) -> tuple[dict[str, int], list[float]]:
    """Calls allowed per cluster when each offers ``offered[c]`` calls/s (evenly spaced),
    and the times of every allowed call."""
    clock = [0.0]
    store = MemoryBucketStore(clock=lambda: clock[0])
    events = sorted(
        (i / per_second, cluster)
        for cluster, per_second in offered.items()
        for i in range(1, int(per_second * seconds) + 1)
    )
    allowed = dict.fromkeys(offered, 0)
    times = []
    for at, cluster in events:
        clock[0] = at
        wait, _ = store.take_fair_now(
            SharedBucket("bucket:x", 1 / rate, burst, shares), 0.0, cluster
        )
        if wait is not None:
            allowed[cluster] += 1
            times.append(at)
    return allowed, times


def test_a_cluster_under_its_share_gets_all_it_asks_while_another_storms() -> None:
    # R = 90/s, three equal shares of 30/s; b asks 20/s, a offers 900/s.
    allowed, _ = run_bucket(90, 45, SHARES, {"a": 900, "b": 20}, seconds=10)
    assert allowed["b"] == 200
    # a gets the rest: its own 30/s, b's unused 10/s and default's 30/s, lent.
    assert 650 <= allowed["a"] <= 90 * 10 + 45 - 200


def test_two_storming_clusters_split_the_bucket_by_weight() -> None:
    shares = FairShares.of({"a": 2.0, "b": 1.0, DEFAULT_CLUSTER: 1.0})
    allowed, _ = run_bucket(80, 40, shares, {"a": 800, "b": 800}, seconds=10)
    assert 1.8 <= allowed["a"] / allowed["b"] <= 2.2, allowed
    assert allowed["a"] + allowed["b"] <= 80 * 10 + 40


def test_one_cluster_alone_gets_the_whole_rate() -> None:
    allowed, _ = run_bucket(60, 30, SHARES, {"a": 600}, seconds=20)
    # Everything but the other shares' reserves (half their bursts).
    assert allowed["a"] >= 60 * 20 - 30


@settings(max_examples=80, deadline=None)
@given(
    rate=st.sampled_from([5.0, 20.0, 100.0]),
    burst=st.integers(3, 60),
    offered=st.lists(
        # None: a follow-up call, of no cluster.
        st.tuples(st.sampled_from(["a", "b", DEFAULT_CLUSTER, None]), st.floats(0.0, 0.5)),
        min_size=1,
        max_size=300,
    ),
)
def test_no_window_sees_more_than_the_bucket_allows(
    rate: float, burst: int, offered: list[tuple[str | None, float]]
) -> None:
    """The bucket's bound holds whatever the clusters do: B + R·t in any window of t."""
    clock = [0.0]
    store = MemoryBucketStore(clock=lambda: clock[0])
    times = []
    for cluster, gap in offered:
        clock[0] += gap
        wait, _ = store.take_fair_now(SharedBucket("k", 1 / rate, burst, SHARES), 0.0, cluster)
        if wait is not None:
            times.append(clock[0])
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            assert j - i + 1 <= burst + rate * (times[j] - start) + 1e-6


def test_a_refused_call_changes_no_share() -> None:
    state = ShareState([10.0, 10.0, 10.0], [0.0] * 3, [NEVER] * 3)
    intervals = SHARES.intervals(0.1)
    new, wait, charged = fair_gcra(state, 0.0, 0.1, intervals, SHARES.weights, 0, 0.0)
    assert (wait, charged) == (None, -1)
    assert new.tats == state.tats


def test_a_lender_keeps_half_its_burst() -> None:
    # Share 1 is full, share 0 empty (2 too): 0 may borrow from 1 until 1 is half empty.
    interval, burst = 0.1, 30  # tau = 3 s; each share: interval 0.3 s, burst 10
    intervals = SHARES.intervals(interval)
    state = ShareState([3.0, 0.0, 3.0], [0.0] * 3, [NEVER] * 3)
    lent = 0
    for _ in range(20):
        state, wait, charged = fair_gcra(
            state, 0.0, burst * interval, intervals, SHARES.weights, 0, 0.0
        )
        if wait is None:
            break
        assert charged == 1
        lent += 1
    assert lent == 5


def test_what_one_share_lends_goes_to_the_borrowers_by_weight() -> None:
    # a (weight 2) and b (weight 1) storm; default's 20/s is lent 2:1 between them.
    shares = FairShares.of({"a": 2.0, "b": 1.0, DEFAULT_CLUSTER: 1.0})
    allowed, _ = run_bucket(80, 40, shares, {"a": 800, "b": 800}, seconds=20)
    assert 1.8 <= allowed["a"] / allowed["b"] <= 2.2, allowed


async def test_a_follow_up_call_takes_from_the_share_with_the_most_left() -> None:
    store = MemoryBucketStore(clock=lambda: 0.0)
    bucket = TokenBucket("bucket:x", 30, 30, store, SHARES)  # shares of 10 calls
    for _ in range(4):
        assert await bucket.acquire_for("a") == (True, "a")
    assert await bucket.acquire()  # a's share is the emptiest: b's or default's pays
    assert "{bucket:x}:share:a" in store._tat
    assert sorted(store._tat) == ["{bucket:x}:share:a", "{bucket:x}:share:b"]


async def test_without_shares_a_cluster_takes_from_the_plain_bucket() -> None:
    store = MemoryBucketStore(clock=lambda: 0.0)
    bucket = TokenBucket("bucket:x", 10, 1, store)
    assert await bucket.acquire_for("b") == (True, None)
    assert await bucket.acquire_for("b") == (False, None)
    assert list(store._tat) == ["bucket:x"]


async def test_a_cluster_with_no_share_is_charged_as_a_follow_up_is() -> None:
    store = MemoryBucketStore(clock=lambda: 0.0)
    shares = FairShares.of({"a": 1.0, "b": 1.0})  # every caller is a or b
    bucket = TokenBucket("bucket:x", 10, 2, store, shares)
    allowed, paid_by = await bucket.acquire_for(DEFAULT_CLUSTER)
    assert allowed and paid_by in ("a", "b")
