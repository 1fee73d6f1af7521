"""A generic HTTP "userinfo" backend (OIDC userinfo style).

``GET <url>`` with ``Authorization: Bearer <token>``:

* 200 with a JSON object: authenticated, mapped through the configured claims;
* 401 or 403: rejected (the IdP does not know the token);
* 429, 5xx, timeouts, connection errors: unavailable.

It fronts any IdP that offers such an endpoint (an OIDC provider's userinfo, an
in-house token service) and is what the fault-injecting fake IdP speaks.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from pydantic import Field

from .base import Authenticated, Backend, Outcome, Rejected, Unavailable, UserInfo
from .budget import UNLIMITED, CallBudget
from .http import PoolSettings, TLSClientSettings, make_client, server_failure, transport_failure
from .registry import register
from .settings import BackendSettings


@register
class UserinfoSettings(BackendSettings):
    type: Literal["userinfo"]
    url: str = Field(pattern=r"^https?://")
    username_claim: str = "preferred_username"
    uid_claim: str = "sub"
    groups_claim: str = "groups"
    # Unix time claim that caps the cache lifetime, when present.
    expiry_claim: str = "exp"
    username_prefix: str = ""
    groups_prefix: str = ""
    tls: TLSClientSettings = Field(default_factory=TLSClientSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        return UserinfoBackend(self)


class UserinfoBackend(Backend):
    kind = "userinfo"

    def __init__(self, settings: UserinfoSettings, client: httpx.AsyncClient | None = None) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._client = client or make_client("", settings.timeouts, settings.tls, settings.pool)

    async def close(self) -> None:
        await self._client.aclose()

    async def authenticate(self, token: str) -> Outcome:
        try:
            response = await self._client.get(
                self._s.url, headers={"Authorization": f"Bearer {token}"}
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        if response.status_code in (401, 403):
            return Rejected(f"IdP answered {response.status_code}")
        if response.status_code != 200:
            return server_failure(self.kind, response)
        try:
            claims = response.json()
        except ValueError:
            return Unavailable("IdP sent a body that is not JSON")
        if not isinstance(claims, dict):
            return Unavailable("IdP sent a body that is not a JSON object")
        return self._map(claims)

    def _map(self, claims: dict[str, Any]) -> Outcome:
        username = claims.get(self._s.username_claim)
        if not isinstance(username, str) or not username:
            # Never a login with an empty name: the IdP answered, but not usably.
            return Unavailable(f"IdP response has no {self._s.username_claim!r} claim")
        groups = claims.get(self._s.groups_claim) or []
        if not isinstance(groups, list):
            groups = []
        expiry = claims.get(self._s.expiry_claim)
        return Authenticated(
            UserInfo(
                username=self._s.username_prefix + username,
                uid=str(claims.get(self._s.uid_claim, "")),
                groups=tuple(self._s.groups_prefix + str(g) for g in groups),
            ),
            expires_at=float(expiry) if isinstance(expiry, int | float) else None,
        )
