"""jwt key sets in fleet mode: three real gateway processes sharing a real Redis fetch
the issuer's keys as one client, counted by the fake issuer itself."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support import loadclient
from tests.support.fakes.issuer import DISCOVERY_PATH, JWKS_PATH, FakeIssuer, new_key
from tests.support.jwt_helpers import good_claims, jwt_backend
from tests.support.procs import GatewayProcess, free_port, metric_value
from tests.support.redis_server import RedisServer

Start = Callable[..., GatewayProcess]

SECRET = "jwt-fleet-test-only-Qm7Xv2Rk9Lp4Tz8Wc1Nb6Hs3Jd5Fg0Ya"


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def fleet_config(issuer: FakeIssuer, url: str, **keys: Any) -> dict[str, Any]:
    return {
        "secret": SECRET,
        # A generous Redis deadline: on a loaded machine a slow answer would switch a
        # replica to local mode (by design), and this test is about sharing.
        "redis": {"url": url, "timeout_seconds": 2.0, "retry_seconds": 0.5},
        "cache": {"negative_ttl_seconds": 0},
        "backends": [jwt_backend(issuer, keys={"min_refresh_seconds": 30, **keys})],
    }


def start_fleet(start: Start, config: dict[str, Any], n: int = 3) -> list[GatewayProcess]:
    """n replicas started at the same moment, so their first fetches race."""
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: start(config, name=f"replica{i}"), range(n)))


def authenticated(gw: GatewayProcess, token: str) -> bool:
    return bool(gw.review(token).json()["status"]["authenticated"])


def fetches(issuer: FakeIssuer) -> tuple[int, int]:
    return issuer.path_calls(DISCOVERY_PATH), issuer.path_calls(JWKS_PATH)


def test_three_replicas_fetch_the_keys_once_between_them(
    issuer: FakeIssuer, redis_server: RedisServer, gateway_factory: Start
) -> None:
    replicas = start_fleet(gateway_factory, fleet_config(issuer, redis_server.url))
    for i, gw in enumerate(replicas):
        assert authenticated(gw, issuer.mint(good_claims(issuer, sub=f"user{i}")))
    assert fetches(issuer) == (1, 1)
    adopted = [
        metric_value(
            httpx.get(f"{gw.url}/metrics").text,
            "authn_gateway_jwks_fetches_total",
            backend="oidc",
            result="adopted",
        )
        for gw in replicas
    ]
    assert sorted(adopted) == [0, 1, 1]


async def test_a_kid_flood_on_every_replica_costs_one_fetch_per_floor_fleet_wide(
    issuer: FakeIssuer, redis_server: RedisServer, gateway_factory: Start
) -> None:
    floor = 4.0
    replicas = start_fleet(
        gateway_factory, fleet_config(issuer, redis_server.url, min_refresh_seconds=floor)
    )

    def flood() -> list[str]:
        return [
            issuer.mint(
                good_claims(issuer, sub=uuid.uuid4().hex), headers={"kid": uuid.uuid4().hex}
            )
            for _ in range(300)
        ]

    floods = [flood() for _ in replicas]
    await asyncio.sleep(floor)  # past the floor: one refetch is allowed, fleet-wide
    before = sum(fetches(issuer))
    started = time.monotonic()
    answers = await asyncio.gather(
        *(loadclient.storm(gw.url, tokens, 50) for gw, tokens in zip(replicas, floods, strict=True))
    )
    assert all(not a.review["authenticated"] for batch in answers for a in batch)
    elapsed = time.monotonic() - started
    # One fetch per floor the flood lasted, whatever the number of replicas.
    assert 1 <= sum(fetches(issuer)) - before <= 1 + int(elapsed // floor)


def test_a_forged_shared_key_set_is_not_adopted(
    issuer: FakeIssuer, redis_server: RedisServer, gateway_factory: Start
) -> None:
    config = fleet_config(issuer, redis_server.url)
    first = gateway_factory(config, name="replica0")
    # Someone with Redis access swaps in their own key set, unsigned.
    attacker = new_key("attacker")
    forged = {
        "jwks": {"keys": [attacker.public_jwk()]},
        "fetched_at": 4_000_000_000,
        "fresh_until": 4_000_000_300,
    }
    client = redis.Redis.from_url(redis_server.url)
    client.set("authn-gw:shared:oidc:jwks", b"\0" * 32 + json.dumps(forged).encode())
    client.delete("authn-gw:shared:oidc:jwks-fetch")
    second = gateway_factory(config, name="replica1")
    claims = good_claims(issuer)
    forged_token = __import__("jwt").encode(
        claims, attacker.private, algorithm="RS256", headers={"kid": "attacker"}
    )
    for gw in (first, second):
        assert not authenticated(gw, forged_token)
        assert authenticated(gw, issuer.mint(claims))
    # The second replica fetched for itself instead.
    assert issuer.path_calls(JWKS_PATH) == 2


def test_with_redis_unreachable_each_replica_fetches_on_its_own(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}"
    replicas = [gateway_factory(fleet_config(issuer, dead), name=f"r{i}") for i in range(2)]
    for gw in replicas:
        # Without Redis a replica's local bucket starts empty (issue 14), so its first
        # fetch may be held back until the bucket refills: allow a few seconds for it.
        deadline = time.monotonic() + 10
        while not authenticated(gw, issuer.mint(good_claims(issuer))):
            assert time.monotonic() < deadline, "the replica never fetched the keys"
            time.sleep(0.25)
    assert issuer.path_calls(JWKS_PATH) == 2
