"""Stale markers, fleet-wide eviction, the deny list and reloads, on real processes.

Two ``authn-gateway serve`` processes share one real redis-server started here; the
same guarantees are checked on one replica without Redis (deny list in a file). The
operator's side is the real ``authn-gateway admin`` CLI talking to the running gateway.
"""

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

from backends.base import CREDENTIAL_ID_KEY
from tests.support.backend_configs import userinfo_backend
from tests.support.fakes.idp import FakeIdP
from tests.support.fakes.issuer import FakeIssuer
from tests.support.procs import GatewayProcess, metric_value, start_gateway
from tests.support.redis_server import RedisServer

ADMIN_TOKEN = "admin-test-only-Rt6Yq1Lw8Km3Vz9Nc2Bh5Dx7Fs4Gj0PuE"

STALE = "authn-gateway.io/stale"

BACKEND = "authn-gateway.io/backend"

TTL = 1.0


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def config(idp: FakeIdP, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    backend = userinfo_backend(
        idp,
        cache={"positive_ttl_seconds": TTL, "negative_ttl_seconds": TTL, "max_stale_seconds": 600},
    )
    return {
        "secret": "revoke-test-only-Qx7Lm2Vb9Tn4Rk8Wc1Zp5Hs3Jd6Fg0Ya",
        "admin": {"enabled": True, "token": ADMIN_TOKEN},
        "server": {"audit_log": str(tmp_path / f"audit-{len(os.listdir(tmp_path))}.jsonl")},
        "backends": [backend],
        **extra,
    }


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


def status(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()["status"]
    return result


def is_stale(review: dict[str, Any]) -> bool:
    return bool(review.get("authenticated")) and review["user"].get("extra", {}).get(STALE) == [
        "true"
    ]


def token_id_of(gw: GatewayProcess, username: str) -> str:
    """The token id as an operator finds it: in the gateway's audit log (written in batches)."""
    found: list[str] = []

    def look() -> bool:
        audit = Path(gw.extra["audit"])
        lines = audit.read_text().splitlines() if audit.exists() else []
        for line in lines:
            doc = orjson.loads(line)
            if doc.get("msg") == "audit" and doc.get("username") == username:
                found.append(str(doc["token"]))
                return True
        return False

    wait_until(look, 5.0, f"an audit line for {username}")
    return found[0]


def wait_until(check: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``check``; the time it took. Fails past ``seconds``."""
    started = time.monotonic()
    while not check():
        elapsed = time.monotonic() - started
        assert elapsed < seconds, f"{what}: not within {seconds}s"
        time.sleep(0.02)
    return time.monotonic() - started


def launch(
    cfg: dict[str, Any], tmp_path: Path, started: list[GatewayProcess], **kw: Any
) -> GatewayProcess:
    gw = start_gateway(cfg, tmp_path, **kw)
    gw.extra["audit"] = cfg["server"]["audit_log"]
    started.append(gw)
    return gw


@pytest.fixture
def gateways() -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    yield started
    for gw in started:
        gw.stop()


def fleet(
    fake_idp: FakeIdP, tmp_path: Path, redis_server: RedisServer, started: list[GatewayProcess]
) -> tuple[GatewayProcess, GatewayProcess]:
    redis = {"url": redis_server.url, "timeout_seconds": 0.5}
    a = launch(config(fake_idp, tmp_path, redis=redis), tmp_path, started, name="a")
    b = launch(config(fake_idp, tmp_path, redis=redis), tmp_path, started, name="b")
    return a, b


def single(
    fake_idp: FakeIdP, tmp_path: Path, started: list[GatewayProcess]
) -> tuple[GatewayProcess, GatewayProcess]:
    cfg = config(fake_idp, tmp_path, deny_list={"file": str(tmp_path / "deny.json")})
    gw = launch(cfg, tmp_path, started, name="solo")
    return gw, gw


MODES = ["two replicas, one redis", "one replica, no redis"]


def replicas(
    mode: str,
    fake_idp: FakeIdP,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    started: list[GatewayProcess],
) -> tuple[GatewayProcess, GatewayProcess]:
    """Two replicas over one Redis, or one replica (twice) with its deny list in a file."""
    if mode == MODES[0]:
        return fleet(fake_idp, tmp_path, request.getfixturevalue("redis_server"), started)
    return single(fake_idp, tmp_path, started)


def cache_then_break_the_idp(fake_idp: FakeIdP, first: GatewayProcess, *users: str) -> None:
    for user in users:
        review = status(first, f"good-{user}")
        assert review["authenticated"], review
        assert review["user"]["extra"] == {BACKEND: ["idp"]}  # fresh: no stale marker
    fake_idp.configure(status=503)
    time.sleep(TTL + 0.2)  # past the fresh TTL: only stale answers are left


@pytest.mark.parametrize("mode", MODES)
def test_stale_answers_are_marked_and_an_eviction_cuts_one_user_everywhere_within_a_second(
    mode: str,
    fake_idp: FakeIdP,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    gateways: list[GatewayProcess],
) -> None:
    a, b = replicas(mode, fake_idp, tmp_path, request, gateways)
    cache_then_break_the_idp(fake_idp, a, "alice", "bob")

    for gw in (a, b):  # b never saw alice: it finds her in the shared tier
        review = status(gw, "good-alice")
        assert is_stale(review), review
        assert review["user"]["extra"][BACKEND] == ["idp"]
        text = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(text, "authn_gateway_stale_answers_total", backend="idp") >= 1
        assert metric_value(text, "authn_gateway_stale_age_seconds_count", backend="idp") >= 1
        assert metric_value(text, "authn_gateway_stale_age_seconds_sum", backend="idp") > 0

    code, answer, stderr = admin(a, "evict", "--user", "alice")
    assert code == 0, stderr
    assert answer["evicted"] == {"user": "alice"}
    assert answer["local_entries"] >= 1
    if mode == MODES[0]:
        assert answer["fleet"] is True and answer["shared_entries"] >= 1
    took = max(
        wait_until(lambda gw=gw: not status(gw, "good-alice")["authenticated"], 1.0, "eviction")
        for gw in (a, b)
    )
    assert took < 1.0
    for gw in (a, b):
        # Checked with the IdP, which is down: unavailable, never a stale identity.
        assert status(gw, "good-alice")["error"].startswith("idp: ")
        assert is_stale(status(gw, "good-bob"))  # other users are unaffected

    def actions() -> list[dict[str, Any]]:
        lines = Path(a.extra["audit"]).read_text().splitlines()
        return [d for d in map(orjson.loads, lines) if d["msg"] == "admin"]

    wait_until(lambda: bool(actions()), 5.0, "the audit line")
    [action] = actions()
    assert (action["action"], action["operator"], action["subject"]) == (
        "evict",
        "oncall",
        {"user": "alice"},
    )
    assert action["caller"] == "127.0.0.1"
    text = httpx.get(f"{b.url}/metrics").text
    source = "fleet" if mode == MODES[0] else "admin"
    assert metric_value(text, "authn_gateway_evictions_total", kind="user", source=source) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_denied_token_id_is_refused_everywhere_and_still_after_a_restart(
    mode: str,
    fake_idp: FakeIdP,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    gateways: list[GatewayProcess],
) -> None:
    two = mode == MODES[0]
    a, b = replicas(mode, fake_idp, tmp_path, request, gateways)
    assert status(a, "good-carol")["authenticated"]
    assert status(a, "good-dave")["authenticated"]
    carol = token_id_of(a, "carol")

    code, answer, stderr = admin(b, "deny", "--token-id", carol, "--seconds", "300")
    assert code == 0, stderr
    assert answer["denied"] == {"token_id": carol}
    assert answer["stored_in"] == ("redis" if two else "file")
    for gw in (a, b):
        # Refused though the IdP is up and a fresh entry is cached.
        wait_until(lambda gw=gw: not status(gw, "good-carol")["authenticated"], 1.0, "denial")
        assert "error" not in status(gw, "good-carol")  # an invalid token, not an outage
        assert status(gw, "good-dave")["authenticated"]
    code, listing, _ = admin(a, "denied")
    assert code == 0 and [e["token_id"] for e in listing["entries"]] == [carol]
    assert listing["entries"][0]["by"] == "oncall@127.0.0.1"

    # Restart a replica: the denial holds (Redis, or the file).
    a.stop()
    gateways.remove(a)
    a = launch(yaml.safe_load(a.config_path.read_text()), tmp_path, gateways, port=a.port)
    assert not status(a, "good-carol")["authenticated"]
    text = httpx.get(f"{a.url}/metrics").text
    assert metric_value(text, "authn_gateway_deny_hits_total", kind="token") >= 1

    code, answer, _ = admin(a, "lift", "--token-id", carol)
    assert code == 0 and answer["was_denied"] is True
    for gw in (a, b):
        wait_until(lambda gw=gw: status(gw, "good-carol")["authenticated"], 1.5, "lifting")


def test_a_denied_user_is_refused_even_when_served_from_stale_cache(
    fake_idp: FakeIdP, tmp_path: Path, gateways: list[GatewayProcess]
) -> None:
    gw, _ = single(fake_idp, tmp_path, gateways)
    cache_then_break_the_idp(fake_idp, gw, "erin", "frank")
    code, _, stderr = admin(gw, "deny", "--user", "erin", "--seconds", "60")
    assert code == 0, stderr
    assert status(gw, "good-erin") == {"authenticated": False}
    assert is_stale(status(gw, "good-frank"))


def test_a_reload_while_redis_is_down_keeps_the_denials(
    fake_idp: FakeIdP, tmp_path: Path, redis_server: RedisServer, gateways: list[GatewayProcess]
) -> None:
    # Found by the chaos runner (seed 2026, 600 s, issue 32): a reload built a new, empty
    # deny list and could not load it while Redis was cut off; the denied user was served.
    a, _ = fleet(fake_idp, tmp_path, redis_server, gateways)
    cache_then_break_the_idp(fake_idp, a, "gina", "hugo")
    code, _, stderr = admin(a, "deny", "--user", "gina", "--seconds", "300")
    assert code == 0, stderr
    redis_server.stop()
    a.proc.send_signal(signal.SIGHUP)
    a.wait_for_log("config reloaded")
    assert status(a, "good-gina") == {"authenticated": False}
    assert is_stale(status(a, "good-hugo"))  # the reload happened and serves


def test_admin_calls_without_the_token_or_with_bad_bodies_are_refused_in_json(
    fake_idp: FakeIdP, tmp_path: Path, gateways: list[GatewayProcess]
) -> None:
    gw, _ = single(fake_idp, tmp_path, gateways)
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    no_token = httpx.post(f"{gw.url}/admin/evict", json={"user": "alice"})
    assert (no_token.status_code, no_token.json()) == (401, {"message": "unauthorized"})
    for path, body, message in [
        ("/admin/evict", b"{", "body is not valid JSON"),
        ("/admin/evict", b'{"user": "a", "token_id": "0123456789ab"}', "exactly one"),
        ("/admin/evict", b'{"token_id": "good-alice"}', "token_id"),
        ("/admin/deny", b'{"user": "a", "seconds": 0}', "seconds"),
        ("/admin/deny", b'{"user": "a", "seconds": 99999999999}', "seconds"),
        ("/admin/deny", b'{"user": "a", "seconds": 5, "by": "x\\ny"}', "by"),
    ]:
        response = httpx.post(f"{gw.url}{path}", content=body, headers=auth)
        assert response.status_code == 400, (path, body)
        assert message in response.json()["message"]
        assert "good-alice" not in response.text
    code, _, stderr = admin(gw, "deny", "--user", "x", "--seconds", "0")
    assert code == 1 and "seconds" in stderr


def test_a_reload_keeps_known_users_and_rechecks_a_changed_backend(
    fake_idp: FakeIdP, tmp_path: Path, gateways: list[GatewayProcess]
) -> None:
    cfg = config(fake_idp, tmp_path)
    gw = launch(cfg, tmp_path, gateways, name="reload")
    cache_then_break_the_idp(fake_idp, gw, "gina", "hank")
    for _ in range(3):
        status(gw, "good-nobody")  # cold tokens fail: the breaker opens
    calls = fake_idp.calls

    # An unrelated change (a protection setting and the log level), as the runbook asks.
    cfg["logging"] = {"level": "debug"}
    cfg["backends"][0]["bucket"] = {"rate": 500, "burst": 500}
    gw.config_path.write_text(
        yaml.safe_dump({**cfg, "server": {**cfg["server"], "port": gw.port, "host": "127.0.0.1"}})
    )
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "config reloaded" in gw.logs(), 15, "the reload")
    assert is_stale(status(gw, "good-gina"))
    assert is_stale(status(gw, "good-hank"))
    assert fake_idp.calls == calls  # the breaker stayed open: no new calls to the IdP

    # An identity-relevant change (the userinfo URL): its answers are asked again.
    cfg["backends"][0]["url"] = fake_idp.url + "?v=2"
    gw.config_path.write_text(
        yaml.safe_dump({**cfg, "server": {**cfg["server"], "port": gw.port, "host": "127.0.0.1"}})
    )
    gw.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gw.logs().count("config reloaded") == 2, 15, "the second reload")
    review = status(gw, "good-gina")
    assert not review["authenticated"] and review["error"].startswith("idp: ")


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


def jwt_config(issuer: FakeIssuer, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    cfg = config(FakeIdP(), tmp_path, **extra)
    cfg["backends"] = [
        {
            "name": "oidc",
            "type": "jwt",
            "issuer": {
                "url": issuer.issuer,
                "certificateAuthority": issuer.ca_pem,
                "audiences": ["gateway"],
            },
            "claimMappings": {"username": {"claim": "sub", "prefix": "oidc:"}},
            "cache": {"positive_ttl_seconds": 300, "negative_ttl_seconds": 0},
        }
    ]
    return cfg


@pytest.mark.parametrize("mode", MODES)
def test_a_denied_credential_id_is_refused_everywhere_and_an_evicted_one_dropped(
    mode: str,
    issuer: FakeIssuer,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    gateways: list[GatewayProcess],
) -> None:
    two = mode == MODES[0]
    if two:
        redis = {"url": request.getfixturevalue("redis_server").url, "timeout_seconds": 0.5}
        a = launch(jwt_config(issuer, tmp_path, redis=redis), tmp_path, gateways, name="a")
        b = launch(jwt_config(issuer, tmp_path, redis=redis), tmp_path, gateways, name="b")
    else:
        cfg = jwt_config(issuer, tmp_path, deny_list={"file": str(tmp_path / "deny.json")})
        a = b = launch(cfg, tmp_path, gateways, name="solo")
    leaked = issuer.mint(issuer.claims("alice", jti="leak-1"))
    other = issuer.mint(issuer.claims("alice", jti="other-2"))
    for gw in (a, b):
        for token, jti in ((leaked, "leak-1"), (other, "other-2")):
            review = status(gw, token)
            assert review["authenticated"], review
            # kube's own key and form (oidc.go getCredentialID): what its audit log shows.
            assert review["user"]["extra"][CREDENTIAL_ID_KEY] == [f"JTI={jti}"]

    code, answer, stderr = admin(b, "deny", "--credential-id", "JTI=leak-1", "--seconds", "300")
    assert code == 0, stderr
    assert answer["denied"] == {"credential_id": "JTI=leak-1"}
    assert answer["stored_in"] == ("redis" if two else "file")
    for gw in (a, b):
        # Refused though its answer is cached; the same user's other token is not.
        wait_until(lambda gw=gw: not status(gw, leaked)["authenticated"], 1.0, "denial")
        assert status(gw, leaked) == {"authenticated": False}
        assert status(gw, other)["authenticated"]
    code, listing, _ = admin(a, "denied")
    assert code == 0 and [e.get("credential_id") for e in listing["entries"]] == ["JTI=leak-1"]
    text = httpx.get(f"{a.url}/metrics").text
    assert metric_value(text, "authn_gateway_deny_hits_total", kind="credential") >= 1
    assert "admin: deny credential:JTI=leak-1 by oncall@127.0.0.1" in b.logs()

    code, answer, stderr = admin(a, "evict", "--credential-id", "JTI=other-2")
    assert code == 0, stderr
    assert answer["evicted"] == {"credential_id": "JTI=other-2"}
    assert answer["local_entries"] == 1, answer  # the other token's entry, only it
    if two:
        assert answer["fleet"] is True and answer["shared_entries"] == 1, answer

        def fleet_evicted() -> bool:
            text = httpx.get(f"{b.url}/metrics").text
            samples = {"kind": "credential", "source": "fleet"}
            return metric_value(text, "authn_gateway_evictions_total", **samples) == 1

        wait_until(fleet_evicted, 1.0, "the eviction on the other replica")
    assert status(a, other)["authenticated"]  # verified again: eviction is not denial

    code, answer, _ = admin(a, "lift", "--credential-id", "JTI=leak-1")
    assert code == 0 and answer["was_denied"] is True
    for gw in (a, b):
        wait_until(lambda gw=gw: status(gw, leaked)["authenticated"], 1.5, "lifting")
