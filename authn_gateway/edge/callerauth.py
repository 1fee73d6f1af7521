"""Who may ask for reviews: a client certificate, or a bearer caller token.

An open TokenReview endpoint is a token oracle and an amplifier toward the IdPs,
so when either mechanism is configured, a caller with neither is refused before
its body is read. Certificates are verified by the TLS handshake (see
:mod:`authn_gateway.edge.tls`); here only the verified names are matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from authn_gateway.config import ServerSettings

#: Scope keys set by the HTTP protocol (see :mod:`authn_gateway.serve.server`).
CALLER_KEY = "authn_gateway.caller"
CERT_NAMES_KEY = "authn_gateway.cert_names"
#: How a caller token's caller is named (review/clusters.py maps it to its cluster).
TOKEN_CALLER = "token:"


class CallerAuth:
    def __init__(self, settings: ServerSettings, prefer: frozenset[str] = frozenset()) -> None:
        self.required = settings.callers_must_authenticate
        self.allowed_subjects = frozenset(settings.allowed_subjects)
        # Certificate names that name a cluster (clusters[].subjects): a certificate with
        # several names is known by the one that says which cluster it is.
        self.prefer = prefer
        # The config refuses empty tokens; one that got here some other way is dropped
        # (its caller cannot authenticate) rather than compared.
        self.tokens = [
            (t.name, t.token.get_secret_value().strip().encode())
            for t in settings.caller_tokens
            if t.token.get_secret_value().strip()
        ]

    def identify(self, cert_names: Sequence[str], authorization: bytes | None) -> str | None:
        """The caller's identity, or None when it has neither an allowed certificate nor a
        valid token. The certificate names were verified by the handshake."""
        # A certificate name that reads like a caller token's identity ("token:prod")
        # would be that caller to the inbound limit and to clusters: never one.
        names = [n for n in cert_names if not n.startswith(TOKEN_CALLER)]
        if names:
            for name in names:
                if name in self.prefer:
                    return name
            if not self.allowed_subjects:
                return names[0]
            for name in names:
                if name in self.allowed_subjects:
                    return name
        if authorization is not None and self.tokens:
            owner = self._token_owner(authorization)
            if owner is not None:
                return TOKEN_CALLER + owner
        return None

    def _token_owner(self, authorization: bytes) -> str | None:
        given = bearer_token(authorization)
        if given is None:
            return None
        owner = None
        # Compare against every token, without stopping early, so the time taken says
        # nothing about which token (or how much of one) matched.
        for name, expected in self.tokens:
            if hmac.compare_digest(given, expected) and owner is None:
                owner = name
        return owner


def bearer_token(authorization: bytes) -> bytes | None:
    """The token of ``Bearer <token>`` (scheme case-insensitive, RFC 6750), or None when
    the scheme is another or the token is empty: an empty bearer matches nothing, even
    if an empty secret ever reached a comparison."""
    scheme, _, given = authorization.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    given = given.strip()
    return given or None
