"""Fleet mode over Redis Sentinel and Redis Cluster, through redis-py, with real servers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import loadclient
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.pki import issue, make_ca
from tests.support.procs import GatewayProcess, metric_value
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


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[RedisServer, Path]]:
    """A redis-server that speaks TLS only, with a certificate of a private CA."""
    ca = make_ca("redis-test-ca")
    cert, key = issue(ca, "redis", server=True).write(tmp_path, "redis")
    ca_file = tmp_path / "redis-ca.crt"
    ca_file.write_bytes(ca.cert_pem())
    server = RedisServer(tmp_path)
    server.start(
        "--port", "0", "--tls-port", str(server.port), "--tls-cert-file", str(cert),
        "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca_file),
        "--tls-auth-clients", "no",
    )  # fmt: skip
    yield server, ca_file
    server.stop()


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


async def test_fleet_over_tls_with_a_private_ca(
    fake_idp: FakeIdP, tls_redis: tuple[RedisServer, Path], gateway_factory: Start, tmp_path: Path
) -> None:
    """rediss:// with redis.tls.ca_file (its query takes no ssl_* arguments): the
    replicas reach Redis and act as one; without the CA they cannot verify it and run
    on local state, said in the log and the mode metric, never a failed start."""
    server, ca_file = tls_redis
    url = f"rediss://127.0.0.1:{server.port}/0"
    cfg = config(fake_idp, {"url": url, "tls": {"ca_file": str(ca_file)}})
    replicas = [gateway_factory(cfg, name=f"t{i}") for i in range(2)]
    await behaves_as_one_gateway(fake_idp, replicas)

    untrusting = gateway_factory(config(fake_idp, {"url": url}), name="no-ca")
    untrusting.wait_for_log("falling back to local state")
    metrics = httpx.get(f"{untrusting.url}/metrics", timeout=10).text
    assert metric_value(metrics, "authn_gateway_redis_mode", mode="local") == 1
