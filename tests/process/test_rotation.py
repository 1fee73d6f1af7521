"""Rotating the gateway secret (previous_secrets) without a cold start: real gateway
processes, a real redis-server and the fake IdP, following docs/operations.md
("Rotate the gateway secret") step by step."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from authn_gateway.keyed_hashes import TokenHasher
from tests.support.fakes.idp import FakeIdP
from tests.support.procs import GatewayProcess, metric_value
from tests.support.redis_server import RedisServer
from tests.support.rotation_helpers import FAIL_MAX, MINIMAL, NEW, OLD, config

Start = Callable[..., GatewayProcess]

KNOWN = [f"good-user{i}" for i in range(5)]

STALE = "authn-gateway.io/stale"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def key_id(secret: str) -> str:
    return TokenHasher(secret.encode()).key_id.hex()


def metrics(gw: GatewayProcess) -> str:
    return httpx.get(f"{gw.url}/metrics", timeout=10).text


def authenticated(gw: GatewayProcess, token: str) -> dict[str, Any]:
    status: dict[str, Any] = gw.review(token).json()["status"]
    assert status.get("authenticated"), status
    return status


def serves_known_users_stale(gw: GatewayProcess) -> None:
    for token in KNOWN:
        user = authenticated(gw, token)["user"]
        assert user["username"] == token.removeprefix("good-")
        assert user["extra"][STALE] == ["true"]


def test_rotation_step_by_step_during_an_idp_outage_keeps_known_users(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    def start(name: str, secret: str, previous: list[str] | None = None) -> GatewayProcess:
        return gateway_factory(config(fake_idp, redis_server, secret, previous), name=name)

    p, q = start("p", OLD), start("q", OLD)
    for token in KNOWN:
        authenticated(p, token)
        authenticated(q, token)  # from Redis
    assert fake_idp.calls == len(KNOWN)
    time.sleep(1.2)  # past the positive TTL: only stale answers from here on

    fake_idp.configure(status=503)
    fake_idp.reset_stats()
    # Step 1: the new secret is accepted for reading; the old one still writes.
    p.stop()
    p = start("p-1", OLD, [NEW])
    serves_known_users_stale(p)
    q.stop()
    q = start("q-1", OLD, [NEW])
    serves_known_users_stale(q)

    # Step 2: the swap. p, restarted cold on the new secret, finds nothing under its
    # own keys; it reads each user under the old secret's key and re-writes it.
    p.stop()
    p = start("p-2", NEW, [OLD])
    serves_known_users_stale(p)
    lookups = "authn_gateway_cache_previous_key_lookups_total"
    assert metric_value(metrics(p), lookups, result="found") == len(KNOWN)
    # q, still on step 1 meanwhile, reads them too (it accepts the new secret).
    serves_known_users_stale(q)
    q.stop()
    q = start("q-2", NEW, [OLD])
    serves_known_users_stale(q)
    # Written under the new key by p: q found them there, not under the old one.
    assert metric_value(metrics(q), lookups, result="found") == 0

    # Step 3: the old secret is dropped. The IdP now resets connections.
    fake_idp.configure(status=None, reset=True)
    p.stop()
    p = start("p-3", NEW)
    serves_known_users_stale(p)
    q.stop()
    q = start("q-3", NEW)
    serves_known_users_stale(q)

    # The IdP saw the fleet's breaker open, no more: every answer came from Redis.
    assert fake_idp.calls <= FAIL_MAX
    # The outage is real: a user nobody knew gets no identity.
    unknown = p.review("good-stranger").json()["status"]
    assert not unknown["authenticated"] and unknown["error"].startswith("idp: ")
    text = metrics(p)
    assert metric_value(text, "authn_gateway_secret_info", key_id=key_id(NEW), role="current")
    assert 'role="previous"' not in text.split("authn_gateway_secret_info", 1)[1].split("#")[0]


ADMIN_TOKEN = "rotation-admin-test-only-Zq3Xw8Lm5Nb2Vc7Kj4Hg9Fd1Sa6Pp0Oo"


def denied(gw: GatewayProcess, token: str) -> bool:
    status: dict[str, Any] = gw.review(token).json()["status"]
    return not status.get("authenticated")


def eventually_denied(gw: GatewayProcess, token: str, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not denied(gw, token):
        assert time.monotonic() < deadline, f"{token} not denied on {gw.config_path.name}"
        time.sleep(0.05)


def deny_token_id(gw: GatewayProcess, token_id: str) -> None:
    answer = httpx.post(
        f"{gw.url}/admin/deny",
        json={"token_id": token_id, "seconds": 3600, "by": "oncall"},
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def denied_ids(gw: GatewayProcess) -> set[str]:
    listing = httpx.get(
        f"{gw.url}/admin/deny", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
    ).json()
    return {e["token_id"] for e in listing["entries"] if "token_id" in e}


def test_a_token_id_denial_holds_through_every_step_of_a_rotation(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    """Issue 29, finding 8: the deny check used the current secret's id only, so step 2
    ended every token-id denial while the listing still showed it."""

    def start(name: str, secret: str, previous: list[str] | None = None) -> GatewayProcess:
        cfg = config(fake_idp, redis_server, secret, previous, 300)
        cfg["admin"] = {"enabled": True, "token": ADMIN_TOKEN}
        cfg["deny_list"] = {"sync_seconds": 0.2}
        return gateway_factory(cfg, name=name)

    carol, dave = "good-carol", "good-dave"
    old_id, new_id = TokenHasher(OLD.encode()).token_id, TokenHasher(NEW.encode()).token_id
    p, q = start("p", OLD), start("q", OLD)
    for gw in (p, q):
        authenticated(gw, carol)
        authenticated(gw, dave)
    deny_token_id(p, old_id(carol))  # the id the review log shows before the rotation
    eventually_denied(p, carol)
    eventually_denied(q, carol)

    # Step 1: both accept the new secret; nothing changes for the denial.
    for gw in (p, q):
        gw.stop()
    p, q = start("p-1", OLD, [NEW]), start("q-1", OLD, [NEW])
    assert denied(p, carol) and denied(q, carol)

    # Step 2, half-way: p writes with the new secret, q still with the old one.
    p.stop()
    p = start("p-2", NEW, [OLD])
    assert old_id(carol) in denied_ids(p)
    assert denied(p, carol), "the listing shows carol's id, and p let her in"
    # p carried the denial to carol's new id, and it reached the store.
    deadline = time.monotonic() + 5
    while new_id(carol) not in denied_ids(q):
        assert time.monotonic() < deadline, denied_ids(q)
        time.sleep(0.05)
    # A denial by the id p's review log now shows holds on q, still on the old secret.
    deny_token_id(p, new_id(dave))
    eventually_denied(q, dave)
    assert not denied(q, "good-erin")
    q.stop()
    q = start("q-2", NEW, [OLD])
    assert denied(q, carol) and denied(q, dave)

    # Step 3: the old secret is dropped. Both tokens were seen on the new secret.
    for gw in (p, q):
        gw.stop()
    p, q = start("p-3", NEW), start("q-3", NEW)
    for gw in (p, q):
        assert denied(gw, carol) and denied(gw, dave)
        assert not denied(gw, "good-erin")
    assert metric_value(metrics(p), "authn_gateway_deny_hits_total", kind="token") >= 2


def test_the_new_secret_goes_into_previous_secrets_first(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    """Why step 1 comes first: a replica still on the old secret reads what a replica
    on the new secret wrote only if it already accepts the new secret."""

    def start(name: str, secret: str, previous: list[str] | None = None) -> GatewayProcess:
        return gateway_factory(config(fake_idp, redis_server, secret, previous, 300), name=name)

    swapped = start("swapped", NEW, [OLD])
    for name in ("ann", "bob"):
        assert authenticated(swapped, f"good-{name}")["user"]["username"] == name
    assert fake_idp.calls == 2

    skipped = start("skipped-step1", OLD)
    assert authenticated(skipped, "good-ann")["user"]["username"] == "ann"
    assert fake_idp.calls == 3  # it cannot read the new secret's entry: it asked again

    ready = start("step1", OLD, [NEW])
    assert authenticated(ready, "good-bob")["user"]["username"] == "bob"
    assert fake_idp.calls == 3  # read from Redis, under the new secret's key


def test_two_secrets_in_one_fleet_show_in_the_key_id_metric(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    old = gateway_factory(config(fake_idp, redis_server, OLD, [NEW]), name="old")
    new = gateway_factory(config(fake_idp, redis_server, NEW), name="new")
    name = "authn_gateway_secret_info"
    assert metric_value(metrics(old), name, key_id=key_id(OLD), role="current") == 1
    assert metric_value(metrics(old), name, key_id=key_id(NEW), role="previous") == 1
    assert metric_value(metrics(new), name, key_id=key_id(NEW), role="current") == 1
    for gw, secret in ((old, OLD), (new, NEW)):
        assert secret not in metrics(gw)
        assert secret not in gw.logs()


def test_a_value_signed_with_an_unknown_secret_is_refused_and_named_by_key_id(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    """A planted entry under the right key, signed with a secret the replica does not
    accept: ignored, counted, and logged with its (non-secret) key id."""
    import redis

    from authn_gateway.config import GatewayConfig
    from authn_gateway.layers.cache import CacheEntry
    from authn_gateway.layers.cache.redis import EntryCodec
    from authn_gateway.review.carryover import cache_namespace
    from backends.base import Authenticated, UserInfo

    cfg = config(fake_idp, redis_server, NEW, [OLD])
    [backend] = GatewayConfig.model_validate(cfg).backends
    forger = TokenHasher(b"x" * 40)
    key = TokenHasher(NEW.encode()).cache_key(cache_namespace(backend), "good-mallory", ())
    now = time.time()
    admin = Authenticated(UserInfo("cluster-admin", groups=("system:masters",)))
    value = EntryCodec(forger).encode(key, CacheEntry(admin, now + 300, now + 300))
    redis.Redis.from_url(redis_server.url).set(f"authn-gw:cache:{key.hex()}", value)

    gw = gateway_factory(cfg)
    assert authenticated(gw, "good-mallory")["user"]["username"] == "mallory"
    assert fake_idp.calls == 1
    assert metric_value(metrics(gw), "authn_gateway_cache_tampered_entries_total") == 1
    assert f"signed by key id {forger.key_id.hex()}" in gw.wait_for_log("signature check")


def test_a_reload_that_adds_previous_secrets_reads_the_old_entries(
    fake_idp: FakeIdP, redis_server: RedisServer, gateway_factory: Start
) -> None:
    """The swap done by SIGHUP (a file: secret) instead of a restart: the reloaded
    gateway starts its in-process cache empty and finds the users under the old keys."""
    gw = gateway_factory(config(fake_idp, redis_server, OLD))
    for token in KNOWN:
        authenticated(gw, token)
    time.sleep(1.2)
    fake_idp.configure(status=503)
    fake_idp.reset_stats()
    cfg = config(fake_idp, redis_server, NEW, [OLD])
    cfg["server"] = {"host": "127.0.0.1", "port": gw.port}
    gw.config_path.write_text(yaml.safe_dump(cfg))
    gw.proc.send_signal(signal.SIGHUP)
    gw.wait_for_log("config reloaded")
    assert "previous_secrets" in gw.logs()  # the reload says the cache starts empty
    serves_known_users_stale(gw)
    assert fake_idp.calls <= FAIL_MAX
    text = metrics(gw)
    assert metric_value(text, "authn_gateway_secret_info", key_id=key_id(NEW), role="current")
    assert metric_value(text, "authn_gateway_secret_info", key_id=key_id(OLD), role="previous")
    assert not metric_value(text, "authn_gateway_secret_info", key_id=key_id(OLD), role="current")


def test_check_config_names_a_bad_previous_secret_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    weak = "REPLACE-with-32-random-bytes-base64"
    path.write_text(MINIMAL + f"secret: '{NEW}'\nprevious_secrets: ['{weak}']\n")
    result = subprocess.run(
        [sys.executable, "-m", "authn_gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "previous_secrets[0]: looks like a placeholder" in result.stderr
    assert "Traceback" not in result.stderr
    assert weak not in result.stderr + result.stdout and NEW not in result.stderr
