"""The token: ``username:password`` (base64 or plain), what can never be valid, and the
one spelling of the credential it carries (:func:`canonical_token`)."""

from __future__ import annotations

import base64
import binascii
import unicodedata
from dataclasses import dataclass, field

from ldap3.core.exceptions import LDAPException, LDAPSASLPrepError
from ldap3.protocol.sasl.sasl import validate_simple_password

from backends.base import Rejected
from backends.ldap.settings import TokenFormat


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)


def parse_token(token: str, token_format: TokenFormat = "base64") -> Credentials | None:  # noqa: S107
    """``username:password`` from the token, or None when it can never be valid."""
    if token_format == "base64":
        try:
            text = base64.b64decode(token, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    else:
        text = token
    username, sep, password = text.partition(":")
    if not sep or not username.strip() or not password:
        return None
    # No directory name holds control characters, and a NUL would cut the name short
    # in C servers.
    if not username.isprintable():
        return None
    return Credentials(username, password)


def folded_name(username: str) -> str:
    """``username`` folded the way directories match a login name, and further: case
    (OpenLDAP's ``caseIgnoreMatch`` on ``uid`` and ``cn``, Active Directory), width and
    compatibility forms (NFKC, RFC 4518), spaces at either end and runs of them (RFC
    4518's insignificant spaces), and every combining mark (OpenLDAP takes ``ALİCE``,
    a dotted capital I, for ``alice``). Folding too far only gives two names the same
    token id when their passwords are the same too."""
    if username.isascii():
        name = username.lower()
    else:
        # Decomposed both before and after case folding, so no mark survives either.
        folded = unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", username).casefold())
        bare = "".join(c for c in folded if not unicodedata.category(c).startswith("M"))
        name = unicodedata.normalize("NFKC", bare)
    return " ".join(name.split())


def canonical_token(token: str, token_format: TokenFormat = "base64") -> str:  # noqa: S107
    """The one spelling of the credential in ``token`` (``Backend.credential``): the
    name folded (:func:`folded_name`), the password as the bind sends it (SASLprep,
    RFC 4013: a full-width ``alice`` binds as ``alice``), base64 in its canonical form (the
    decoder ignores non-zero trailing bits). ``token`` itself when it is no credential."""
    creds = parse_token(token, token_format)
    if creds is None:
        return token
    password = creds.password
    if not (password.isascii() and password.isprintable()):
        # SASLprep leaves printable ASCII as it is; anything else costs ~20 us, so only here.
        try:
            password = validate_simple_password(password).decode("utf-8")
        except (LDAPException, UnicodeDecodeError):
            return token  # no bind can carry it: never valid, nothing to fold
    text = f"{folded_name(creds.username)}:{password}"
    if token_format == "plain":
        return text
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


#: Why a password can never be valid: a simple bind sends it through SASLprep (RFC 4013,
#: RFC 4513 section 5.1.2), which refuses control characters, unassigned and private
#: code points, and mixed right-to-left and left-to-right text.
SASLPREP_REFUSAL = Rejected("password is not valid under SASLprep (RFC 4013)", "unsendable")


def sendable_password(password: str) -> bool:
    """Whether a simple bind can carry ``password`` (ldap3's own SASLprep check)."""
    try:
        validate_simple_password(password)
    except LDAPSASLPrepError:
        return False
    return True
