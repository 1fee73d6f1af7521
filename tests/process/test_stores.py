"""One suite for each resilience store, run against its in-memory and its Redis version."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.fleet_size import FleetSize
from authn_gateway.fleet.redis_link import RedisDown, lua_script
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.breaker import redis_sync as breaker_sync
from authn_gateway.layers.breaker.gate import BUSY, CallGate
from authn_gateway.layers.bucket import BucketStore
from authn_gateway.layers.bucket.fair import NEVER, FairShares, ShareState, fair_gcra
from authn_gateway.layers.bucket.memory import borrowing_key, share_key
from authn_gateway.layers.bucket.shares import SharedBucket
from authn_gateway.layers.cache import CacheEntry, CacheStore
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.stores import BreakerSpec, MemoryStores, RedisStores
from backends.base import Authenticated, Rejected, Unavailable, UserInfo
from backends.context import DEFAULT_CLUSTER
from backends.settings import BreakerSettings, ConcurrencySettings
from tests.support.redis_server import RedisServer
from tests.support.stores_helpers import entry
from tests.support.tasks_helpers import retrying_loop


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


async def fleet_state(server: RedisServer) -> RedisStores:
    settings = RedisSettings(url=server.url, key_prefix=f"t{time.monotonic_ns()}")
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 1000)
    await fleet.start()
    return fleet


@pytest.fixture(params=["memory", "redis"])
async def state(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Any]:
    """Each store, in memory and over Redis; the same tests run against both."""
    if request.param == "memory":
        yield MemoryStores(1000)
        return
    fleet = await fleet_state(redis_server)
    yield fleet
    await fleet.close()


@pytest.fixture
async def shared(redis_server: RedisServer) -> AsyncIterator[RedisStores]:
    """Redis only: behaviour that exists because state outlives a process."""
    fleet = await fleet_state(redis_server)
    yield fleet
    await fleet.close()


async def test_cache_round_trips_positive_and_negative_entries(state: Any) -> None:
    store: CacheStore = state.cache_store()
    alice = Authenticated(UserInfo("alice", "1", ("g",), {"k": ("v",)}), expires_at=None)
    await store.put(b"a" * 32, entry(alice))
    await store.put(b"r" * 32, entry(Rejected("no")))
    got = await store.get(b"a" * 32)
    assert got is not None
    assert got.outcome == alice
    rejected = await store.get(b"r" * 32)
    assert rejected is not None
    assert isinstance(rejected.outcome, Rejected)
    assert await store.get(b"x" * 32) is None


async def test_shared_cache_serves_a_fresh_process(shared: RedisStores) -> None:
    state = shared
    await state.cache_store().put(b"k" * 32, entry(Authenticated(UserInfo("bob"))))
    other = RedisStores(state.settings, TokenHasher(b"k"), Metrics(), 1000)
    await other.start()
    try:
        got = await other.cache_store().get(b"k" * 32)
        assert got is not None
        assert got.outcome.user.username == "bob"
    finally:
        await other.close()


async def test_close_ends_every_task_the_fleet_state_started(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Awaited, not only cancelled: a loop that lost its cancellation (it can come back
    # from the Redis client as a timeout) would otherwise run on past the shutdown.
    # The breaker subscriber and the heartbeat are made such loops here.
    running = [True]
    monkeypatch.setattr(breaker_sync, "listen", lambda *args: retrying_loop(2, [], running))
    monkeypatch.setattr(FleetSize, "_run", lambda self: retrying_loop(2, [], running))
    before = asyncio.all_tasks()
    settings = RedisSettings(url=redis_server.url, key_prefix=f"t{time.monotonic_ns()}")
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 1000)
    gate(fleet, "idp")  # a fleet breaker: its subscriber and poll start with the state
    await fleet.start()
    started = asyncio.all_tasks() - before
    assert len(started) >= 3  # breaker subscriber and poll, heartbeat, cache counter
    await asyncio.sleep(0.05)  # each loop is inside its call
    await fleet.close()
    left = [t for t in started if not t.done()]
    running[0] = False  # the test's own clean-up, should any be left
    for task in left:
        task.cancel()
    assert left == []


async def test_redis_keeps_an_identity_until_its_keep_time_not_its_stale_limit(
    shared: RedisStores,
) -> None:
    """So that a max_stale raised later (up to keep_stale_seconds) reaches it."""
    now = time.time()
    bob = Authenticated(UserInfo("bob"))
    await shared.cache_store().put(
        b"b" * 32, CacheEntry(bob, now + 60, now + 120, "0123456789ab", keep_until=now + 3600)
    )
    link = shared.link
    ttl = await link.client.pttl(link.key("cache", (b"b" * 32).hex()))
    assert 3500_000 < ttl <= 3600_000
    index_ttl = await link.client.pttl(link.key("idx", "user", "bob"))
    assert 3500_000 < index_ttl <= 3600_000


async def test_bucket_allows_burst_then_refuses(state: Any) -> None:
    store: BucketStore = state.bucket_store()
    answers = [await store.take("bucket:x", 10.0, 3, 0.0) for _ in range(5)]
    assert [a is not None for a in answers] == [True, True, True, False, False]


async def test_bucket_max_wait_reserves_the_next_slot(state: Any) -> None:
    store: BucketStore = state.bucket_store()
    assert await store.take("bucket:w", 0.5, 1, 0.0) == 0.0
    wait = await store.take("bucket:w", 0.5, 1, 1.0)
    assert wait is not None
    assert 0.3 < wait <= 0.5


SHARES = FairShares.of({"a": 1.0, "b": 1.0, DEFAULT_CLUSTER: 1.0})


async def test_a_shared_bucket_keeps_a_clusters_share_while_another_storms(state: Any) -> None:
    """R = 30/s, B = 30: three shares of burst 10. a takes its own 10 and half of each
    idle share; b still finds the half of its own that a could not borrow."""
    store: BucketStore = state.bucket_store()
    storm = [
        await store.take_fair(SharedBucket("bucket:f", 1 / 30, 30, SHARES), 0.0, "a")
        for _ in range(40)
    ]
    paid = [by for wait, by in storm if wait is not None]
    assert paid.count("a") == 10 and paid.count("b") == 5 and paid.count(DEFAULT_CLUSTER) == 5
    own = [
        await store.take_fair(SharedBucket("bucket:f", 1 / 30, 30, SHARES), 0.0, "b")
        for _ in range(5)
    ]
    assert [by for wait, by in own if wait is not None] == ["b"] * 5


async def test_a_follow_up_call_is_paid_by_the_share_with_the_most_left(state: Any) -> None:
    store: BucketStore = state.bucket_store()
    for _ in range(10):  # a's share (10 calls) spent
        assert (await store.take_fair(SharedBucket("bucket:g", 1 / 30, 30, SHARES), 0.0, "a"))[
            1
        ] == "a"
    wait, paid_by = await store.take_fair(SharedBucket("bucket:g", 1 / 30, 30, SHARES), 0.0, None)
    assert wait is not None and paid_by in ("b", DEFAULT_CLUSTER)


#: The script reads Redis' clock in these two lines; the parity test below swaps them
#: for its last argument, so the script and the Python function decide at one instant.
CLOCK = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"


def clocked(script: str) -> str:
    assert script.count(CLOCK) == 1, "fair_take.lua reads the clock some other way"
    return script.replace(CLOCK, "local now = tonumber(ARGV[#ARGV])\n")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    weights=st.lists(st.sampled_from([1.0, 2.0, 3.0]), min_size=1, max_size=6),
    # Two calls of burst among six clusters: shares of a third of a call.
    burst=st.sampled_from([2, 3, 10, 30]),
    max_wait=st.sampled_from([0.0, 0.0, 0.05]),
    data=st.data(),
)
# a spent, b and c full: a borrows from the fullest of them.
@example(weights=[1.0, 1.0, 1.0], burst=30, max_wait=0.0, data=None)
async def test_the_script_decides_as_the_python_function(
    shared: RedisStores,
    weights: list[float],
    burst: int,
    max_wait: float,
    data: st.DataObject | None,
) -> None:
    """fair_take.lua is bucket/fair.py's fair_gcra, step for step: from the same state
    at the same instant, the same decision, wait and share paying most, and the same
    state after it (every share's TAT; the cluster's pass, ask and entitlement). The
    script runs as shipped but for its clock, which it is given (``clocked``); the
    store's own use of it, on Redis' clock, is the tests above."""
    n = len(weights)
    interval = 0.1
    tau = burst * interval
    shares = FairShares(tuple(f"c{i}" for i in range(n)), tuple(weights))
    if data is None:
        own: int | None = 0
        tats: list[float | None] = [tau, None, None]
        passes = [0, 0, 0]
        asked: list[float | None] = [None, None, None]
        credits: list[float | None] = [None, None, None]
    else:
        own = data.draw(st.one_of(st.none(), st.integers(0, n - 1)))
        # Each share's TAT as seconds after now (None: none kept: full), spent often;
        # each cluster's pass, how long ago it last asked to borrow, its entitlement's
        # TAT (seconds after now).
        tat = st.one_of(st.just(tau), st.none(), st.floats(-1, tau + 0.1))
        tats = data.draw(st.lists(tat, min_size=n, max_size=n))
        passes = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
        ago = st.sampled_from([None, 0.1 * tau, 0.1 * tau, 5.0 * tau])
        asked = data.draw(st.lists(ago, min_size=n, max_size=n))
        credit = st.one_of(st.just(2.0), st.none(), st.floats(-1, 2))
        credits = data.draw(st.lists(credit, min_size=n, max_size=n))
    link = shared.link
    client = link.client
    key = f"bucket:p{time.monotonic_ns()}"
    seconds, micros = await client.time()
    now = seconds + micros / 1e6
    state = ShareState.new(n)
    for j, name in enumerate(shares.names):
        at = tats[j]
        if at is not None:
            state.tats[j] = float(f"{now + at:.6f}")
            await client.set(link.key(share_key(key, name)), f"{state.tats[j]:.6f}")
        fields = {"p": str(passes[j])}
        state.passes[j] = float(passes[j])
        ago = asked[j]
        if ago is not None:
            state.asked[j] = float(f"{now - ago:.6f}")
            fields["a"] = f"{state.asked[j]:.6f}"
        credit = credits[j]
        if credit is not None:
            state.credits[j] = float(f"{now + credit:.6f}")
            fields["c"] = f"{state.credits[j]:.6f}"
        await client.hset(link.key(borrowing_key(key, name)), mapping=fields)
    bucket = SharedBucket(key, interval, burst, shares)
    keys = [link.key(share_key(key, name)) for name in shares.names]
    keys += [link.key(borrowing_key(key, name)) for name in shares.names]
    args = [
        repr(bucket.tau),
        repr(max_wait),
        -1 if own is None else own,
        *map(repr, bucket.intervals),
        *map(repr, shares.weights),
        repr(now),
    ]
    script = clocked(lua_script("authn_gateway.layers.bucket", "fair_take.lua"))
    seconds_text, charged_by = await client.eval(script, len(keys), *keys, *args)
    new, wait, charged = fair_gcra(state, now, tau, bucket.intervals, shares.weights, own, max_wait)
    got = float(seconds_text)
    assert (got < 0) == (wait is None), (got, wait)
    if wait is not None:
        assert abs(got - wait) <= 1e-6 and int(charged_by) == charged
    for j in range(n):
        stored = await client.get(keys[j])
        lua = max(float(stored) if stored is not None else 0.0, now)
        assert lua == max(new.tats[j], now), (j, lua, new.tats[j])
    if own is not None:
        p, a, c = await client.hmget(keys[n + own], "p", "a", "c")
        assert float(p) == new.passes[own]
        assert abs(float(a or NEVER) - new.asked[own]) <= 1e-6
        assert float(c or 0) == new.credits[own]


def breaker_settings(fail_max: int = 2, probes: int = 1, in_flight: int = 10) -> Any:
    return SimpleNamespace(
        breaker=BreakerSettings(
            fail_max=fail_max, reset_timeout_seconds=0.3, half_open_probes=probes
        ),
        concurrency=ConcurrencySettings(
            max_limit=in_flight,
            initial_limit=min(in_flight, 20),
            # In one process the adaptive limit (limit/) holds the ceiling when it is on;
            # off, the breaker keeps max_limit slots itself.
            enabled=False,
        ),
    )


def gate(state: Any, name: str, **kw: Any) -> CallGate:
    gate: CallGate = state.breaker(BreakerSpec(name, breaker_settings(**kw), 5.0, lambda *a: None))
    return gate


async def settled() -> None:
    await asyncio.sleep(0.05)  # Redis settles in the background


async def until(check: Any, seconds: float = 2.0) -> None:
    """Wait for ``check()`` a while: a background settle can sit behind a 50 ms gen-2
    garbage collection, longer than :func:`settled` allows (seen in this suite)."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def test_breaker_opens_at_fail_max_then_admits_k_probes(state: Any) -> None:
    breaker = gate(state, f"b{time.monotonic_ns()}", fail_max=2, probes=2)
    for _ in range(2):
        ticket = await breaker.admit()
        assert ticket is not None and ticket is not BUSY
        breaker.record(ticket, Unavailable("down"))
        await settled()
    assert breaker.state == "open"
    assert await breaker.admit() is None
    await asyncio.sleep(0.35)  # reset_timeout
    probes = [await breaker.admit(), await breaker.admit(), await breaker.admit()]
    assert [p is not None for p in probes] == [True, True, False]
    assert probes[0] is not None
    breaker.record(probes[0], Authenticated(UserInfo("u")))
    await settled()
    assert breaker.state == "closed"


async def test_a_success_resets_the_failure_count(state: Any) -> None:
    breaker = gate(state, f"r{time.monotonic_ns()}", fail_max=2)
    for outcome in (Unavailable("x"), Rejected("bad"), Unavailable("x")):
        ticket = await breaker.admit()
        assert ticket is not None
        breaker.record(ticket, outcome)
        await settled()
    assert breaker.state == "closed"


async def test_in_flight_ceiling_refuses_past_max_then_frees_on_record(state: Any) -> None:
    breaker = gate(state, f"c{time.monotonic_ns()}", in_flight=2)
    first, second = await breaker.admit(), await breaker.admit()
    assert first is not None and first is not BUSY
    assert second is not None and second is not BUSY
    assert await breaker.admit() is BUSY
    breaker.release(first)
    await settled()
    third = await breaker.admit()
    assert third is not None and third is not BUSY


async def test_fleet_failures_are_counted_across_replicas(redis_server: RedisServer) -> None:
    prefix = f"t{time.monotonic_ns()}"
    replicas = []
    for _ in range(3):
        fleet = RedisStores(
            RedisSettings(url=redis_server.url, key_prefix=prefix), TokenHasher(b"k"), Metrics(), 10
        )
        replicas.append((fleet, gate(fleet, "idp", fail_max=3)))
        await fleet.start()
    try:
        # One failure on each replica: three in a row for the fleet.
        for _, breaker in replicas:
            ticket = await breaker.admit()
            assert ticket is not None
            breaker.record(ticket, Unavailable("down"))
            await settled()
        # Every replica knows (from the settle answer or the published message).
        await until(lambda: all(b.state == "open" for _, b in replicas))
        assert [b.state for _, b in replicas] == ["open"] * 3
        assert [await b.admit() for _, b in replicas] == [None] * 3
    finally:
        for fleet, _ in replicas:
            await fleet.close()


async def test_in_flight_slots_expire_when_the_holder_dies(shared: RedisStores) -> None:
    breaker = shared.breaker(
        BreakerSpec("dying", breaker_settings(in_flight=1), 0.2, lambda *a: None)
    )
    assert await breaker.admit() not in (None, BUSY)  # never settled
    assert await breaker.admit() is BUSY
    await asyncio.sleep(0.3)
    assert await breaker.admit() not in (None, BUSY)


async def test_one_late_answer_is_a_busy_redis_not_a_dead_one(redis_server: RedisServer) -> None:
    settings = RedisSettings(url=redis_server.url, timeout_seconds=0.1, slow_calls_to_local=3)
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 100)
    await fleet.start()
    try:
        link = fleet.link

        async def late(r: Any) -> None:
            await asyncio.sleep(0.2)

        for _ in range(2):
            with pytest.raises(RedisDown):
                await link.run("slow", late)
        assert link.shared  # two late answers: still shared
        await link.run("ping", lambda r: r.ping())  # an answer in time resets the count
        for _ in range(2):
            with pytest.raises(RedisDown):
                await link.run("slow", late)
        assert link.shared
        with pytest.raises(RedisDown):
            await link.run("slow", late)
        assert not link.shared  # three in a row: local mode
    finally:
        await fleet.close()
