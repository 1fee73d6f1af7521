"""What one Redis operation costs the gateway process, on this machine.

Prints client CPU and wall time per operation for the calls fleet mode makes:
a cache GET, the GCRA bucket script, the breaker's admission and settle scripts
(one of each per fleet-admitted IdP call), and the pipelined breaker sync. These
figures decided which calls may sit on the review hot path (none) and how often to
poll breaker state (docs/decisions.md, "Fleet mode").

    python -m loadtests.redis_costs            # starts its own redis-server
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as redis

from authn_gateway.layers.breaker.redis import ADMIT, SETTLE
from authn_gateway.layers.bucket.redis import GCRA_TAKE
from tests.support.redis_server import RedisServer

N = 5000


async def measure(label: str, op: Callable[[], Awaitable[Any]]) -> None:
    for _ in range(200):
        await op()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(N):
        await op()
    cpu_us = (time.process_time() - cpu) / N * 1e6
    wall_us = (time.perf_counter() - wall) / N * 1e6
    print(f"{label:<40} {cpu_us:8.1f} us CPU {wall_us:8.1f} us wall")


async def main(port: int) -> None:
    r = redis.Redis(port=port)
    await r.set("k", b"x" * 300)
    keys = [f"breaker:{i}" for i in range(4)]
    for k in keys:
        await r.hset(k, mapping={"state": "closed", "opened_at": "0", "updated_at": "1"})

    async def sync() -> None:
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        await pipe.execute()

    gcra = r.register_script(GCRA_TAKE)
    admit, settle = r.register_script(ADMIT), r.register_script(SETTLE)
    breaker = ["breaker:0", "in-flight", "probes", "failures"]
    print(f"per operation, mean of {N}:")
    await measure("cache GET (300-byte entry)", lambda: r.get("k"))
    await measure(
        "GCRA bucket script (EVALSHA)", lambda: gcra(keys=["b"], args=["0.000001", 10**9, "0"])
    )
    # As breaker/redis.py calls them: a slot taken for call "m", then freed as a success.
    await measure(
        "breaker admission script (EVALSHA)",
        lambda: admit(keys=breaker, args=[10**9, 30_000, "m", 30, 1, 5]),
    )
    await measure(
        "breaker settle script (EVALSHA)",
        lambda: settle(keys=breaker, args=["m", "ok", 5, 0, "breaker-events", "idp"]),
    )
    await measure("breaker sync, 4 backends (pipelined)", sync)
    await r.aclose()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = RedisServer(Path(tmp)).start()
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from None
        try:
            asyncio.run(main(server.port))
        finally:
            server.stop()
