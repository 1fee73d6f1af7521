"""What the shared cache's rotation lookups, write-back and identity count cost.

Runs the gateway's own TieredCacheStore against a private redis-server and prints:
- Redis memory per identity: the entry with its indexes, and the counting sorted set;
- the count (ZREMRANGEBYSCORE + ZCARD) at that size;
- the write-back's client CPU per identity (the rate limit off);
- a shared-tier miss with and without one previous secret (secret rotation).
These figures are quoted in docs/decisions.md ("Write-back and the shared-cache count",
"Secret rotation").

    python -m loadtests.shared_cache_costs [--identities 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.redis_link import RedisLink
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache.memory import MemoryStore
from authn_gateway.layers.cache.policy import CacheEntry
from authn_gateway.layers.cache.redis import EntryCodec, TieredCacheStore
from authn_gateway.observe.metrics import Metrics
from backends.base import Authenticated, UserInfo
from tests.support.redis_server import RedisServer

SECRET = os.urandom(32)
PREVIOUS = os.urandom(32)


def identity(i: int, now: float) -> CacheEntry:
    user = UserInfo(f"user-{i:06d}@example.com", f"uid-{i}", ("developers", "team-a"), {})
    return CacheEntry(Authenticated(user, None), now + 300, now + 3900, f"{i:012x}")


async def used_memory(r: Any) -> int:
    await r.execute_command("MEMORY", "PURGE")
    return int((await r.info("memory"))["used_memory"])


def store(link: RedisLink, hasher: TokenHasher, n: int, rate: int) -> TieredCacheStore:
    return TieredCacheStore(
        MemoryStore(n), link, EntryCodec(hasher), Metrics(), write_back_per_second=rate
    )


async def main(port: int, n: int) -> None:
    settings = RedisSettings(url=f"redis://127.0.0.1:{port}/0", timeout_seconds=5)
    link = RedisLink(settings, Metrics())
    r = link.client
    hasher = TokenHasher(SECRET)
    tier = store(link, hasher, n, 10**6)
    now = time.time()
    keys = [hasher.cache_key("idp", f"token-{i}", ()) for i in range(n)]

    base = await used_memory(r)
    cpu = time.process_time()
    for i, key in enumerate(keys):
        await tier.put(key, identity(i, now))
    put_us = (time.process_time() - cpu) / n * 1e6
    full = await used_memory(r)
    live = link.key("cache-live")
    zset = await r.memory_usage(live)
    print(f"{n} identities in Redis: {(full - base) / n:.0f} bytes each in all")
    print(f"  of which the counting sorted set: {zset / n:.0f} bytes each ({zset} in total)")

    started = time.perf_counter()
    counted = await tier.count_shared()
    print(f"count_shared at {counted}: {(time.perf_counter() - started) * 1000:.2f} ms wall")

    await r.flushall()
    cpu, wall = time.process_time(), time.perf_counter()
    written = await tier.write_back()
    cpu_us = (time.process_time() - cpu) / written * 1e6
    wall_s = time.perf_counter() - wall
    print(
        f"write-back of {written}: {cpu_us:.1f} us client CPU per identity "
        f"({cpu_us / put_us:.2f}x a cache write's {put_us:.1f} us, measured above), "
        f"{wall_s:.2f} s wall without the rate limit"
    )

    # Shared-tier misses (a cold token): one Redis read, or two while rotating.
    # Alternated, so that a busy host weighs on both alike; medians of 5 rounds.
    rotating = TokenHasher(SECRET, [PREVIOUS])
    rounds: dict[str, list[float]] = {"no previous secret": [], "one previous secret": []}
    for round_ in range(5):
        for label, h in (("no previous secret", hasher), ("one previous secret", rotating)):
            miss = store(link, h, 10, 10)
            cold = [f"cold-{round_}-{i}" for i in range(1000)]
            cpu = time.process_time()
            for token in cold:
                previous = (
                    (lambda t=token, h=h: h.previous_cache_keys("idp", t, ()))
                    if h.previous
                    else None
                )
                await miss.get(h.cache_key("idp", token, ()), previous)
            rounds[label].append((time.process_time() - cpu) / len(cold) * 1e6)
    plain, rotated = (statistics.median(v) for v in rounds.values())
    print(f"shared-tier miss, no previous secret:  {plain:6.1f} us client CPU")
    print(f"shared-tier miss, one previous secret: {rotated:6.1f} us ({rotated / plain:.2f}x)")
    await link.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--identities", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = RedisServer(Path(tmp)).start()
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None
        try:
            asyncio.run(main(server.port, args.identities))
        finally:
            server.stop()
