"""Issue 18, item 4, on real processes: the stale limit is computed when an entry is
read, from its last successful check and the *running* config, so an operator who
raises ``max_stale_seconds`` and reloads during an IdP outage keeps known users in,
and one who lowers it cuts them off at once. With and without Redis; and entries
written by the previous version are still served (a rolling upgrade logs nobody out).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis
import yaml

from authn_gateway.config import GatewayConfig
from authn_gateway.keyed_hashes import TokenHasher
from authn_gateway.review.carryover import cache_namespace
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer
from tests.support.stale_limit_helpers import SECRET

STALE = "authn-gateway.io/stale"

Start = Callable[..., GatewayProcess]

TTL = 1.0

# The stale limit the gateways start with: short, so that the test sees it end.
SHORT = 4.0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def config(idp: FakeIdP, server: RedisServer | None, max_stale: float) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "secret": SECRET,
        "backends": [
            userinfo_backend(
                idp,
                cache={"positive_ttl_seconds": TTL, "max_stale_seconds": max_stale},
                # Open after three failures and stay open: every answer below is the
                # cache's, and the IdP's own count proves it.
                breaker={"fail_max": 3, "reset_timeout_seconds": 600, "half_open_probes": 1},
            )
        ],
    }
    if server is not None:
        cfg["redis"] = {
            "url": server.url,
            "timeout_seconds": 0.5,
            "retry_seconds": 0.5,
            "breaker_sync_seconds": 0.1,
        }
    return cfg


def review(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200
    status: dict[str, Any] = response.json()["status"]
    return status


def is_stale(status: dict[str, Any], username: str) -> bool:
    return (
        status.get("authenticated") is True
        and status["user"]["username"] == username
        and status["user"].get("extra", {}).get(STALE) == ["true"]
    )


def scrape(gw: GatewayProcess) -> str:
    return httpx.get(f"{gw.url}/metrics").text


def reload(gw: GatewayProcess, cfg: dict[str, Any]) -> None:
    """Write ``cfg`` over the gateway's file and SIGHUP it, as the runbook says."""
    before = gw.logs().count("config reloaded")
    server = {**cfg.get("server", {}), "host": "127.0.0.1", "port": gw.port}
    gw.config_path.write_text(yaml.safe_dump({**cfg, "server": server}))
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 15
    while gw.logs().count("config reloaded") == before:
        assert time.monotonic() < deadline, f"no reload:\n{gw.logs()}"
        time.sleep(0.02)


def with_max_stale(cfg: dict[str, Any], seconds: float) -> dict[str, Any]:
    backend = {**cfg["backends"][0]}
    backend["cache"] = {**backend["cache"], "max_stale_seconds": seconds}
    return {**cfg, "backends": [backend]}


def break_idp(idp: FakeIdP, gw: GatewayProcess) -> int:
    """The IdP fails; three cold tokens open the breaker. The IdP's count then."""
    idp.configure(status=500)
    for i in range(3):
        assert "error" in review(gw, f"good-cold{i}")
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_breaker_state", backend="idp", state="open") == 1
    return idp.calls


def sleep_until(when: float) -> None:
    time.sleep(max(0.0, when - time.time()))


@pytest.mark.parametrize("shared", [False, True], ids=["no-redis", "redis"])
def test_raising_max_stale_mid_outage_keeps_known_users_and_lowering_it_cuts_them(
    fake_idp: FakeIdP,
    gateway_factory: Start,
    tmp_path: Path,
    shared: bool,
    request: pytest.FixtureRequest,
) -> None:
    server: RedisServer | None = request.getfixturevalue("redis_server") if shared else None
    cfg = config(fake_idp, server, SHORT)
    gw = gateway_factory(cfg)
    checked = time.time()
    for user in ("alice", "bob"):
        assert review(gw, f"good-{user}")["user"]["username"] == user
    assert fake_idp.calls == 2
    # Entries are fresh until at most checked + TTL (+ the two reviews' own time).
    fresh_end = time.time() + TTL

    calls = break_idp(fake_idp, gw)
    sleep_until(fresh_end + 0.2)
    assert is_stale(review(gw, "good-alice"), "alice")

    # Near the end of the stale limit, the operator raises it and reloads.
    reload(gw, with_max_stale(cfg, 600))
    assert "kept cache, breaker and bucket of backends [idp]" in gw.logs()
    assert "start empty" not in gw.logs()
    assert time.time() < fresh_end + SHORT - 0.5, "the reload took too long to prove anything"
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_cache_max_stale_seconds", backend="idp") == 600

    # Past the old limit: both are still served, stale, and the IdP is not asked.
    sleep_until(fresh_end + SHORT + 1.0)
    for user in ("alice", "bob"):
        assert is_stale(review(gw, f"good-{user}"), user)
    assert fake_idp.calls == calls
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_stale_answers_total", backend="idp") >= 3
    # The ages served include ones past the old limit.
    over = metric_value(text, "authn_gateway_stale_age_seconds_bucket", backend="idp", le="1.0")
    count = metric_value(text, "authn_gateway_stale_age_seconds_count", backend="idp")
    assert count > over
    last = metric_value(text, "authn_gateway_backend_last_success_timestamp_seconds", backend="idp")
    assert checked <= last < fresh_end  # the warm-up's answers; failures do not move it

    if server is not None:
        # The Redis tier kept the entries past the old limit: a replica started now,
        # with an empty local cache, serves them too (the fleet's breaker is open).
        other = gateway_factory(with_max_stale(cfg, 600), name="late-replica")
        assert is_stale(review(other, "good-bob"), "bob")
        assert fake_idp.calls == calls

    # The leaked-token runbook: lower it and reload; cut off at the next review.
    reload(gw, with_max_stale(cfg, 1))
    for user in ("alice", "bob"):
        status = review(gw, f"good-{user}")
        assert status["authenticated"] is False
        assert status["error"] == "idp: circuit breaker open"
    assert fake_idp.calls == calls
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_cache_max_stale_seconds", backend="idp") == 1

    # Lowering hides the entries, it does not delete them: raised again, they serve again.
    reload(gw, with_max_stale(cfg, 600))
    assert is_stale(review(gw, "good-alice"), "alice")


def test_a_refused_reload_keeps_the_running_stale_limit(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    """max_stale above keep_stale is refused with a message naming both; the running
    config (and its gauge) stays."""
    cfg = config(fake_idp, None, 60)
    gw = gateway_factory(cfg)
    before = gw.logs().count("config reload refused")
    backend = {**cfg["backends"][0], "cache": {"max_stale_seconds": 100_000}}
    gw.config_path.write_text(
        yaml.safe_dump(
            {**cfg, "backends": [backend], "server": {"host": "127.0.0.1", "port": gw.port}}
        )
    )
    gw.proc.send_signal(signal.SIGHUP)
    logs = gw.wait_for_log("config reload refused")
    assert logs.count("config reload refused") == before + 1
    assert "max_stale_seconds: 100000 is above keep_stale_seconds (86400)" in logs
    assert "Traceback" not in logs
    assert metric_value(scrape(gw), "authn_gateway_cache_max_stale_seconds", backend="idp") == 60


def previous_version_value(key: bytes, doc: dict[str, Any]) -> bytes:
    """A cache value exactly as the previous version wrote it (no "l" field)."""
    payload = orjson.dumps(doc)
    return TokenHasher(SECRET.encode()).sign(key + payload) + payload


def test_entries_written_by_the_previous_version_are_served_during_a_rolling_upgrade(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server, 3600)
    [backend] = GatewayConfig.model_validate(cfg).backends
    hasher = TokenHasher(SECRET.encode())
    r = redis.Redis.from_url(redis_server.url)
    now = time.time()

    def put_old(token: str, username: str, fresh_until: float, stale_until: float) -> None:
        key = hasher.cache_key(cache_namespace(backend), token, ())
        doc = {"f": fresh_until, "s": stale_until, "t": hasher.token_id(token), "k": "a"}
        doc |= {"u": username, "i": "", "g": ["old-writer"], "x": {}, "e": None}
        r.set(f"authn-gw:cache:{key.hex()}", previous_version_value(key, doc), px=600_000)

    put_old("good-carol", "carol", now + 300, now + 3900)  # fresh
    put_old("good-dave", "dave", now - 10, now + 3590)  # past its TTL, within its limit
    gw = gateway_factory(cfg)
    carol = review(gw, "good-carol")
    assert carol["authenticated"] is True and carol["user"]["groups"] == ["old-writer"]
    assert fake_idp.calls == 0  # a fresh hit

    fake_idp.configure(status=500)
    assert is_stale(review(gw, "good-dave"), "dave")
    assert fake_idp.calls == 1  # asked once, failed, served the old entry
    text = scrape(gw)
    assert metric_value(text, "authn_gateway_cache_tampered_entries_total") == 0
