"""Values the gateway keeps outside the process (Redis), signed with the gateway secret.

A sealed value is ``MAGIC || key id || HMAC(secret, context || payload) || payload``.
The key id (:attr:`TokenHasher.key_id`) names the secret that signed it, so a replica
in the middle of a secret rotation checks the one signature that can match, against
its current or one of its ``previous_secrets``, never a trial of each. ``context``
binds the value to where it is stored (the cache key, the blob's name): a genuine
value copied elsewhere does not verify.

Values written before key ids existed (``HMAC || payload``) still verify, against the
secret the reader names (``legacy``): an upgrade must not empty the shared cache.
They live at most one entry lifetime after the upgrade.
"""

from __future__ import annotations

import hmac

from .keys import KEY_ID_BYTES, TokenHasher

MAGIC = b"k1"
SIGNATURE_BYTES = 32
_HEADER = len(MAGIC) + KEY_ID_BYTES


def seal(hasher: TokenHasher, context: bytes, payload: bytes) -> bytes:
    """``payload`` signed with the current secret, for ``context``."""
    return MAGIC + hasher.key_id + hasher.sign(context + payload) + payload


def unseal(
    hasher: TokenHasher, context: bytes, blob: bytes, legacy: TokenHasher | None = None
) -> bytes | None:
    """The payload, or None when ``blob`` is not a value signed for ``context`` by the
    current secret or a previous one (unsigned, tampered, moved, or another secret's).

    ``legacy``: the secret an old-format value may be signed with (default: current).
    """
    if blob[: len(MAGIC)] == MAGIC and len(blob) >= _HEADER + SIGNATURE_BYTES:
        signer = hasher.signer(blob[len(MAGIC) : _HEADER])
        if signer is not None:
            body = _HEADER + SIGNATURE_BYTES
            signature, payload = blob[_HEADER:body], blob[body:]
            if hmac.compare_digest(signature, signer.sign(context + payload)):
                return payload
            return None
        # An unknown key id: another secret's value, or an old-format one whose
        # signature happens to start with MAGIC (1 in 65 536); checked as that below.
    signature, payload = blob[:SIGNATURE_BYTES], blob[SIGNATURE_BYTES:]
    if len(signature) != SIGNATURE_BYTES:
        return None
    check = legacy or hasher
    return payload if hmac.compare_digest(signature, check.sign(context + payload)) else None


def key_id_of(blob: bytes) -> str | None:
    """The hex key id a sealed value names (for logs: it is no secret), else None."""
    if blob[: len(MAGIC)] == MAGIC and len(blob) >= _HEADER + SIGNATURE_BYTES:
        return blob[len(MAGIC) : _HEADER].hex()
    return None
