"""LDAP results and ldap3 exceptions as outcomes: a user's refusal, a configuration
problem, or the directory unavailable. Classified by result code and exception type,
never by message."""

from __future__ import annotations

import ssl
from typing import Any

from ldap3.core.exceptions import (
    LDAPCertificateError,
    LDAPCommunicationError,
    LDAPException,
    LDAPResponseTimeoutError,
    LDAPSocketOpenError,
    LDAPStartTLSError,
)

from backends.base import Outcome, Unavailable

# A user bind refused for reasons of that user: invalidCredentials (AD adds locked,
# disabled and expired as sub-codes), constraintViolation and unwillingToPerform (389 DS:
# lockout, inactivated account), noSuchObject and invalidDNSyntax (a DN built from what
# the user typed). These are rejections, never "unavailable": whatever a caller sends
# must not be able to open the breaker for everyone.
USER_REFUSALS = frozenset({19, 32, 34, 49, 53})
SIZE_LIMIT_EXCEEDED = 4
# Result codes that mean our configuration is wrong rather than the server being down:
# authMethodNotSupported, strongerAuthRequired, confidentialityRequired, noSuchObject
# (a wrong base), invalidDNSyntax, inappropriateAuthentication, insufficientAccessRights,
# unwillingToPerform, filterError.
MISCONFIGURED_CODES = frozenset({7, 8, 13, 32, 34, 48, 50, 53, 87})


class Done(Exception):
    """Ends an exchange early with its outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(type(outcome).__name__)
        self.outcome = outcome


def result_failure(result: dict[str, Any], during: str) -> Unavailable:
    """A non-success LDAP result (other than a user's invalid credentials)."""
    code = result.get("result")
    return Unavailable(
        f"{during}: {result.get('description', 'error')} ({code})",
        misconfigured=code in MISCONFIGURED_CODES,
    )


def _causes(exc: BaseException) -> list[BaseException]:
    # ldap3 raises LDAPSocketOpenError("unable to open socket", [(exc, address), ...])
    # when every address of a host failed; the real reasons are in that list.
    causes = [exc]
    if len(exc.args) > 1 and isinstance(exc.args[1], list):
        causes += [item[0] for item in exc.args[1] if isinstance(item, tuple) and item]
    return causes


def connection_failure(exc: LDAPException) -> Unavailable:
    """Map an ldap3 exception to a short, secret-free reason.

    ldap3 builds its socket exceptions as subclasses of both its own class and the
    original one (ssl.SSLCertVerificationError, TimeoutError, ...), so types tell.
    """
    causes = _causes(exc)

    def any_of(*types: type[BaseException]) -> bool:
        return any(isinstance(c, types) for c in causes)

    if any_of(ssl.SSLCertVerificationError, LDAPCertificateError):
        return Unavailable("TLS certificate verification failed", misconfigured=True)
    if any_of(TimeoutError, LDAPResponseTimeoutError):
        return Unavailable("timed out", timed_out=True)
    if any_of(ssl.SSLError):
        return Unavailable("TLS handshake failed", misconfigured=True)
    if any_of(LDAPStartTLSError):
        return Unavailable("StartTLS refused", misconfigured=True)
    if any_of(LDAPSocketOpenError):
        return Unavailable("connection failed")
    if any_of(LDAPCommunicationError):
        return Unavailable("connection dropped")
    return Unavailable(f"LDAP client error ({type(exc).__name__})")
