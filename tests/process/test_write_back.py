"""Known users survive Redis losing its data: when sharing resumes (or a replica sees
that Redis came back empty), each replica writes its live local identities back, so
a pod started next, during an IdP outage, still serves them. Real gateway processes,
a real redis-server, the fake IdP; the IdP's own counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer

Start = Callable[..., GatewayProcess]

SECRET = "write-back-test-only-Hn4Wq8zR2mK6vT1xB9cY3uL7aE5sD0fGjPiNbV"

FAIL_MAX = 3

STALE = "authn-gateway.io/stale"

GAUGE = "authn_gateway_shared_cache_identities"

WRITTEN = "authn_gateway_cache_written_back_total"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def config(idp: FakeIdP, server: RedisServer, rate: int = 50) -> dict[str, Any]:
    return {
        "secret": SECRET,
        "redis": {
            "url": server.url,
            "timeout_seconds": 0.5,
            "retry_seconds": 0.3,
            "breaker_sync_seconds": 0.1,
            "write_back_per_second": rate,
            "count_shared_seconds": 0.3,
        },
        # Fresh for 1 s: the new pod below answers stale, as in a long outage.
        "cache": {"positive_ttl_seconds": 1, "max_stale_seconds": 3600},
        "logging": {"reviews": False},
        "backends": [
            userinfo_backend(idp, breaker={"fail_max": FAIL_MAX, "reset_timeout_seconds": 600})
        ],
    }


def metrics(gw: GatewayProcess) -> str:
    return httpx.get(f"{gw.url}/metrics", timeout=10).text


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(metrics(gw), name, **labels)


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def authenticated(gw: GatewayProcess, token: str) -> dict[str, Any]:
    status: dict[str, Any] = gw.review(token).json()["status"]
    assert status.get("authenticated"), status
    return status


def users(prefix: str, n: int) -> list[str]:
    return [f"good-{prefix}{i}" for i in range(n)]


def warm_two_replicas(
    idp: FakeIdP, server: RedisServer, start: Start
) -> tuple[GatewayProcess, GatewayProcess, list[str]]:
    """a knows 6 users, b 6 others and 2 of a's (read from Redis)."""
    a, b = start(config(idp, server), name="a"), start(config(idp, server), name="b")
    ours, theirs = users("a", 6), users("b", 6)
    for i, token in enumerate(ours):
        authenticated(a, token)
        if i < 2:
            authenticated(b, token)  # at once, while the entry is fresh in Redis
    for token in theirs:
        authenticated(b, token)
    assert idp.calls == 12
    wait_for(lambda: metric(a, GAUGE) == 12, "the identities counted in Redis")
    return a, b, ours + theirs


def new_pod_serves_them_during_an_outage(
    idp: FakeIdP, server: RedisServer, start: Start, known: list[str]
) -> GatewayProcess:
    idp.configure(status=503)
    idp.reset_stats()
    c = start(config(idp, server), name="c")
    for token in known:
        user = authenticated(c, token)["user"]
        assert user["username"] == token.removeprefix("good-")
        assert user["extra"][STALE] == ["true"]
    # The fleet's breaker opened after FAIL_MAX failures; everything else came from Redis.
    assert idp.calls <= FAIL_MAX
    stranger = c.review("good-stranger").json()["status"]
    assert not stranger["authenticated"]  # the outage is real
    return c


def test_after_flushall_replicas_write_back_and_a_new_pod_serves_known_users(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    a, b, known = warm_two_replicas(fake_idp, redis_server, gateway_factory)
    redis.Redis.from_url(redis_server.url).flushall()

    # No Redis call failed: the replicas see the emptied Redis by its marker key. Each
    # replica offers every user it knows: 12 + 2 offers, the two replicas' own pace.
    def offered(result: str) -> float:
        return metric(a, WRITTEN, result=result) + metric(b, WRITTEN, result=result)

    wait_for(lambda: offered("written") + offered("kept") == len(known) + 2, "the write-back")
    # The two users both replicas knew were written once: the second found them there.
    assert (offered("written"), offered("kept")) == (len(known), 2)
    wait_for(lambda: metric(a, GAUGE) == len(known), "the gauge to count them again")
    assert "the shared cache was emptied" in a.wait_for_log("shared cache was emptied")
    assert metric(a, "authn_gateway_redis_mode_changes_total", to="local") == 0

    c = new_pod_serves_them_during_an_outage(fake_idp, redis_server, gateway_factory, known)
    assert metric(c, GAUGE) == len(known)


def test_after_a_redis_restart_replicas_write_back_and_a_new_pod_serves_known_users(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    a, b, known = warm_two_replicas(fake_idp, redis_server, gateway_factory)
    redis_server.stop()
    wait_for(
        lambda: metric(a, "authn_gateway_redis_mode", mode="local") == 1,
        "a replica to notice Redis is gone",
    )
    redis_server.start()  # memory only: it comes back empty
    wait_for(
        lambda: (
            metric(a, WRITTEN, result="written") + metric(b, WRITTEN, result="written")
            == len(known)
        ),
        "the write-back",
    )
    wait_for(lambda: metric(b, GAUGE) == len(known), "the gauge to count them again")
    for gw in (a, b):
        assert metric(gw, "authn_gateway_redis_mode", mode="shared") == 1
        assert "wrote back" in gw.wait_for_log("wrote back")

    new_pod_serves_them_during_an_outage(fake_idp, redis_server, gateway_factory, known)


def test_a_write_back_stops_when_redis_fails_again_and_finishes_when_it_returns(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    # 10 identities a second: 100 take 10 s, time enough to fail Redis in the middle.
    gw = gateway_factory(config(fake_idp, redis_server, rate=10))
    known = users("u", 100)
    for token in known:
        authenticated(gw, token)
    client = redis.Redis.from_url(redis_server.url)
    wait_for(lambda: metric(gw, GAUGE) == 100, "the identities counted in Redis")
    client.flushall()
    wait_for(lambda: metric(gw, WRITTEN, result="written") > 0, "the write-back to begin")
    redis_server.stop()
    wait_for(lambda: "failed again during the write-back" in gw.logs(), "the write-back to stop")
    stopped_at = metric(gw, WRITTEN, result="written")
    assert 0 < stopped_at < 100
    redis_server.start()  # empty again: everything is written back once more
    wait_for(
        lambda: metric(gw, WRITTEN, result="written") == stopped_at + 100,
        "the write-back to finish",
        timeout=30,
    )
    assert len(client.keys("authn-gw:cache:*")) == 100
    # Nothing was asked of the IdP for any of it.
    assert fake_idp.calls == 100


def test_a_pod_restarted_soon_after_a_flushall_during_an_outage_serves_known_users(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    # Issue 32: 2 replicas, 5 warm users, FLUSHALL, the IdP refusing connections, one pod
    # restarted a little later: it served 0 of 5 while the shared cache stayed empty
    # until each replica's next count (count_shared_seconds, 15 s by default, kept
    # here). The epoch marker, read every second, has the others write back first.
    settings = config(fake_idp, redis_server)
    settings["redis"]["count_shared_seconds"] = 15
    # Fresh throughout: the warm replicas never read Redis for these users, so only the
    # epoch check (not a read-repair) can notice the loss.
    settings["cache"]["positive_ttl_seconds"] = 300
    a, b = gateway_factory(settings, name="a"), gateway_factory(settings, name="b")
    known = users("w", 5)
    for token in known:
        authenticated(a, token)
        authenticated(b, token)
    assert fake_idp.calls == 5
    time.sleep(1.5)  # both have read the marker once
    redis.Redis.from_url(redis_server.url).flushall()
    fake_idp.configure(refuse=True)
    time.sleep(2.5)  # the restart comes well inside the old 15 s window
    b.stop()
    c = gateway_factory(settings, name="c")
    served = [t for t in known if c.review(t).json()["status"].get("authenticated")]
    assert served == known, f"served {len(served)}/{len(known)} after the restart"
    assert "the shared cache was emptied" in a.wait_for_log("shared cache was emptied")
    assert metric(a, "authn_gateway_redis_mode_changes_total", to="local") == 0
