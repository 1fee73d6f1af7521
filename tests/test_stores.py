"""One suite for each resilience store, run against its in-memory and its Redis version."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from authn_gateway.bucket import BucketStore, MemoryBucketStore
from authn_gateway.cache import CacheEntry, CacheStore, MemoryStore
from authn_gateway.config import RedisSettings
from authn_gateway.keys import TokenHasher
from authn_gateway.metrics import Metrics
from authn_gateway.stores import MemoryStores, RedisStores
from backends.base import Authenticated, Rejected, UserInfo
from tests.support.redis_server import RedisServer


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


def entry(outcome: Any, ttl: float = 60) -> CacheEntry:
    now = time.time()
    return CacheEntry(outcome, now + ttl, now + ttl * 2)


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


async def test_probe_permits_allow_k_then_free_on_release(state: Any) -> None:
    permits = state.probe_permits("idp", 2, 5.0)
    first, second = await permits.try_acquire(), await permits.try_acquire()
    assert first is not None
    assert second is not None
    assert await permits.try_acquire() is None
    permits.release(first)

    await asyncio.sleep(0.05)  # Redis releases in the background
    assert await permits.try_acquire() is not None


async def test_redis_probe_permits_expire_when_the_holder_dies(shared: RedisStores) -> None:
    permits = shared.probe_permits("dying", 1, 0.2)
    assert await permits.try_acquire() is not None  # never released
    assert await permits.try_acquire() is None

    await asyncio.sleep(0.3)
    assert await permits.try_acquire() is not None


async def test_redis_down_falls_back_to_a_local_share_of_the_bucket(tmp_path: Path) -> None:
    down = RedisServer(tmp_path)  # never started
    settings = RedisSettings(url=down.url, expected_replicas=2, retry_seconds=60)
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 100)
    await fleet.start()
    try:
        assert not fleet.link.shared
        store = fleet.bucket_store()
        # burst 4 across 2 replicas: this replica may take 2.
        answers = [await store.take("bucket:y", 0.1, 4, 0.0) for _ in range(4)]
        assert [a is not None for a in answers] == [True, True, False, False]
        await fleet.cache_store().put(b"z" * 32, entry(Authenticated(UserInfo("u"))))
        assert await fleet.cache_store().get(b"z" * 32) is not None
    finally:
        await fleet.close()


def test_memory_stores_satisfy_the_protocols() -> None:
    cache: CacheStore = MemoryStore(1)
    bucket: BucketStore = MemoryBucketStore()
    assert len(cache) == 0
    assert bucket is not None


async def test_a_redis_that_never_answers_costs_one_deadline_then_local_mode() -> None:
    # A listener that accepts connections (the backlog does) but never answers a command.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    port = silent.getsockname()[1]
    settings = RedisSettings(
        url=f"redis://127.0.0.1:{port}/0", timeout_seconds=0.2, retry_seconds=60
    )
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 100)
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        await fleet.start()
        assert loop.time() - started < 1.0
        assert not fleet.link.shared
        # From now on no call waits for Redis at all.
        started = loop.time()
        for i in range(20):
            await fleet.cache_store().put(bytes([i]) * 32, entry(Authenticated(UserInfo("u"))))
            assert await fleet.bucket_store().take("bucket:s", 0.001, 100, 0.0) is not None
        assert loop.time() - started < 0.2
        assert await fleet.cache_store().get(b"\x01" * 32) is not None
    finally:
        await fleet.close()
        silent.close()
