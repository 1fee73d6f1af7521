"""Local pre-rejection: tokens no configured IdP could accept never leave the gateway.

Kubernetes service-account JWTs are the big one: kube-apiserver validates them
itself before it calls a webhook, so one that reaches us is expired, from another
cluster, or noise, and existing webhooks forward tens of thousands a minute to
their IdP. Per-backend rules (length, format) live with each backend.
"""

from __future__ import annotations

import base64
import binascii

import orjson

from authn_gateway.layers.base import Layer
from backends.base import Authenticator
from backends.settings import TokenRules

SERVICE_ACCOUNT_ISSUER = "kubernetes/serviceaccount"


def _jwt_claims(token: str) -> dict[str, object] | None:
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = orjson.loads(raw)
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def is_service_account_jwt(token: str) -> bool:
    # Every JWT header starts with base64url('{"'), i.e. "eyJ"; cheap enough for the hot path.
    if not token.startswith("eyJ"):
        return False
    claims = _jwt_claims(token)
    if claims is None:
        return False
    # Legacy secret-based tokens carry this issuer; bound tokens carry a "kubernetes.io" claim.
    return claims.get("iss") == SERVICE_ACCOUNT_ISSUER or "kubernetes.io" in claims


def prerejection_reason(token: str, reject_service_accounts: bool) -> str | None:
    """Why ``token`` can be rejected without asking anyone, or None."""
    if not token.isprintable() or " " in token:
        return "control_characters"
    if reject_service_accounts and is_service_account_jwt(token):
        return "service_account_jwt"
    return None


class TokenRulesFilter(Layer):
    """A backend's own pre-rejection (``token_rules``): tokens outside its length bounds
    never reach it. It sits right around the backend: every layer above passes
    :meth:`could_accept` straight through, and reviews only reach it on a cache miss."""

    def __init__(self, inner: Authenticator, rules: TokenRules) -> None:
        super().__init__(inner)
        accepts, lo, hi = inner.could_accept, rules.min_length, rules.max_length
        self.could_accept = lambda token: lo <= len(token) <= hi and accepts(token)
