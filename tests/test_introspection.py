"""The introspection backend (RFC 7662) on real processes, against the fake issuer's
``/introspect`` over HTTPS; call counts are the issuer's own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakes.issuer import INTROSPECT_PATH, FakeIssuer
from tests.support.procs import GatewayProcess

Start = Callable[..., GatewayProcess]


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


def introspection_backend(issuer: FakeIssuer, ca: Path, **overrides: Any) -> dict[str, Any]:
    backend: dict[str, Any] = {
        "name": "opaque",
        "type": "introspection",
        "url": issuer.issuer + INTROSPECT_PATH,
        "client_id": issuer.client_credentials[0],
        "client_secret": "env:INTROSPECTION_SECRET",
        "tls": {"ca_file": str(ca)},
        "claimMappings": {
            "username": {"claim": "username", "prefix": "idp:"},
            "groups": {"expression": "claims.scope.split(' ').map(s, 'scope:' + s)"},
            "uid": {"claim": "sub"},
            "extra": [{"key": "example.com/client", "valueExpression": "claims.client_id"}],
        },
        "claimValidationRules": [{"expression": "claims.token_type == 'access_token'"}],
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
        "breaker": {"fail_max": 100},
    }
    backend.update(overrides)
    return backend


@pytest.fixture
def start(issuer: FakeIssuer, gateway_factory: Start, tmp_path: Path) -> Callable[..., Any]:
    ca = tmp_path / "issuer-ca.pem"
    ca.write_text(issuer.ca_pem)

    def run(secret: str = issuer.client_credentials[1], **overrides: Any) -> GatewayProcess:
        return gateway_factory(
            {
                "cache": {"positive_ttl_seconds": 3600, "negative_ttl_seconds": 0},
                "backends": [introspection_backend(issuer, ca, **overrides)],
            },
            env={"INTROSPECTION_SECRET": secret},
        )

    return run


def opaque(issuer: FakeIssuer, token: str, lifetime: float = 600, **claims: Any) -> str:
    issuer.opaque[token] = {
        "username": "jane",
        "sub": "u-1",
        "scope": "read write",
        "client_id": "cli",
        "token_type": "access_token",
        "exp": int(time.time() + lifetime),
        **claims,
    }
    return token


def review(gw: GatewayProcess, token: str) -> dict[str, Any]:
    response = gw.review(token)
    assert response.status_code == 200
    result: dict[str, Any] = response.json()["status"]
    return result


@pytest.mark.parametrize("client_auth", ["client_secret_basic", "client_secret_post"])
def test_an_active_token_is_mapped_with_the_kube_claim_rules(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess], client_auth: str
) -> None:
    gw = start(client_auth=client_auth)
    answer = review(gw, opaque(issuer, "opaque-abc"))
    assert answer["authenticated"] is True
    assert answer["user"] == {
        "username": "idp:jane",
        "uid": "u-1",
        "groups": ["scope:read", "scope:write"],
        # The mapped extra, and the marker naming the deciding backend (issue 17).
        "extra": {"example.com/client": ["cli"], "authn-gateway.io/backend": ["opaque"]},
    }


def test_active_answers_are_cached_until_the_tokens_exp(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess]
) -> None:
    gw = start()
    token = opaque(issuer, "opaque-short", lifetime=2)
    assert review(gw, token)["authenticated"] is True
    assert review(gw, token)["authenticated"] is True
    assert issuer.path_calls(INTROSPECT_PATH) == 1
    time.sleep(2.5)  # past exp: the cache entry is gone and the issuer says inactive
    assert review(gw, token)["authenticated"] is False
    assert issuer.path_calls(INTROSPECT_PATH) == 2


def test_an_inactive_token_is_a_refusal(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess]
) -> None:
    gw = start()
    answer = review(gw, "opaque-unknown")
    assert answer["authenticated"] is False
    assert "error" not in answer
    # So is an active token whose claims fail a rule.
    answer = review(gw, opaque(issuer, "opaque-refresh", token_type="refresh_token"))
    assert answer == {"authenticated": False}


def test_refused_client_credentials_are_unavailable_and_logged_as_misconfiguration(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess]
) -> None:
    gw = start(secret="wrong-secret-9f2c")
    answer = review(gw, opaque(issuer, "opaque-abc"))
    assert answer["authenticated"] is False
    assert "client credentials" in answer["error"]
    logs = gw.wait_for_log("configuration problem")
    assert "configuration problem" in logs
    assert "wrong-secret-9f2c" not in logs


@pytest.mark.parametrize("fault", [{"status": 500}, {"status": 429}, {"hang": True}])
def test_issuer_errors_are_unavailable(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess], fault: dict[str, Any]
) -> None:
    gw = start()
    issuer.configure(**fault)
    answer = review(gw, opaque(issuer, "opaque-abc"))
    assert answer["authenticated"] is False
    assert answer["error"]
