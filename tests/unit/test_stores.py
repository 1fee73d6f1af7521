"""One suite for each resilience store, run against its in-memory and its Redis version."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from authn_gateway.config import RedisSettings
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.bucket import BucketStore, MemoryBucketStore
from authn_gateway.layers.cache import CacheStore, MemoryStore
from authn_gateway.observe.metrics import Metrics
from authn_gateway.review.stores import RedisStores
from backends.base import Authenticated, UserInfo
from tests.support.redis_server import RedisServer
from tests.support.stores_helpers import entry


async def test_redis_down_falls_back_to_a_local_share_of_the_bucket(tmp_path: Path) -> None:
    down = RedisServer(tmp_path)  # never started
    settings = RedisSettings(url=down.url, expected_replicas=2, retry_seconds=60)
    fleet = RedisStores(settings, TokenHasher(b"k"), Metrics(), 100)
    await fleet.start()
    try:
        assert not fleet.link.shared
        store = fleet.bucket_store()
        # Rate 10/s and burst 4 across 2 replicas: this replica's bucket runs at 5/s
        # with burst 2, and starts empty (no burst for having switched mode).
        answers = [await store.take("bucket:y", 0.1, 4, 0.0) for _ in range(2)]
        assert answers == [None, None]
        await asyncio.sleep(0.25)  # one local interval (0.2 s) refills one call
        answers = [await store.take("bucket:y", 0.1, 4, 0.0) for _ in range(2)]
        assert [a is not None for a in answers] == [True, False]
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
        url=f"redis://127.0.0.1:{port}/0",
        timeout_seconds=0.2,
        retry_seconds=60,
        slow_calls_to_local=1,
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
            await fleet.bucket_store().take("bucket:s", 0.001, 100, 0.0)
        assert loop.time() - started < 0.2
        assert await fleet.cache_store().get(b"\x01" * 32) is not None
    finally:
        await fleet.close()
        silent.close()
