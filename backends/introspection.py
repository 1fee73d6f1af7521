"""OAuth 2.0 token introspection (RFC 7662), for issuers whose access tokens are opaque.

``POST <url>`` with ``token=<token>&token_type_hint=access_token``, authenticated
with the gateway's client credentials (HTTP Basic, or in the form body):

* 200 ``{"active": true, ...}``: the claims are mapped exactly as the jwt backend
  maps a JWT's (kube's claimValidationRules / claimMappings / userValidationRules,
  CEL included); the answer is cacheable until the token's ``exp``;
* 200 ``{"active": false}``: rejected;
* 401/403: our client credentials are refused, a configuration problem: unavailable;
* 429, 5xx, timeouts, a body that is not an introspection answer: unavailable.
"""

from __future__ import annotations

from typing import Literal

import httpx
from pydantic import Field

from .base import Authenticated, Backend, Outcome, Rejected, Unavailable
from .budget import UNLIMITED, CallBudget
from .http import PoolSettings, TLSClientSettings, make_client, server_failure, transport_failure
from .jwt.kube import ClaimRules
from .jwt.mapping import map_claims
from .registry import register
from .settings import BackendSettings, Secret


@register
class IntrospectionSettings(BackendSettings, ClaimRules):
    type: Literal["introspection"]
    url: str = Field(pattern=r"^https?://")
    client_id: str = Field(min_length=1)
    # Literal, env:NAME or file:/path; never logged.
    client_secret: Secret
    # RFC 6749 section 2.3.1: Basic is the method every server must support.
    client_auth: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    tls: TLSClientSettings = Field(default_factory=TLSClientSettings)
    pool: PoolSettings = Field(default_factory=PoolSettings)

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        # One call per review, paid by the stack's budget layer: no follow-ups to budget.
        return IntrospectionBackend(self)


class IntrospectionBackend(Backend):
    kind = "introspection"

    def __init__(
        self, settings: IntrospectionSettings, client: httpx.AsyncClient | None = None
    ) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._client = client or make_client("", settings.timeouts, settings.tls, settings.pool)
        secret = settings.client_secret.get_secret_value()
        self._auth = (
            httpx.BasicAuth(settings.client_id, secret)
            if settings.client_auth == "client_secret_basic"
            else None
        )
        self._form_credentials: dict[str, str] = {}
        if self._auth is None:
            self._form_credentials = {"client_id": settings.client_id, "client_secret": secret}

    async def close(self) -> None:
        await self._client.aclose()

    async def authenticate(self, token: str) -> Outcome:
        form = {"token": token, "token_type_hint": "access_token", **self._form_credentials}
        try:
            response = await self._client.post(
                self._s.url,
                data=form,
                auth=self._auth if self._auth is not None else httpx.USE_CLIENT_DEFAULT,
                headers={"accept": "application/json"},
            )
        except httpx.HTTPError as exc:
            return transport_failure(exc)
        if response.status_code in (401, 403):
            # RFC 7662 section 2.3: the *caller* (we) failed to authenticate.
            return Unavailable(
                f"introspection endpoint refused our client credentials ({response.status_code})",
                misconfigured=True,
            )
        if response.status_code != 200:
            return server_failure(self.kind, response, self._s.breaker.max_retry_after_seconds)
        try:
            answer = response.json()
        except ValueError:
            return Unavailable("introspection answer is not JSON")
        if not isinstance(answer, dict) or not isinstance(answer.get("active"), bool):
            return Unavailable("introspection answer has no boolean 'active'")
        if answer["active"] is not True:
            return Rejected("token is not active")
        user = map_claims(self._s, answer)
        if isinstance(user, Rejected):
            return user
        exp = answer.get("exp")
        expires = float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
        return Authenticated(user, expires_at=expires)
