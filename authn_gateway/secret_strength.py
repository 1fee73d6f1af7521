"""How strong a secret the gateway's operator generates must be, and the type that says so.

The gateway secret, its previous secrets, the caller tokens and the admin token are
chosen by whoever deploys the gateway, so they can all be 32 random bytes; each one
guards something an attacker can try offline or at line rate (planted Redis entries,
token ids in logs against guessed LDAP passwords, the review port, the admin API).
Backend credentials (a Keystone or LDAP service password, an OAuth client secret) are
set by the IdP's owner: they are only refused when empty (:mod:`backends.settings`).
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import AfterValidator, SecretStr

from backends.settings import Secret

MIN_SECRET_BITS = 256
ADVICE = "use 32 random bytes, e.g. head -c 32 /dev/urandom | base64"
_PLACEHOLDER = re.compile(r"replace|change.?me|example|placeholder", re.IGNORECASE)


def secret_bits(value: str) -> float:
    """A conservative estimate of the entropy of a random-looking secret, in bits:
    hex counts 4 bits a character, base64 6, other printable text log2(94)."""
    text = value.rstrip("=")
    if re.fullmatch(r"[0-9a-fA-F]+", text):
        per_char = 4.0
    elif re.fullmatch(r"[A-Za-z0-9+/_-]+", text):
        per_char = 6.0
    else:
        per_char = math.log2(94)
    return len(text) * per_char


def secret_weakness(value: str) -> str | None:
    """Why ``value`` is too weak for a secret the operator generates, never quoting it;
    None if it is strong enough."""
    if not value.strip():
        return "must not be empty"
    if _PLACEHOLDER.search(value):
        return f"looks like a placeholder, not a generated secret; {ADVICE}"
    bits = secret_bits(value)
    if bits < MIN_SECRET_BITS or len(set(value)) < 10:
        return (
            f"too weak ({len(value)} characters, at most ~{bits:.0f} bits of "
            f"entropy, {MIN_SECRET_BITS} needed); {ADVICE}"
        )
    return None


def _strong(value: SecretStr) -> SecretStr:
    weakness = secret_weakness(value.get_secret_value())
    if weakness:
        raise ValueError(weakness)
    return value


#: A :data:`~backends.settings.Secret` (literal, ``env:`` or ``file:``) that must also
#: be strong: the operator generates it.
StrongSecret = Annotated[Secret, AfterValidator(_strong)]
