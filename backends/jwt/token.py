"""A JWT's unverified parts, for routing and key selection only.

Nothing read here is trusted: the header picks a key and the ``iss`` claim (read as
kube reads it, :func:`backends.jwt.idtoken.unverified_issuer`) picks a backend; the
signature check in :mod:`backends.jwt.backend` decides.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

import orjson

# A JWT bigger than this is not one we will parse (the gateway caps tokens anyway).
MAX_SEGMENT_CHARS = 16 * 1024


@dataclass(frozen=True, slots=True)
class Unverified:
    header: dict[str, Any]
    claims: dict[str, Any]

    @property
    def alg(self) -> str | None:
        alg = self.header.get("alg")
        return alg if isinstance(alg, str) else None

    @property
    def kid(self) -> str | None:
        kid = self.header.get("kid")
        return kid if isinstance(kid, str) else None


def _segment(text: str) -> dict[str, Any] | None:
    if not text or len(text) > MAX_SEGMENT_CHARS:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        value = orjson.loads(raw)
    except (binascii.Error, ValueError):
        return None
    return value if isinstance(value, dict) else None


def peek(token: str) -> Unverified | None:
    """Header and claims of a compact JWS, or None when the token is not one."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[2]:
        return None
    header = _segment(parts[0])
    claims = _segment(parts[1])
    if header is None or claims is None:
        return None
    return Unverified(header, claims)
