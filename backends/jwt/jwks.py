"""An issuer's JWKS document, read into the keys tokens are verified with.

Each key is read on its own: a key that is malformed in any way (a field of the wrong
JSON type, a curve we do not know, numbers that do not make a key) is skipped, and
only it. A document with no usable key at all is :class:`UnusableJWKS`, and the key
set in use stays as it was. Nothing else is raised, whatever the document holds
(``tests/unit/test_jwks.py`` fuzzes it).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

import jwt

# kube-apiserver's list (oidc.go allowedSigningAlgs, all of them allowed with an
# AuthenticationConfiguration): RSA and ECDSA. "none" and HMAC are never accepted,
# whatever the token says (an HS256 token "signed" with the public key is the classic
# attack), and neither is EdDSA, which kube refuses.
RSA_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
ASYMMETRIC_ALGS = frozenset((*RSA_ALGS, *EC_ALGS.values()))

MAX_JWKS_BYTES = 512 * 1024

# What reading one key's numbers can raise, from PyJWT and the cryptography library
# under it: bad base64, a point not on the curve, an exponent too large, a missing
# member. Each means "this key is unusable", never "the document is".
_KEY_ERRORS = (
    jwt.PyJWKError,
    jwt.InvalidKeyError,
    ValueError,  # binascii.Error and UnicodeError among them
    TypeError,
    KeyError,
    OverflowError,
    binascii.Error,
)


class UnusableJWKS(Exception):
    """A document with no usable signature key; ``str()`` says why, secret-free."""


@dataclass(frozen=True, slots=True)
class VerificationKey:
    kid: str | None
    # What jwt.decode takes: a cryptography public key object.
    key: Any
    # The algorithms this key may verify; the token's "alg" must be one of them.
    algorithms: frozenset[str]


@dataclass(frozen=True, slots=True)
class KeySet:
    keys: tuple[VerificationKey, ...]
    fetched_at: float
    # Past this the set is stale: still used, but only because no fetch succeeded.
    fresh_until: float
    # The JWKS document as fetched, for sharing with the fleet.
    document: Any = None

    def candidates(self, kid: str | None, alg: str) -> list[VerificationKey]:
        return [k for k in self.keys if alg in k.algorithms and (kid is None or k.kid == kid)]

    def knows(self, kid: str | None) -> bool:
        return kid is None or any(k.kid == kid for k in self.keys)


def parse_jwks(doc: Any) -> tuple[VerificationKey, ...]:
    """The usable signature keys of a JWKS; every other entry is skipped on its own."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise UnusableJWKS("JWKS is not an object with a keys list")
    keys = [key for entry in doc["keys"] if (key := read_key(entry)) is not None]
    if not keys:
        raise UnusableJWKS("JWKS has no usable signature keys")
    return tuple(keys)


def read_key(entry: Any) -> VerificationKey | None:
    """One JWK as a verification key, or None when it is not a usable signature key."""
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None  # RFC 7517 section 4.2: an "enc" key does not verify signatures
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        return None  # a malformed kid must not turn into "no kid", which matches any token
    algs = _algorithms_for(entry)
    if not algs:
        return None
    try:
        parsed = jwt.PyJWK(entry, algorithm=min(algs))
    except _KEY_ERRORS:
        return None
    return VerificationKey(kid, parsed.key, algs)


def _algorithms_for(entry: dict[str, Any]) -> frozenset[str]:
    """The key decides the algorithm: its own "alg", else what its type allows."""
    kty, crv, declared = entry.get("kty"), entry.get("crv"), entry.get("alg")
    if not isinstance(kty, str) or not isinstance(crv, str | None):
        return frozenset()
    if declared is not None and not isinstance(declared, str):
        return frozenset()
    if kty == "RSA":
        allowed = frozenset(RSA_ALGS)
    elif kty == "EC" and crv in EC_ALGS:
        allowed = frozenset((EC_ALGS[crv],))
    else:
        return frozenset()  # "oct" (HMAC), "OKP" (EdDSA) and anything unknown
    if declared is None:
        return allowed
    return frozenset((declared,)) & allowed
