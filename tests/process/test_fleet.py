"""Issue 4's proofs: three real gateway processes sharing a real Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from authn_gateway.config import GatewayConfig, parse_config
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.layers.cache import CacheEntry
from authn_gateway.layers.cache.redis import EntryCodec
from authn_gateway.review.carryover import cache_namespace
from backends.base import Authenticated, UserInfo
from tests.support import loadclient
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer

SECRET = "fleet-test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiN"

Start = Callable[..., GatewayProcess]

# Seconds by which loopback and scheduling delays can shift an arrival at the fake IdP.
JITTER = 0.25


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def fleet_config(idp: FakeIdP, server: RedisServer, **backend: Any) -> dict[str, Any]:
    return {
        "secret": SECRET,
        "redis": {
            "url": server.url,
            "timeout_seconds": 0.5,
            "retry_seconds": 0.5,
            "breaker_sync_seconds": 0.1,
        },
        "backends": [userinfo_backend(idp, **backend)],
    }


def fleet(start: Start, config: dict[str, Any], n: int = 3) -> list[GatewayProcess]:
    return [start(config, name=f"replica{i}") for i in range(n)]


async def reviews(
    gw: GatewayProcess, tokens: list[str], concurrency: int = 50
) -> list[loadclient.Answer]:
    answers = await loadclient.storm(gw.url, tokens, concurrency)
    assert len(answers) == len(tokens)
    return answers


def metrics(gw: GatewayProcess) -> str:
    return httpx.get(f"{gw.url}/metrics").text


def test_fleet_mode_refuses_to_start_without_a_secret(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AUTHN_GATEWAY_SECRET", raising=False)
    text = (
        f"redis: {{url: '{redis_server.url}'}}\nbackends: [{{name: a, type: static, "
        "tokens: [{token: t, username: u}]}]\n"
    )
    with pytest.raises(Exception, match="secret: required when redis is configured"):
        parse_config(text, "gw.yaml")


async def test_a_cold_token_sent_to_every_replica_at_once_costs_one_call(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    fake_idp.configure(latency=0.5)
    replicas = fleet(gateway_factory, fleet_config(fake_idp, redis_server))
    results = await asyncio.gather(*(reviews(gw, ["good-alice"] * 30) for gw in replicas))
    assert fake_idp.calls == 1
    for answers in results:
        assert all(a.review["user"]["username"] == "alice" for a in answers)


async def test_breaker_opened_on_one_replica_makes_the_others_fail_fast(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    a, b, c = fleet(
        gateway_factory,
        fleet_config(fake_idp, redis_server, breaker={"fail_max": 3, "reset_timeout_seconds": 30}),
    )
    fake_idp.configure(status=500)
    await reviews(a, [f"good-a{i}" for i in range(3)], concurrency=1)
    await asyncio.sleep(0.5)  # a few sync periods
    fake_idp.reset_stats()
    for gw in (b, c):
        answers = await reviews(gw, [f"good-{gw.port}-{i}" for i in range(50)])
        assert all(x.review.get("error") == "idp: circuit breaker open" for x in answers)
        assert (
            metric_value(metrics(gw), "authn_gateway_breaker_state", backend="idp", state="open")
            == 1
        )
    assert fake_idp.calls == 0


async def test_fleet_call_rate_stays_within_one_bucket(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    replicas = fleet(
        gateway_factory, fleet_config(fake_idp, redis_server, bucket={"rate": 20, "burst": 5})
    )
    started = time.monotonic()
    while time.monotonic() - started < 2.0:
        await asyncio.gather(
            *(
                reviews(gw, [f"good-{gw.port}-{time.monotonic_ns()}-{i}" for i in range(40)])
                for gw in replicas
            )
        )
    arrivals = fake_idp.stats().arrivals
    elapsed = arrivals[-1] - arrivals[0]
    # Arrivals are admissions plus loopback jitter, which can shorten the measured
    # window; JITTER allows for it. Without a shared bucket three replicas would
    # let through about three times this.
    assert len(arrivals) <= 5 + 20 * (elapsed + JITTER) + 1
    assert len(arrivals) >= 20  # the flood did reach the budget


async def test_stopping_redis_mid_storm_fails_no_review_and_sharing_resumes(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    replicas = fleet(gateway_factory, fleet_config(fake_idp, redis_server))
    known = [f"good-user{i}" for i in range(20)]
    for gw in replicas:
        # Known users (the storm's premise), logged in one at a time: a fresh replica
        # starts from its share of concurrency.initial_limit, queues nobody before it
        # has measured the IdP, and measures the IdP's no-load latency at a quarter of
        # its limit (vegas.py), so a burst of cold logins now may be partly shed.
        warm = await reviews(gw, known, concurrency=1)
        loadclient.assert_all(warm, 200, authenticated=True)

    async def storm_all() -> list[loadclient.Answer]:
        batches = await asyncio.gather(*(reviews(gw, known * 5) for gw in replicas))
        return [a for batch in batches for a in batch]

    during = asyncio.ensure_future(storm_all())
    await asyncio.sleep(0.05)
    redis_server.stop()
    answers = await during
    answers += await storm_all()  # entirely without Redis
    loadclient.assert_all(answers, 200, authenticated=True)
    # Cold tokens still work, each replica on its own. Its local bucket starts empty at
    # the switch and refills at R/expected_replicas (issue 14), so a cold review in the
    # first few milliseconds of local mode may be held back, and only by the bucket.
    deadline = time.monotonic() + 1.0
    while True:
        review = (await reviews(replicas[0], ["good-newcomer"]))[0].review
        if review["authenticated"]:
            break
        assert review["error"] == "idp: outbound rate limit reached", review
        assert time.monotonic() < deadline, "the local bucket never refilled"
        await asyncio.sleep(0.01)
    assert review["user"]["username"] == "newcomer"
    assert metric_value(metrics(replicas[0]), "authn_gateway_redis_mode", mode="local") == 1
    # Counted, so that an episode shorter than a scrape interval still shows (and alerts).
    changes = "authn_gateway_redis_mode_changes_total"
    assert metric_value(metrics(replicas[0]), changes, to="local") == 1
    assert "falling back to local state" in replicas[0].logs()

    redis_server.start()
    await asyncio.sleep(1.5)  # retry_seconds is 0.5
    for gw in replicas:
        assert metric_value(metrics(gw), "authn_gateway_redis_mode", mode="shared") == 1
    assert metric_value(metrics(replicas[0]), changes, to="shared") == 1
    fake_idp.reset_stats()
    fake_idp.configure(latency=0.5)
    await asyncio.gather(*(reviews(gw, ["good-after-restart"] * 10) for gw in replicas))
    assert fake_idp.calls == 1


async def test_a_restarted_replica_answers_a_known_token_from_redis(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    config = fleet_config(fake_idp, redis_server)
    first = gateway_factory(config, name="first")
    assert (await reviews(first, ["good-alice"]))[0].review["authenticated"]
    first.stop()
    fake_idp.reset_stats()
    second = gateway_factory(config, name="second")
    answer = (await reviews(second, ["good-alice"]))[0]
    assert answer.review["user"]["username"] == "alice"
    assert fake_idp.calls == 0


async def test_tampered_and_transplanted_entries_are_ignored(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    [backend] = GatewayConfig.model_validate(fleet_config(fake_idp, redis_server)).backends
    namespace = cache_namespace(backend)  # keys are per backend and identity settings

    def cache_key(token: str) -> bytes:
        return TokenHasher(SECRET.encode()).cache_key(namespace, token, ())

    def redis_key(token: str) -> str:
        return f"authn-gw:cache:{cache_key(token).hex()}"

    r = redis.Redis.from_url(redis_server.url)
    now = time.time()
    codec = EntryCodec(TokenHasher(SECRET.encode()))
    admin = Authenticated(UserInfo("cluster-admin", groups=("system:masters",)))

    entry = CacheEntry(admin, now + 300, now + 300)
    # 1. A forged entry signed with the wrong secret.
    forger = EntryCodec(TokenHasher(b"guessed"))
    r.set(redis_key("good-mallory"), forger.encode(cache_key("good-mallory"), entry))
    # 2. A genuine entry for another key, copied under the attacker's key.
    r.set(redis_key("good-eve"), codec.encode(cache_key("good-admin"), entry))
    # 3. Garbage.
    r.set(redis_key("good-trudy"), b"not an entry")

    gw = gateway_factory(fleet_config(fake_idp, redis_server))
    for token, name in (("good-mallory", "mallory"), ("good-eve", "eve"), ("good-trudy", "trudy")):
        answer = (await reviews(gw, [token]))[0]
        assert answer.review["user"]["username"] == name  # the IdP's answer, not the forgery
    assert fake_idp.calls == 3
    assert metric_value(metrics(gw), "authn_gateway_cache_tampered_entries_total") == 3
    assert "fails its signature check" in gw.logs()


async def test_redis_holds_no_raw_token(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    gw = gateway_factory(fleet_config(fake_idp, redis_server))
    tokens = ["good-secretive-token-123", "bad-token-xyz-789"]
    await reviews(gw, tokens)
    r = redis.Redis.from_url(redis_server.url)
    keys = r.keys("*")
    assert keys
    dump = b"".join(k + (r.dump(k) or b"") for k in keys)
    for token in tokens:
        assert token.encode() not in dump


async def test_gateway_starts_and_serves_with_redis_down(
    fake_idp: FakeIdP, tmp_path: Path, gateway_factory: Start
) -> None:
    down = RedisServer(tmp_path)  # never started: connection refused
    gw = gateway_factory(fleet_config(fake_idp, down))
    answers = await reviews(gw, ["good-alice"] * 5)
    assert all(a.review["authenticated"] for a in answers)
    assert metric_value(metrics(gw), "authn_gateway_redis_mode", mode="local") == 1


async def test_half_open_probes_are_limited_fleet_wide(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    replicas = fleet(
        gateway_factory,
        fleet_config(
            fake_idp,
            redis_server,
            breaker={"fail_max": 2, "reset_timeout_seconds": 1.5, "half_open_probes": 1},
        ),
    )
    fake_idp.configure(status=500)
    await reviews(replicas[0], ["good-x1", "good-x2"], concurrency=1)
    await asyncio.sleep(0.4)
    fake_idp.reset_stats()
    # Every replica is flooded across the reset: the IdP sees one probe in total.
    fake_idp.configure(status=500, latency=0.3)
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        await asyncio.gather(
            *(
                reviews(gw, [f"good-{gw.port}-{time.monotonic_ns()}-{i}" for i in range(20)])
                for gw in replicas
            )
        )
    assert fake_idp.calls == 1
