"""Helpers shared by the tiers of test_introspection."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.support.fakes.issuer import INTROSPECT_PATH, FakeIssuer


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
        "accept": {"client_ids": ["cli"]},
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
        "breaker": {"fail_max": 100},
    }
    backend.update(overrides)
    return backend


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
