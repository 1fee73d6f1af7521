"""The jwt backend on real processes: a real ``authn-gateway serve`` verifying tokens
against the fake issuer, which publishes real RSA/EC keys over HTTPS. Guarantees about
the issuer are asserted on the issuer's own call counts."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import yaml

from tests.support import loadclient
from tests.support.fakes.issuer import DISCOVERY_PATH, JWKS_PATH, FakeIssuer
from tests.support.jwt_helpers import good_claims, jwt_backend
from tests.support.procs import GatewayProcess, metric_value

Start = Callable[..., GatewayProcess]


def config(*backends: dict[str, Any], **extra: Any) -> dict[str, Any]:
    # Negative caching off: each refusal below must be decided, not remembered.
    return {
        "cache": {"negative_ttl_seconds": 0, "positive_ttl_seconds": 300},
        "backends": list(backends),
        **extra,
    }


def status(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()["status"]
    return result


def metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    return metric_value(httpx.get(f"{gw.url}/metrics").text, name, **labels)


def test_a_valid_token_is_mapped_as_configured_cel_extras_included(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer)))
    answer = status(gw, issuer.mint(good_claims(issuer)))
    assert answer["authenticated"] is True
    assert answer["user"] == {
        "username": "oidc:alice",
        "uid": "uid-alice",
        "groups": ["oidc:dev", "oidc:ops"],
        "extra": {
            "example.com/tier": ["gold"],
            "example.com/scopes": ["read", "write"],
            # The marker naming the deciding backend (issue 17).
            "authn-gateway.io/backend": ["oidc"],
        },
    }


def test_an_ec_key_verifies_too(issuer: FakeIssuer, gateway_factory: Start) -> None:
    issuer.add_key("ec-1", "ES256")
    gw = gateway_factory(config(jwt_backend(issuer)))
    assert status(gw, issuer.mint(good_claims(issuer), kid="ec-1"))["authenticated"] is True


def _tampered(token: str) -> str:
    header, payload, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["sub"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{sig}"


def _bad_signature(token: str) -> str:
    header, payload, sig = token.split(".")
    raw = bytearray(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)))
    raw[10] ^= 0xFF
    return f"{header}.{payload}.{base64.urlsafe_b64encode(bytes(raw)).rstrip(b'=').decode()}"


def test_forged_and_invalid_tokens_are_refused_without_asking_the_issuer(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer)))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    fetches = issuer.path_calls(JWKS_PATH)
    now = int(time.time())
    other_issuer = FakeIssuer()  # a real key the gateway does not trust
    stranger = other_issuer.mint(good_claims(issuer))
    bad = {
        "expired": issuer.mint(good_claims(issuer, exp=now - 3600, iat=now - 7200)),
        "not yet valid": issuer.mint(good_claims(issuer, nbf=now + 3600)),
        "no exp": issuer.mint({k: v for k, v in good_claims(issuer).items() if k != "exp"}),
        "wrong audience": issuer.mint(good_claims(issuer, aud="someone-else")),
        "wrong issuer": issuer.mint(good_claims(issuer, iss=issuer.issuer + "/other")),
        "alg none": issuer.mint_unsigned(good_claims(issuer)),
        "HS256 with the public key": issuer.mint_hs256_with_public_key(good_claims(issuer)),
        "tampered payload": _tampered(issuer.mint(good_claims(issuer))),
        "bad signature": _bad_signature(issuer.mint(good_claims(issuer))),
        "another key, same kid": stranger,
        "claim validation rule": issuer.mint(good_claims(issuer) | {"tier": "banned"}),
        "user validation rule": issuer.mint(good_claims(issuer, sub="system-x")),
        "extra of the wrong type": issuer.mint(good_claims(issuer) | {"tier": 7}),
        "not a JWT": "opaque-token-abcdef",
    }
    for what, token in bad.items():
        answer = status(gw, token)
        assert answer["authenticated"] is False, what
        # A refusal, not an outage: kube-apiserver may cache it.
        assert "error" not in answer, what
    assert issuer.path_calls(JWKS_PATH) == fetches
    logs = gw.logs()
    assert not [what for what, token in bad.items() if token in logs or token[-40:] in logs]


def test_with_the_issuer_down_known_and_never_seen_tokens_keep_authenticating(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    issuer.max_age = 1  # the key set's lifetime: it goes stale a second after the outage
    gw = gateway_factory(
        config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.5, "max_stale_seconds": 3600}))
    )
    known = issuer.mint(good_claims(issuer, sub="known"))
    assert status(gw, known)["authenticated"] is True
    issuer.configure(refuse=True)
    time.sleep(2.5)  # past the set's lifetime; background refreshes have failed
    assert status(gw, known)["authenticated"] is True
    never_seen = issuer.mint(good_claims(issuer, sub="new"))
    answer = status(gw, never_seen)
    assert answer["authenticated"] is True
    assert answer["user"]["username"] == "oidc:new"
    assert metric(gw, "authn_gateway_jwks_stale_verifications_total", backend="oidc") >= 1
    assert metric(gw, "authn_gateway_jwks_fetches_total", backend="oidc", result="failed") >= 1
    assert "last good key set" in gw.logs()


def test_past_max_stale_the_issuer_outage_is_unavailable_not_a_refusal(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    issuer.max_age = 1
    gw = gateway_factory(
        config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.5, "max_stale_seconds": 1}))
    )
    assert status(gw, issuer.mint(good_claims(issuer, sub="a")))["authenticated"] is True
    issuer.configure(refuse=True)
    time.sleep(3)
    answer = status(gw, issuer.mint(good_claims(issuer, sub="b")))
    assert answer["authenticated"] is False
    assert "signing keys" in answer["error"]


def test_an_issuer_down_at_start_is_unavailable_until_it_answers(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    issuer.configure(status=503)
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.5})))
    token = issuer.mint(good_claims(issuer))
    assert "error" in status(gw, token)
    issuer.configure(status=None)
    deadline = time.monotonic() + 10
    while not status(gw, token)["authenticated"]:
        assert time.monotonic() < deadline, "never recovered"
        time.sleep(0.3)


def _random_kid_token(issuer: FakeIssuer) -> str:
    return issuer.mint(good_claims(issuer, sub=uuid.uuid4().hex), headers={"kid": uuid.uuid4().hex})


@pytest.mark.parametrize("floor_passed", [False, True])
async def test_a_flood_of_random_kids_costs_at_most_one_fetch_per_min_refresh(
    issuer: FakeIssuer, gateway_factory: Start, floor_passed: bool
) -> None:
    floor = 2.0 if floor_passed else 30.0
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": floor})))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    if floor_passed:
        await asyncio.sleep(floor + 0.2)  # the first unknown kid may fetch once
    before = issuer.path_calls(JWKS_PATH) + issuer.path_calls(DISCOVERY_PATH)
    tokens = [_random_kid_token(issuer) for _ in range(1000)]
    started = time.monotonic()
    answers = await loadclient.storm(gw.url, tokens, 100)
    elapsed = time.monotonic() - started
    loadclient.assert_all(answers, 200, authenticated=False)
    assert all("error" not in a.body["status"] for a in answers)
    fetched = issuer.path_calls(JWKS_PATH) + issuer.path_calls(DISCOVERY_PATH) - before
    # One per started min_refresh window the flood lasted.
    assert fetched <= (1 if floor_passed else 0) + int(elapsed // floor)
    if floor_passed:
        assert fetched >= 1  # the floor, not luck, is what held the rest back
    assert metric(gw, "authn_gateway_jwks_unknown_kid_refusals_total", backend="oidc") == 1000
    # The flood did not trip anything that would refuse a real user.
    assert status(gw, issuer.mint(good_claims(issuer, sub="after")))["authenticated"] is True


def test_a_rotated_key_is_accepted_within_one_refresh(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": 1})))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    fetches = issuer.path_calls(JWKS_PATH)
    issuer.add_key("key-2")
    time.sleep(1.2)  # past the floor: the unknown kid may trigger one fetch
    answer = status(gw, issuer.mint(good_claims(issuer, sub="rotated"), kid="key-2"))
    assert answer["authenticated"] is True
    assert issuer.path_calls(JWKS_PATH) == fetches + 1


def test_a_removed_key_is_refused_after_the_next_fetch(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    issuer.max_age = 1
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.5})))
    assert status(gw, issuer.mint(good_claims(issuer, sub="before")))["authenticated"] is True
    issuer.add_key("key-2")
    issuer.retire_key("key-1")
    fetches = issuer.path_calls(JWKS_PATH)
    deadline = time.monotonic() + 10
    while issuer.path_calls(JWKS_PATH) == fetches:  # the background refresh
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.2)
    assert status(gw, issuer.mint(good_claims(issuer, sub="after")))["authenticated"] is False
    assert status(gw, issuer.mint(good_claims(issuer, sub="new"), kid="key-2"))["authenticated"]


def test_the_issuer_asking_to_wait_holds_fetches_back(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.2})))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    issuer.configure(status=429, retry_after=60)
    issuer.reset_stats()
    for _ in range(20):
        status(gw, _random_kid_token(issuer))
        time.sleep(0.05)
    # The first unknown kid fetched and was told to wait 60 s; nothing since.
    assert issuer.path_calls(JWKS_PATH) == 1
    issuer.configure(status=None)
    assert status(gw, issuer.mint(good_claims(issuer, sub="b")))["authenticated"] is True


def test_in_a_chain_tokens_route_by_unverified_issuer(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    other = FakeIssuer().start_in_thread()
    try:
        second = jwt_backend(other, name="second")
        gw = gateway_factory(config(jwt_backend(issuer), second))
        assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
        assert status(gw, other.mint(good_claims(other, sub="bob")))["user"]["username"] == (
            "oidc:bob"
        )
        text = httpx.get(f"{gw.url}/metrics").text
        assert metric_value(text, "authn_gateway_backend_calls_total", backend="second") == 1
        assert metric_value(text, "authn_gateway_backend_calls_total", backend="oidc") == 1
    finally:
        other.stop()


async def test_a_slow_issuer_does_not_hold_reviews_past_the_deadline(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer, keys={"min_refresh_seconds": 0.2})))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    issuer.configure(hang=True)
    await asyncio.sleep(0.3)
    started = time.monotonic()
    answer = status(gw, _random_kid_token(issuer))
    assert time.monotonic() - started < 3.0
    assert answer["authenticated"] is False


def test_a_token_with_hundreds_of_groups_is_not_refused_for_its_length(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer)))
    groups = [f"team-{i:04d}-{uuid.uuid4().hex}" for i in range(250)]
    token = issuer.mint(good_claims(issuer) | {"groups": groups})
    assert 4096 < len(token) < 16384
    answer = status(gw, token)
    assert answer["authenticated"] is True
    assert len(answer["user"]["groups"]) == 250


def test_a_config_reload_builds_a_new_jwt_backend_and_its_metrics_follow(
    issuer: FakeIssuer, gateway_factory: Start
) -> None:
    gw = gateway_factory(config(jwt_backend(issuer)))
    assert status(gw, issuer.mint(good_claims(issuer)))["authenticated"] is True
    cfg = yaml.safe_load(gw.config_path.read_text())
    mappings = cfg["backends"][0]["claimMappings"]
    mappings["username"] = {"claim": "sub", "prefix": "reloaded:"}
    gw.config_path.write_text(yaml.safe_dump(cfg))
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "config reloaded" not in gw.logs():
        assert time.monotonic() < deadline, gw.logs()
        time.sleep(0.1)
    answer = status(gw, issuer.mint(good_claims(issuer, sub="bob")))
    assert answer["user"]["username"] == "reloaded:bob"
    # One set of jwks series (the new backend's), not a registration error or a duplicate.
    text = httpx.get(f"{gw.url}/metrics").text
    assert text.count('authn_gateway_jwks_keys{backend="oidc"}') == 1
    assert metric_value(text, "authn_gateway_jwks_keys", backend="oidc") == 1
