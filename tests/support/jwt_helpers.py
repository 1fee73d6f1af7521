"""Helpers shared by the tiers of test_jwt."""

from __future__ import annotations

from typing import Any

from tests.support.fakes.issuer import FakeIssuer


def jwt_backend(issuer: FakeIssuer, **overrides: Any) -> dict[str, Any]:
    """A kube AuthenticationConfiguration.jwt entry, plus the gateway's name/type/keys."""
    backend: dict[str, Any] = {
        "name": "oidc",
        "type": "jwt",
        "issuer": {
            "url": issuer.issuer,
            "certificateAuthority": issuer.ca_pem,
            "audiences": ["gateway", "other"],
            "audienceMatchPolicy": "MatchAny",
        },
        "claimValidationRules": [
            {"expression": "claims.tier != 'banned'", "message": "banned tier"},
        ],
        "claimMappings": {
            "username": {"claim": "sub", "prefix": "oidc:"},
            "groups": {"claim": "groups", "prefix": "oidc:"},
            "uid": {"expression": "'uid-' + claims.sub"},
            "extra": [
                {"key": "example.com/tier", "valueExpression": "claims.tier"},
                {
                    "key": "example.com/scopes",
                    "valueExpression": "claims.scope.split(' ')",
                },
            ],
        },
        "userValidationRules": [
            {
                "expression": "!user.username.startsWith('oidc:system')",
                "message": "reserved name",
            },
        ],
        "keys": {"min_refresh_seconds": 30},
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
    }
    backend.update(overrides)
    return backend


def good_claims(issuer: FakeIssuer, sub: str = "alice", **extra: Any) -> dict[str, Any]:
    return issuer.claims(sub, groups=["dev", "ops"], tier="gold", scope="read write", **extra)
