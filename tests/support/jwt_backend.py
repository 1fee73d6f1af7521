"""The jwt backend in process, against the fake issuer over real TLS sockets.

For tests of one decision at a time (a claim rule, a key, a Retry-After) that need
the real key fetch but not a gateway process: ``jwt_settings`` builds the entry,
``running`` starts the backend (its first key fetch included) and closes it after.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from backends.jwt import JWTBackend, JWTSettings
from tests.support.fakes.issuer import FakeIssuer


def jwt_settings(issuer: FakeIssuer, **overrides: Any) -> JWTSettings:
    """A kube ``jwt`` entry for ``issuer``: audience "gateway", username from ``sub``."""
    entry: dict[str, Any] = {
        "name": "oidc",
        "type": "jwt",
        "issuer": {
            "url": issuer.issuer,
            "certificateAuthority": issuer.ca_pem,
            "audiences": ["gateway"],
        },
        "claimMappings": {"username": {"claim": "sub", "prefix": ""}},
        "timeouts": {"connect_seconds": 0.5, "read_seconds": 1.0, "total_seconds": 1.0},
    }
    entry.update(overrides)
    return JWTSettings.model_validate(entry)


@contextlib.asynccontextmanager
async def running(settings: JWTSettings) -> AsyncIterator[JWTBackend]:
    backend = JWTBackend(settings)
    try:
        await backend.start()
        yield backend
    finally:
        await backend.close()
