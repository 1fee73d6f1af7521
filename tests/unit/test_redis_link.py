"""A Redis Cluster that cannot be reached is Redis down, like a lone Redis: the gateway
starts in local mode and keeps trying (found by the config fuzz, issue 36: with
``redis.cluster: true`` the cluster client raises RedisClusterException, which is no
RedisError, and the start-up failed). Over a real socket: a loopback port with nothing
listening."""

from __future__ import annotations

import asyncio

from authn_gateway.config import RedisSettings
from authn_gateway.fleet.redis_link import RedisDown, RedisLink
from authn_gateway.observe.metrics import Metrics
from tests.support.procs import free_port


async def test_an_unreachable_cluster_is_local_mode_and_the_link_keeps_trying() -> None:
    url = f"redis://127.0.0.1:{free_port()}"
    link = RedisLink(RedisSettings(url=url, cluster=True, retry_seconds=0.05), Metrics())
    await link.start()
    try:
        assert link.shared is False
        assert await link.either("get", lambda r: r.get("k"), lambda: "local") == "local"
        try:
            await link.run("get", lambda r: r.get("k"))
        except RedisDown:
            pass
        else:
            raise AssertionError("an unreachable cluster answered")
        await asyncio.sleep(0.3)  # several retries: the recovery loop must outlive them
        assert link._recovery is not None and not link._recovery.done()
    finally:
        await link.close()
