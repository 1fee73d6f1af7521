"""The ``jwt`` backend: tokens verified locally against the issuer's published keys.

Per review: parse the token unverified (not a JWT for this issuer: refused, no call),
pick the key by ``kid`` and the algorithm by the key, verify signature, ``iss``,
``aud``, ``exp``/``nbf``/``iat`` with PyJWT, then map the claims as kube does. The
only IdP calls are key fetches (:mod:`backends.jwt.keys`), so the pipeline's
per-review breaker and bucket do not apply (``calls_idp_per_review = False``); the
fetches carry their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Any, Literal

import httpx
import jwt
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from pydantic import Field

from backends.base import (
    Authenticated,
    Backend,
    BackendConfigError,
    Outcome,
    Rejected,
    Unavailable,
)
from backends.budget import UNLIMITED, CallBudget
from backends.context import WireTime
from backends.durations import Age, Interval, finite
from backends.http import IdPClient, PoolSettings, pooled_wire
from backends.jws import is_canonical
from backends.jwt.idtoken import (
    KUBE_NBF_LEEWAY_SECONDS,
    Malformed,
    expiry,
    refusal,
    unverified_issuer,
)
from backends.jwt.jwks import ASYMMETRIC_ALGS, MAX_JWKS_BYTES
from backends.jwt.keys import KeyPolicy, KeySource
from backends.jwt.kube import ClaimRules, Issuer
from backends.jwt.mapping import map_claims
from backends.jwt.token import Unverified, peek
from backends.registry import register
from backends.settings import (
    BackendSettings,
    Strict,
    TokenRules,
)
from backends.shared import SharedBlobs
from backends.transports import BoundedAnswers

METRIC_PREFIX = "authn_gateway"


class KeyFetchSettings(Strict):
    """How the issuer's keys are fetched and kept (not in kube's schema)."""

    # An unknown kid triggers at most one fetch per this; in between it is refused.
    min_refresh_seconds: Interval = 30.0
    # Lifetime of a key set whose response has no Cache-Control max-age.
    refresh_seconds: Interval = 300.0
    # Upper bound on a lifetime the issuer asks for.
    max_refresh_seconds: Interval = 86400.0
    # While the issuer is down, the last good set verifies this long past its lifetime.
    max_stale_seconds: Age = 86400.0
    # Back-off after failed fetches doubles from min_refresh_seconds up to this; an
    # issuer's Retry-After is honoured up to this too, never longer.
    max_backoff_seconds: Interval = 300.0


@register
class JWTSettings(BackendSettings, ClaimRules):
    """One kube ``AuthenticationConfiguration.jwt`` entry plus the gateway's fields."""

    type: Literal["jwt"]
    issuer: Issuer
    keys: KeyFetchSettings = Field(default_factory=KeyFetchSettings)
    # How far ahead nbf may be: kube's one minute by default. exp has no leeway and
    # iat is not checked, as in kube (docs/backends/jwt.md).
    clock_skew_seconds: Annotated[float, finite(ge=0, le=600)] = KUBE_NBF_LEEWAY_SECONDS
    # JWTs with many groups (Azure AD, Keycloak) run past the gateway's 4096 default.
    token_rules: TokenRules = Field(default_factory=lambda: TokenRules(max_length=16384))
    pool: PoolSettings = Field(default_factory=PoolSettings)

    def build(self, budget: CallBudget = UNLIMITED) -> Backend:
        return JWTBackend(self, budget=budget)

    @property
    def discovery(self) -> str:
        if self.issuer.discovery_url is not None:
            return self.issuer.discovery_url
        return self.issuer.url.rstrip("/") + "/.well-known/openid-configuration"


def issuer_client(settings: JWTSettings) -> httpx.AsyncClient:
    """The client for discovery and JWKS, trusting ``certificateAuthority`` when set."""
    verify: ssl.SSLContext | bool = True
    if settings.issuer.certificate_authority is not None:
        try:
            verify = ssl.create_default_context(cadata=settings.issuer.certificate_authority)
        except (ssl.SSLError, ValueError) as exc:
            raise BackendConfigError(
                f"issuer.certificateAuthority: cannot load: {getattr(exc, 'reason', None) or exc}"
            ) from None
    t, pool = settings.timeouts, settings.pool
    transport = pooled_wire(verify, pool)
    return IdPClient(
        timeout=httpx.Timeout(t.total_seconds, connect=t.connect_seconds, read=t.read_seconds),
        # Discovery documents and key sets are small; a larger one is not read.
        transport=BoundedAnswers(transport, MAX_JWKS_BYTES),
        follow_redirects=False,
        trust_env=False,
    )


# What PyJWT can still refuse once the claims are ours: the header and the signature.
_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.InvalidAlgorithmError, "algorithm not allowed"),
    (jwt.DecodeError, "malformed token"),
)


def _reason(exc: jwt.PyJWTError) -> str:
    for kind, reason in _REASONS:
        if isinstance(exc, kind):
            return reason
    return f"invalid token ({type(exc).__name__})"


class JWTBackend(Backend, Collector):
    kind = "jwt"
    calls_idp_per_review = False

    def __init__(
        self,
        settings: JWTSettings,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        budget: CallBudget = UNLIMITED,
    ) -> None:
        super().__init__(settings.name)
        self._s = settings
        #: Set by the gateway in fleet mode: key sets are shared through Redis.
        self.shared: SharedBlobs | None = None
        self._issuer = settings.issuer.url
        self._audiences = list(settings.issuer.audiences)
        self._client = client or issuer_client(settings)
        self._clock = clock
        k = settings.keys
        self.keys = KeySource(
            self._issuer,
            settings.discovery,
            self._client,
            KeyPolicy(
                min_refresh_seconds=k.min_refresh_seconds,
                default_refresh_seconds=k.refresh_seconds,
                max_refresh_seconds=k.max_refresh_seconds,
                max_stale_seconds=k.max_stale_seconds,
                max_backoff_seconds=k.max_backoff_seconds,
                deadline_seconds=settings.timeouts.total_seconds,
            ),
            # Every key fetch takes from the backend's outbound bucket.
            budget=budget,
            clock=clock,
            backend_name=settings.name,
            share=lambda: self.shared,
        )

    async def start(self) -> None:
        # The first fetch is tried before serving; an issuer that is down does not stop
        # the gateway (its reviews are unavailable until a fetch succeeds).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._s.timeouts.total_seconds + 1.0):
                await self.keys.refresh(force=True)
        self.keys.start()

    async def close(self) -> None:
        await self.keys.close()
        await self._client.aclose()

    def collector(self) -> Collector | None:
        return self

    def share_with_fleet(self, blobs: SharedBlobs) -> None:
        self.shared = blobs

    def collect(self) -> Iterable[Metric]:
        return self.keys.metric_families(METRIC_PREFIX)

    def could_accept(self, token: str) -> bool:
        # Unverified, only to route: the signature check decides.
        parsed = peek(token)
        return parsed is not None and self._issued_here(parsed)

    async def authenticate(self, token: str, wire: WireTime | None = None) -> Outcome:
        parsed = peek(token)
        if parsed is None:
            return Rejected("not a JWT")
        if not is_canonical(token):
            # One JWT, one spelling (RFC 7515 section 2): a padded or otherwise
            # re-spelled token would have a token id of its own.
            return Rejected("JWT not in canonical base64url (padding or stray characters)")
        if not self._issued_here(parsed):
            return Rejected("issuer mismatch")
        alg = parsed.alg
        if alg not in ASYMMETRIC_ALGS:
            # "none", HMAC, EdDSA and unknown algorithms, before any key is looked at.
            return Rejected("algorithm not allowed")
        kid = parsed.kid

        keys = self.keys.current()
        if keys is None or not keys.knows(kid):
            # Joins a fetch in flight; at most one new fetch per min_refresh_seconds.
            await self.keys.refresh()
            keys = self.keys.current()
        if keys is None:
            return Unavailable("no usable signing keys from the issuer")
        if not keys.knows(kid):
            self.keys.stats.unknown_kid_refused += 1
            return Rejected("unknown key id")
        candidates = keys.candidates(kid, alg)
        if not candidates:
            return Rejected("algorithm does not match the key")

        claims = None
        for key in candidates:
            try:
                # The signature only: the claims are checked below as kube checks them.
                claims = jwt.decode(token, key.key, algorithms=[alg], options=_SIGNATURE_ONLY)  # type: ignore[arg-type]
                break
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError as exc:
                return Rejected(_reason(exc))
        if claims is None:
            return Rejected("bad signature")
        problem = refusal(
            claims,
            issuer=self._issuer,
            audiences=self._audiences,
            now=self._clock(),
            nbf_leeway=self._s.clock_skew_seconds,
            groups_claim=self._s.claim_mappings.groups.claim
            if self._s.claim_mappings.groups
            else None,
        )
        if problem is not None:
            return Rejected(problem)
        user = map_claims(self._s, claims, credential_id=True)
        if isinstance(user, Rejected):
            return user
        return Authenticated(user, expires_at=float(expiry(claims)))

    def _issued_here(self, parsed: Unverified) -> bool:
        """oidc.go ``hasCorrectIssuer``: the unverified ``iss``, as Go reads it (a
        string, its key matched case-insensitively), Google's legacy one coalesced."""
        try:
            iss = unverified_issuer(parsed.claims)
        except Malformed:
            return False
        return iss == self._issuer


# PyJWT checks the signature and the header (alg, kid, crit); every claim rule is
# kube's, in backends.jwt.idtoken.
_SIGNATURE_ONLY: dict[str, Any] = {
    "verify_signature": True,
    "verify_exp": False,
    "verify_nbf": False,
    "verify_iat": False,
    "verify_aud": False,
    "verify_iss": False,
    "verify_sub": False,
    "verify_jti": False,
    "require": [],
}
