"""A generic HTTP "userinfo" backend (OIDC userinfo style).

``GET <url>`` with ``Authorization: Bearer <token>``:

* 200 with a JSON object: authenticated, mapped through the configured claims;
* 401 or 403: rejected (the IdP does not know the token);
* 200 with signed userinfo (``application/jwt``): rejected, never counted as the IdP
  failing (it answers so per OIDC client); any other 200 that is not a JSON object:
  unavailable;
* 429, 5xx, timeouts, connection errors: unavailable.

It fronts any IdP that offers such an endpoint (an OIDC provider's userinfo, an
in-house token service) and is what the fault-injecting fake IdP speaks.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import httpx
from pydantic import Field

from backends.base import Authenticated, Backend, Outcome, Rejected, Unavailable, UserInfo
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.http import (
    PoolSettings,
    TLSClientSettings,
    header_safe,
    make_client,
    server_failure,
    transport_failure,
    unsendable,
)
from backends.registry import register
from backends.settings import BackendSettings
from backends.transports import on_the_wire

# What an OIDC provider answers a client registered for signed userinfo.
JWT = "application/jwt"


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
        # Parsed once: httpx parses a URL given as text on every request.
        self._url = httpx.URL(settings.url)

    async def close(self) -> None:
        await self._client.aclose()

    def could_accept(self, token: str) -> bool:
        return header_safe(token)

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        refusal = unsendable(token)
        if refusal is not None:
            return refusal
        try:
            response = await self._client.get(
                self._url,
                headers={"Authorization": f"Bearer {token}"},
                extensions=on_the_wire(wire),
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        if response.status_code in (401, 403):
            return Rejected(f"IdP answered {response.status_code}")
        if response.status_code != 200:
            return server_failure(self.kind, response, self._s.breaker.max_retry_after_seconds)
        if response.headers.get("content-type", "").split(";")[0].strip().lower() == JWT:
            # OIDC answers so for a client registered for signed userinfo: that token's
            # client, not the IdP's health. A refusal, which the breaker does not count
            # (a body that is not JSON otherwise is: an error page, a broken IdP).
            return Rejected("IdP sent signed userinfo (application/jwt), not JSON", "unmapped")
        try:
            claims = response.json()
        except (ValueError, RecursionError):
            return Unavailable("IdP sent a body that is not JSON")
        if not isinstance(claims, dict):
            return Unavailable("IdP sent a body that is not a JSON object")
        return self._map(claims)

    def _map(self, claims: dict[str, Any]) -> Outcome:
        username = claims.get(self._s.username_claim)
        if not isinstance(username, str) or not username:
            # Never a login with an empty name. The IdP vouched for the token, so it is
            # healthy: a refusal, not "unavailable" (client-credentials tokens of many
            # OIDC IdPs carry no user name, and must not open the breaker).
            return Rejected(
                f"IdP accepted the token but its answer has no {self._s.username_claim!r} "
                "claim (username_claim); a client-credentials token?",
                "unmapped",
            )
        groups = claims.get(self._s.groups_claim) or []
        if not isinstance(groups, list):
            groups = []
        return Authenticated(
            UserInfo(
                username=self._s.username_prefix + username,
                uid=str(claims.get(self._s.uid_claim, "")),
                groups=tuple(self._s.groups_prefix + str(g) for g in groups),
            ),
            expires_at=expiry_time(claims.get(self._s.expiry_claim)),
        )


def expiry_time(value: Any) -> float | None:
    """A Unix-time claim as a float, or None when it is absent or not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = float(value)  # an integer too large for a float raises OverflowError
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None
