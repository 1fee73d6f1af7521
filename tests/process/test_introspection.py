"""The introspection backend (RFC 7662) on real processes, against the fake issuer's
``/introspect`` over HTTPS; call counts are the issuer's own."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fakes.issuer import INTROSPECT_PATH, FakeIssuer
from tests.support.introspection_helpers import introspection_backend, opaque
from tests.support.procs import GatewayProcess

Start = Callable[..., GatewayProcess]


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


def test_tokens_meant_for_someone_else_or_out_of_time_are_refused_though_active(
    issuer: FakeIssuer, start: Callable[..., GatewayProcess]
) -> None:
    gw = start(accept={"audiences": ["kubernetes"], "client_ids": ["cli", "kubectl"]})
    now = int(time.time())

    def scripted(token: str, **answer: Any) -> str:
        """A server that says active whatever the token's exp (the finding's case)."""
        issuer.opaque[token] = {
            "active": True,
            "username": "jane",
            "sub": "u-1",
            "scope": "read",
            "client_id": "cli",
            "aud": ["kubernetes"],
            **answer,
        }
        return token

    accepted = {
        "fit": scripted("t-fit"),
        "aud a string": scripted("t-aud-str", aud="kubernetes"),
        "another accepted client": scripted("t-kubectl", client_id="kubectl"),
        "token_type Bearer": scripted("t-bearer", token_type="Bearer"),
        "token_type access_token": scripted("t-access", token_type="access_token"),
        "exp ahead": scripted("t-exp-ahead", exp=now + 600),
        "nbf 30 s ahead (kube's minute)": scripted("t-nbf-30", nbf=now + 30),
        "exp null": scripted("t-exp-null", exp=None),
    }
    refused = {
        "another client's token": scripted("t-photo", client_id="photo-app"),
        "another audience": scripted("t-aud-photo", aud=["photo-app"]),
        "no aud": scripted("t-no-aud", aud=None),
        "no client_id": scripted("t-no-client", client_id=None),
        "a refresh token": scripted("t-refresh", token_type="refresh_token"),
        "an ID token": scripted("t-id", token_type="id_token"),
        "a DPoP-bound token": scripted("t-dpop", token_type="DPoP"),
        "token_type not a string": scripted("t-type-7", token_type=7),
        "exp an hour ago": scripted("t-expired", exp=now - 3600),
        "exp 30 s ago (no leeway)": scripted("t-expired-30", exp=now - 30),
        "nbf 2 min ahead": scripted("t-nbf-120", nbf=now + 120),
        "exp not a number": scripted("t-exp-soon", exp="soon"),
    }
    for token in [*accepted.values(), *refused.values()]:
        answer = issuer.opaque[token]
        for key in [k for k, v in answer.items() if v is None and k != "exp"]:
            del answer[key]  # None above means "absent", but for exp (sent as null)
    for what, token in accepted.items():
        assert review(gw, token)["authenticated"] is True, what
    for what, token in refused.items():
        answer = review(gw, token)
        # A refusal, not an outage: the server answered, about a token not for us.
        assert answer == {"authenticated": False}, (what, answer)
    # The review log says why (written in batches: waited for).
    for reason in ("client not accepted", "audience not accepted", "not an access token",
                   "token expired", "token not yet valid", "no aud", "no client_id"):  # fmt: skip
        assert reason in gw.wait_for_log(reason), reason
