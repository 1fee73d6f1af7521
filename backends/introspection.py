"""OAuth 2.0 token introspection (RFC 7662), for issuers whose access tokens are opaque.

``POST <url>`` with ``token=<token>&token_type_hint=access_token``, authenticated
with the gateway's client credentials (HTTP Basic, or in the form body):

* 200 ``{"active": true, ...}``: checked as the jwt backend checks a JWT (issue 29):
  the token must be meant for us (``accept.audiences`` against ``aud``,
  ``accept.client_ids`` against ``client_id``; absent means refused), be an access
  token (``token_type``, when present), and be within ``exp``/``nbf`` by kube's rules
  (no leeway on ``exp``, ``clock_skew_seconds`` on ``nbf``; the server's word on
  ``active`` is not taken alone). Then the claims are mapped exactly as the jwt
  backend maps a JWT's (kube's claimValidationRules / claimMappings /
  userValidationRules, CEL included); the answer is cacheable until ``exp``;
* 200 ``{"active": false}``, or an answer that fails a check above: rejected;
* 401/403: our client credentials are refused, a configuration problem: unavailable;
* 429, 5xx, timeouts, a body that is not an introspection answer: unavailable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field, model_validator

from backends.base import Authenticated, Backend, Outcome, Rejected, Unavailable
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.durations import finite
from backends.http import (
    PoolSettings,
    TLSClientSettings,
    make_client,
    server_failure,
    transport_failure,
)
from backends.jwt import idtoken
from backends.jwt.kube import ClaimRules
from backends.jwt.mapping import map_claims
from backends.registry import register
from backends.settings import BackendSettings, Secret, Strict
from backends.transports import on_the_wire

# The token types that are access tokens a bearer may present. RFC 7662 section 2.2
# gives token_type as an access token's type (RFC 6749 section 5.1: "Bearer"); many
# servers answer with the RFC 7009 hint's word ("access_token") or RFC 8693's URI.
# Refused: refresh and ID tokens, and sender-constrained types ("DPoP", RFC 9449),
# whose proof of possession a TokenReview cannot carry.
ACCESS_TOKEN_TYPES = frozenset(
    {"bearer", "access_token", "urn:ietf:params:oauth:token-type:access_token"}
)


class AcceptSettings(Strict):
    """Which tokens are meant for this cluster. Each list set must match: the answer's
    ``aud`` (a string or a list) must name one of ``audiences``, its ``client_id`` must
    be one of ``client_ids`` (the clients whose tokens log in; not the gateway's own
    ``client_id``). A field the list checks that the answer lacks refuses the token."""

    audiences: list[str] = Field(default_factory=list)
    client_ids: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_set(self) -> AcceptSettings:
        if not self.audiences and not self.client_ids:
            raise ValueError(
                "set audiences or client_ids (or both): without them any active token, "
                "issued for any client or resource server, would log in"
            )
        if any(not v for v in (*self.audiences, *self.client_ids)):
            raise ValueError("audiences and client_ids must not hold empty strings")
        return self


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
    # Required: which tokens are meant for this cluster.
    accept: AcceptSettings
    # How far ahead nbf may be, as for jwt (kube's one minute); exp has no leeway.
    clock_skew_seconds: Annotated[float, finite(ge=0, le=600)] = idtoken.KUBE_NBF_LEEWAY_SECONDS

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        # One call per review, paid by the stack's budget layer: no follow-ups to budget.
        return IntrospectionBackend(self)


class IntrospectionBackend(Backend):
    kind = "introspection"

    def __init__(
        self,
        settings: IntrospectionSettings,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(settings.name)
        self._s = settings
        self._clock = clock
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

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        form = {"token": token, "token_type_hint": "access_token", **self._form_credentials}
        try:
            response = await self._client.post(
                self._s.url,
                data=form,
                auth=self._auth if self._auth is not None else httpx.USE_CLIENT_DEFAULT,
                headers={"accept": "application/json"},
                extensions=on_the_wire(wire),
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
        problem = answer_refusal(answer, self._s, self._clock())
        if problem is not None:
            return Rejected(problem)
        user = map_claims(self._s, answer)
        if isinstance(user, Rejected):
            return user
        exp = answer.get("exp")  # checked by answer_refusal
        expires = None if exp is None else float(idtoken.json_time(exp, "exp"))
        return Authenticated(user, expires_at=expires)


def answer_refusal(
    answer: Mapping[str, Any], settings: IntrospectionSettings, now: float
) -> str | None:
    """Why an active answer must still be refused: the checks the jwt backend makes on
    a JWT's claims, where an introspection answer has them (RFC 7662 section 2.2)."""
    token_type = answer.get("token_type")
    if token_type is not None and (
        not isinstance(token_type, str) or token_type.lower() not in ACCESS_TOKEN_TYPES
    ):
        return "not an access token (token_type)"
    accept = settings.accept
    if accept.audiences:
        try:
            audiences = idtoken.audience({"aud": answer["aud"]}) if "aud" in answer else []
        except idtoken.Malformed:
            return "aud is not a string or a list of strings"
        if not set(audiences) & set(accept.audiences):
            return "audience not accepted" if audiences else "no aud, and audiences are required"
    if accept.client_ids:
        client = answer.get("client_id")
        if client is None:
            return "no client_id, and client_ids are required"
        if client not in accept.client_ids:
            return "client not accepted"
    # exp and nbf by the jwt backend's (kube's) rules; both are optional here (RFC 7662),
    # and null is taken as absent.
    exp_value, nbf_value = answer.get("exp"), answer.get("nbf")
    try:
        exp = None if exp_value is None else idtoken.json_time(exp_value, "exp")
        nbf = None if nbf_value is None else idtoken.json_time(nbf_value, "nbf")
    except idtoken.Malformed as exc:
        return f"malformed answer: {exc}"
    if exp is not None and exp < now:
        return "token expired"
    if nbf is not None and now + settings.clock_skew_seconds < nbf:
        return "token not yet valid"
    return None
