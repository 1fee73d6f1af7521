"""Issue 18, item 5: operator overrides of a breaker are fleet-wide, expire, survive
reloads and restarts, never close a breaker that real failures opened, and a forced-closed
breaker still bounds the wait of known users. Real gateway processes, a real Redis, the
fake IdP's own call counts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer

SECRET = "override-test-only-Lr5Xq9Wm2Tz7Kc4Nv8Bh1Dy6Fs3Gp0Ju"

ADMIN_TOKEN = "override-admin-test-only-Kq4Zp9Xw2Lm7Vt1Nc8Bh3Dy6Fs5Gj0Ru"

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

OPEN_ERROR = "idp: circuit breaker open"

Start = Callable[..., GatewayProcess]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def config(idp: FakeIdP, redis: RedisServer | None = None, **backend: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "secret": SECRET,
        "admin": {"enabled": True, "token": ADMIN_TOKEN},
        "backends": [userinfo_backend(idp, **backend)],
    }
    if redis is not None:
        # The default poll (1 s) is the documented bound when a message is lost; pub/sub
        # usually delivers within milliseconds.
        cfg["redis"] = {"url": redis.url, "timeout_seconds": 0.5, "retry_seconds": 0.5}
    return cfg


def admin(gw: GatewayProcess, *args: str) -> tuple[int, Any, str]:
    """``authn-gateway admin --url GW ARGS...``: exit code, JSON answer, stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "admin", "--url", gw.url, "--as", "oncall", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "AUTHN_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN},
    )
    answer = orjson.loads(result.stdout) if result.stdout.strip() else None
    return result.returncode, answer, result.stderr


def post(gw: GatewayProcess, action: str, body: Any = None, backend: str = "idp") -> httpx.Response:
    content = orjson.dumps(body) if body is not None else None
    return httpx.post(
        f"{gw.url}/admin/breakers/{backend}/{action}", headers=ADMIN, content=content, timeout=10
    )


def listing(gw: GatewayProcess) -> dict[str, Any]:
    response = httpx.get(f"{gw.url}/admin/breakers", headers=ADMIN, timeout=10)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def state(gw: GatewayProcess) -> str:
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    for name in ("closed", "open", "half-open", "forced_open", "forced_closed"):
        if metric_value(text, "authn_gateway_breaker_state", backend="idp", state=name) == 1:
            return name
    raise AssertionError("no breaker state exported")


def wait_until(check: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``check``; the time it took. Fails past ``seconds``."""
    started = time.monotonic()
    while not check():
        elapsed = time.monotonic() - started
        assert elapsed < seconds, f"{what}: not within {seconds}s"
        time.sleep(0.05)
    return time.monotonic() - started


def error_of(gw: GatewayProcess, token: str) -> str | None:
    response = gw.review(token)
    assert response.status_code == 200
    status: dict[str, Any] = response.json()["status"]
    return status.get("error")


def reload(gw: GatewayProcess, edit: Callable[[dict[str, Any]], None] | None = None) -> None:
    """SIGHUP, after ``edit`` changed the config file; returns once the reload is logged."""
    if edit is not None:
        cfg = yaml.safe_load(gw.config_path.read_text())
        edit(cfg)
        gw.config_path.write_text(yaml.safe_dump(cfg))
    before = gw.logs().count("config reloaded")
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gw.logs().count("config reloaded") > before, 15, "the reload")


def test_force_open_on_one_replica_holds_on_every_replica_reload_and_restart(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server)
    a, b, c = (gateway_factory(cfg, name=f"replica{i}") for i in range(3))

    code, answer, _ = admin(a, "force-open", "idp", "--seconds", "600")
    assert code == 0
    assert answer["state"] == "forced_open" and answer["stored_in"] == "redis"
    assert answer["override"]["by"] == "oncall@127.0.0.1"
    # Within the documented bound (pub/sub, else the 1 s poll), with a wide margin.
    for gw in (a, b, c):
        wait_until(lambda gw=gw: state(gw) == "forced_open", 3.0, f"forced_open on {gw.port}")
    fake_idp.reset_stats()
    for gw in (a, b, c):
        assert all(error_of(gw, f"good-{gw.port}-{i}") == OPEN_ERROR for i in range(5))
    assert fake_idp.calls == 0

    # A reload builds new breakers: the override is not theirs, it stays.
    reload(b)
    assert state(b) == "forced_open"
    assert error_of(b, "good-after-reload") == OPEN_ERROR
    # A pod restart: the new process reads the fleet's override before its first review.
    c.stop()
    c2 = gateway_factory(cfg, name="replica2-restarted")
    assert error_of(c2, "good-after-restart") == OPEN_ERROR
    assert state(c2) == "forced_open"
    assert fake_idp.calls == 0

    # Release from yet another replica: the fleet calls the IdP again.
    code, answer, _ = admin(c2, "release", "idp")
    assert code == 0 and answer["state"] == "closed" and answer["override"] is None
    for gw in (a, b, c2):
        wait_until(lambda gw=gw: state(gw) == "closed", 3.0, f"closed on {gw.port}")
        assert error_of(gw, f"good-released-{gw.port}") is None
    assert fake_idp.calls == 3


def test_admin_listing_shows_every_replicas_view_and_the_shared_override(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server)
    replicas = [gateway_factory(cfg, name=f"replica{i}") for i in range(3)]
    assert post(replicas[0], "force-closed", {"seconds": 900, "by": "alice"}).status_code == 200

    def every_view_forced() -> bool:
        views = listing(replicas[1])["replicas"]
        return len(views) == 3 and all(
            v["backends"]["idp"]["override"] == "forced_closed" for v in views
        )

    wait_until(every_view_forced, 5.0, "three views showing forced_closed")
    body = listing(replicas[2])
    assert body["stored_in"] == "redis"
    assert len({v["replica"] for v in body["replicas"]}) == 3
    assert body["replica"] in {v["replica"] for v in body["replicas"]}
    for view in body["replicas"]:
        idp = view["backends"]["idp"]
        assert idp["state"] == "forced_closed" and idp["machine_state"] == "closed"
        assert idp["expires_at"] > time.time() + 800
    shared = body["backends"]["idp"]["override"]
    assert shared["override"] == "forced_closed" and shared["by"] == "alice@127.0.0.1"
    assert 800 < shared["expires_in_seconds"] <= 900

    # A replica that stops leaves the listing once its view expires (a few seconds).
    replicas[0].stop()
    wait_until(lambda: len(listing(replicas[1])["replicas"]) == 2, 10.0, "the view expiring")


def test_an_override_expires_on_every_replica_and_renewing_keeps_its_start(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server)
    a, b = (gateway_factory(cfg, name=f"replica{i}") for i in range(2))
    first = post(a, "force-open", {"seconds": 60}).json()["override"]
    renewed = post(b, "force-open", {"seconds": 3}).json()["override"]
    # The same override again renews it: a new expiry, the same start (its true age).
    assert renewed["since"] == first["since"]
    assert renewed["expires_at"] < first["expires_at"]
    wait_until(lambda: state(a) == "forced_open", 3.0, "forced_open on a")
    text = httpx.get(f"{a.url}/metrics").text
    assert (
        metric_value(text, "authn_gateway_breaker_override", backend="idp", override="forced_open")
        == 1
    )
    expiry = metric_value(
        text, "authn_gateway_breaker_override_expiry_timestamp_seconds", backend="idp"
    )
    assert abs(expiry - renewed["expires_at"]) < 1
    since = metric_value(
        text, "authn_gateway_breaker_override_since_timestamp_seconds", backend="idp"
    )
    assert abs(since - first["since"]) < 1

    fake_idp.reset_stats()
    assert error_of(a, "good-early") == OPEN_ERROR
    assert fake_idp.calls == 0
    # Expired: back to the machine's own state, closed, on both, with no call to release.
    for gw in (a, b):
        wait_until(lambda gw=gw: state(gw) == "closed", 8.0, f"expiry on {gw.port}")
        assert error_of(gw, f"good-expired-{gw.port}") is None
    assert fake_idp.calls == 2
    text = httpx.get(f"{b.url}/metrics").text
    assert metric_value(text, "authn_gateway_breaker_override", backend="idp", override="none") == 1
    assert (
        metric_value(text, "authn_gateway_breaker_override_expiry_timestamp_seconds", backend="idp")
        == 0
    )
    assert listing(b)["backends"]["idp"]["override"] is None


def test_release_does_not_close_a_breaker_that_real_failures_opened(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server, breaker={"fail_max": 3, "reset_timeout_seconds": 60})
    a, b, c = (gateway_factory(cfg, name=f"replica{i}") for i in range(3))
    fake_idp.configure(status=500)
    for i in range(3):
        error_of(a, f"good-fail-{i}")
    for gw in (a, b, c):
        wait_until(lambda gw=gw: state(gw) == "open", 3.0, f"open on {gw.port}")

    assert post(b, "force-open").status_code == 200
    for gw in (a, b, c):
        wait_until(lambda gw=gw: state(gw) == "forced_open", 3.0, f"forced on {gw.port}")
    answer = post(c, "release").json()
    # The machine is still open from the failures: a release returns there, not to closed.
    assert answer["state"] == "open" and answer["machine_state"] == "open"
    fake_idp.reset_stats()
    for gw in (a, b, c):
        wait_until(lambda gw=gw: state(gw) == "open", 3.0, f"open again on {gw.port}")
        assert all(error_of(gw, f"good-{gw.port}-{i}") == OPEN_ERROR for i in range(5))
    assert fake_idp.calls == 0


def test_in_memory_release_returns_to_the_open_state_and_reloads_keep_the_override(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(fake_idp, breaker={"fail_max": 3, "reset_timeout_seconds": 60}))
    fake_idp.configure(status=500)
    for i in range(3):
        error_of(gw, f"good-fail-{i}")
    assert state(gw) == "open"
    answer = post(gw, "force-closed").json()
    assert answer["stored_in"] == "memory" and answer["machine_state"] == "open"
    fake_idp.reset_stats()
    error_of(gw, "good-forced-closed")
    assert fake_idp.calls == 1  # forced closed: the IdP is asked, whatever its state

    reload(gw)
    assert state(gw) == "forced_closed"
    # Released: the machine is still open from the failures, so no call goes out.
    assert post(gw, "release").json()["state"] == "open"
    fake_idp.reset_stats()
    assert error_of(gw, "good-after-release") == OPEN_ERROR
    assert fake_idp.calls == 0

    # A reload that changes the breaker's own settings builds a new breaker: the
    # override is the operator's, by backend name, and stays in force.
    post(gw, "force-open")

    def new_breaker(cfg: dict[str, Any]) -> None:
        cfg["backends"][0]["breaker"]["fail_max"] = 4

    reload(gw, new_breaker)
    assert state(gw) == "forced_open"
    fake_idp.configure(status=None)
    assert error_of(gw, "good-after-second-reload") == OPEN_ERROR
    assert fake_idp.calls == 0
    assert post(gw, "release").json()["state"] == "closed"  # the new machine starts closed
    assert error_of(gw, "good-after-second-release") is None
    assert fake_idp.calls == 1


def test_forced_closed_with_a_hanging_idp_answers_known_users_stale_within_the_bound(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    call_timeout = 4.0
    gw = gateway_factory(
        {
            **config(
                fake_idp,
                timeouts={
                    "connect_seconds": 1.0,
                    "read_seconds": call_timeout,
                    "total_seconds": call_timeout,
                },
                cache={"positive_ttl_seconds": 2, "max_stale_seconds": 600},
                breaker={"forced_closed_stale_wait_seconds": 0.5, "fail_max": 3},
            ),
            "review_deadline_seconds": 6,
        }
    )
    for user in ("alice", "bob"):
        assert gw.review(f"good-{user}").json()["status"]["authenticated"] is True
    time.sleep(2.2)  # past the positive TTL: only stale entries remain
    assert post(gw, "force-closed").status_code == 200
    fake_idp.configure(hang=True)
    fake_idp.reset_stats()

    started = time.monotonic()
    status = gw.review("good-alice", timeout=30).json()["status"]
    waited = time.monotonic() - started
    assert status["authenticated"] is True
    assert status["user"]["extra"]["authn-gateway.io/stale"] == ["true"]
    # The bound is 0.5 s; the call's own timeout 4 s. Generous margin, far below it.
    assert waited < call_timeout / 2
    # Forced closed means the IdP was asked: one call, still hanging in the background.
    wait_until(lambda: fake_idp.calls == 1, 2.0, "the call reaching the IdP")

    # Again while that call hangs: joins it (no second call), stale again.
    status = gw.review("good-alice", timeout=30).json()["status"]
    assert status["user"]["extra"]["authn-gateway.io/stale"] == ["true"]
    assert fake_idp.calls == 1
    # A token nobody knows has no stale answer: it waits for the call, and gets an error.
    unknown = gw.review("good-carol", timeout=30).json()["status"]
    assert unknown["authenticated"] is False and "error" in unknown

    # A slow (not hung) IdP: the known user is answered stale at the bound, and the call
    # that went on in the background refreshed the entry: the next review is a fresh hit.
    fake_idp.configure(hang=False, latency=1.5)
    time.sleep(call_timeout)  # the hung calls time out
    fake_idp.reset_stats()
    status = gw.review("good-bob", timeout=30).json()["status"]
    assert status["user"]["extra"]["authn-gateway.io/stale"] == ["true"]
    wait_until(lambda: fake_idp.calls == 1, 3.0, "bob's refresh")

    def fresh() -> bool:
        status = gw.review("good-bob", timeout=30).json()["status"]
        assert status["authenticated"] is True
        return "authn-gateway.io/stale" not in status["user"].get("extra", {})

    # Reviews meanwhile join the refresh (stale at the bound); then it is a fresh hit.
    wait_until(fresh, 5.0, "the refreshed entry")
    assert fake_idp.calls == 1


def test_bad_override_requests_are_refused_with_a_clear_400_and_change_nothing(
    fake_idp: FakeIdP, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(fake_idp))
    url = f"{gw.url}/admin/breakers"
    cases: list[tuple[str, bytes | None, str]] = [
        ("explode", None, "action must be force-open, force-closed or release"),
        ("force-open", b'{"seconds": -5}', "seconds: must be a whole number from 1 to 86400"),
        ("force-open", b'{"seconds": 0}', "seconds: must be a whole number"),
        ("force-open", b'{"seconds": 1e12}', "seconds: must be a whole number"),
        ("force-open", b'{"seconds": 99999999999999999999}', "seconds: must be a whole number"),
        ("force-open", b'{"seconds": 1.5}', "seconds: must be a whole number"),
        ("force-open", b'{"seconds": "600"}', "seconds: must be a whole number"),
        ("force-open", b'{"seconds": true}', "seconds: must be a whole number"),
        ("force-closed", b'{"seconds": 86401}', "seconds: must be a whole number"),
        ("force-open", b"[600]", "body must be a JSON object"),
        ("force-open", b"{not json", "body is not valid JSON"),
        ("force-open", b'{"secs": 600}', "unknown field 'secs'"),
        ("force-open", b'{"by": "x\\u0000y"}', "by: must be a name"),
        ("release", b'{"seconds": 60}', "seconds: a release takes no seconds"),
    ]
    for action, body, message in cases:
        response = httpx.post(f"{url}/idp/{action}", headers=ADMIN, content=body)
        assert response.status_code == 400, (action, body, response.text)
        assert message in response.json()["message"], (action, body, response.text)
    # Too large: 413, decided before the body is read (tests/process/test_admin_api.py).
    response = httpx.post(f"{url}/idp/force-open", headers=ADMIN, content=b"{" + b" " * 5000 + b"}")
    assert response.status_code == 413, response.text
    assert "body larger than 4096 bytes" in response.json()["message"], response.text
    assert httpx.post(f"{url}/nope/force-open", headers=ADMIN).status_code == 404

    # Nothing changed: no override, closed, the IdP is asked.
    assert listing(gw)["backends"]["idp"]["override"] is None
    assert state(gw) == "closed"
    assert error_of(gw, "good-alice") is None
    assert fake_idp.calls == 1
    assert "Traceback" not in gw.logs()

    # The CLI says what is wrong, and exits 1.
    code, _, stderr = admin(gw, "force-open", "idp", "--seconds", "-1")
    assert code == 1 and "seconds: must be a whole number" in stderr


def test_overrides_need_the_admin_token(fake_idp: FakeIdP, gateway_factory: Start) -> None:
    gw = gateway_factory(config(fake_idp))
    url = f"{gw.url}/admin/breakers"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}):
        assert httpx.get(url, headers=headers).status_code in (401, 429)
        for action in ("force-open", "force-closed", "release"):
            response = httpx.post(f"{url}/idp/{action}", headers=headers)
            # Past 10 failures from one address: 429 unchecked (tests/unit/test_admin_auth.py).
            assert response.status_code in (401, 429), response.text
            assert ADMIN_TOKEN not in response.text
    assert state(gw) == "closed"
    assert error_of(gw, "good-alice") is None
    assert fake_idp.calls == 1


def test_the_cli_lists_forces_and_releases(fake_idp: FakeIdP, gateway_factory: Start) -> None:
    gw = gateway_factory(config(fake_idp))
    code, answer, _ = admin(gw, "force-closed", "idp", "--seconds", "120")
    assert code == 0 and answer["state"] == "forced_closed"
    assert 100 < answer["override"]["expires_in_seconds"] <= 120
    code, answer, _ = admin(gw, "breakers")
    assert code == 0
    assert answer["backends"]["idp"]["override"]["override"] == "forced_closed"
    assert [v["backends"]["idp"]["state"] for v in answer["replicas"]] == ["forced_closed"]
    code, answer, _ = admin(gw, "release", "idp")
    assert code == 0 and answer["state"] == "closed"
    code, answer, stderr = admin(gw, "force-open", "nope")
    assert code == 1 and "HTTP 404" in stderr


def test_an_override_set_while_redis_is_down_reaches_the_fleet_when_it_is_back(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    cfg = config(fake_idp, redis_server)
    a, b = (gateway_factory(cfg, name=f"replica{i}") for i in range(2))
    redis_server.stop()
    answer = post(a, "force-open").json()
    assert answer["state"] == "forced_open" and answer["stored_in"] == "memory"
    assert "Redis unreachable" in answer["message"]
    fake_idp.reset_stats()
    assert error_of(a, "good-during-redis-outage") == OPEN_ERROR
    redis_server.start()
    wait_until(lambda: state(b) == "forced_open", 10.0, "the override reaching b")
    assert error_of(b, "good-after-redis-back") == OPEN_ERROR
    assert state(a) == "forced_open"
    assert fake_idp.calls == 0
