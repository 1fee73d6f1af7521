"""Fleet mode over Redis Sentinel and Redis Cluster, through redis-py, with real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import loadclient
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess
from tests.support.redis_server import RedisClusterNodes, RedisSentinel, RedisServer

Start = Callable[..., GatewayProcess]


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[RedisSentinel]:
    master = RedisServer(tmp_path).start()
    watcher = RedisSentinel(tmp_path, master).start()
    yield watcher
    watcher.stop()
    master.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisClusterNodes]:
    nodes = RedisClusterNodes(tmp_path).start()
    yield nodes
    nodes.stop()


def config(idp: FakeIdP, redis: dict[str, Any]) -> dict[str, Any]:
    return {
        "secret": "topology-test-only-0TZ8kq3vWm1yN5rXb7LcE2uJ9aHsD4fG6pQiV",
        "redis": {"timeout_seconds": 0.5, "breaker_sync_seconds": 0.1, **redis},
        "backends": [userinfo_backend(idp, breaker={"fail_max": 2, "reset_timeout_seconds": 30})],
    }


async def behaves_as_one_gateway(idp: FakeIdP, replicas: list[GatewayProcess]) -> None:
    """Coalescing, the shared cache and the shared breaker, across the replicas."""
    idp.configure(latency=0.4)
    batches = await asyncio.gather(
        *(loadclient.storm(gw.url, ["good-alice"] * 10, 10) for gw in replicas)
    )
    assert all(a.review["user"]["username"] == "alice" for batch in batches for a in batch)
    assert idp.calls == 1

    idp.configure(latency=0, status=500)
    await loadclient.storm(replicas[0].url, ["good-x1", "good-x2"], 1)
    await asyncio.sleep(0.5)
    idp.reset_stats()
    answers = await loadclient.storm(replicas[1].url, [f"good-y{i}" for i in range(10)], 5)
    assert all(a.review["error"] == "idp: circuit breaker open" for a in answers)
    assert idp.calls == 0
    for gw in replicas:
        assert "falling back to local state" not in gw.logs()


async def test_fleet_over_sentinel(
    fake_idp: FakeIdP, sentinel: RedisSentinel, gateway_factory: Start
) -> None:
    cfg = config(
        fake_idp, {"sentinels": [f"127.0.0.1:{sentinel.port}"], "sentinel_master": sentinel.name}
    )
    replicas = [gateway_factory(cfg, name=f"s{i}") for i in range(2)]
    await behaves_as_one_gateway(fake_idp, replicas)


async def test_fleet_over_cluster(
    fake_idp: FakeIdP, cluster: RedisClusterNodes, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, {"url": cluster.url, "cluster": True})
    replicas = [gateway_factory(cfg, name=f"c{i}") for i in range(2)]
    await behaves_as_one_gateway(fake_idp, replicas)
