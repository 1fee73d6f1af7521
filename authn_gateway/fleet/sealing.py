"""Values the gateway keeps outside the process (Redis), signed with the gateway secret
and naming the secret that signed it by its key id (:attr:`TokenHasher.key_id`), so a
replica in the middle of a secret rotation checks the one signature that can match,
against its current secret or one of its ``previous_secrets``, never a trial of each.
``context`` binds a value to where it is stored (the cache key, the blob's name): a
genuine value copied elsewhere does not verify.

Two forms, both ``HMAC(secret, context || payload)`` over what follows:

* JSON documents (cache entries): ``HMAC || payload``, as before key ids, with the key
  id as the document's first field, ``{"v":"<16 hex>",...}``, read at that fixed place
  before any parsing. A replica of the previous version still verifies and reads
  them (it ignores the field), so a rolling upgrade shares the cache both ways.
* Opaque payloads (backends' shared blobs): ``MAGIC || key id || HMAC || payload``.

Values without a key id (written before it existed) verify against the secret the
reader names (``legacy``, default the current one): an upgrade empties nothing.
"""

from __future__ import annotations

import hmac

from authn_gateway.keyed_hashes import KEY_ID_BYTES, TokenHasher

SIGNATURE_BYTES = 32

# ---- JSON documents -------------------------------------------------------------

_DOC_HEAD = b'{"v":"'
_DOC_ID_END = len(_DOC_HEAD) + 2 * KEY_ID_BYTES


def document_fields(hasher: TokenHasher) -> dict[str, str]:
    """The field to put first in a document that :func:`seal_document` signs."""
    return {"v": hasher.key_id.hex()}


def seal_document(hasher: TokenHasher, context: bytes, payload: bytes) -> bytes:
    """``payload`` (a JSON document starting with :func:`document_fields`), signed."""
    return hasher.sign(context + payload) + payload


def document_key_id(raw: bytes) -> bytes | None:
    """The key id a sealed document names, from its fixed place; None if it names none."""
    payload = raw[SIGNATURE_BYTES:]
    if payload[: len(_DOC_HEAD)] != _DOC_HEAD or payload[_DOC_ID_END : _DOC_ID_END + 2] != b'",':
        return None
    try:
        return bytes.fromhex(payload[len(_DOC_HEAD) : _DOC_ID_END].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None


def unseal_document(
    hasher: TokenHasher, context: bytes, raw: bytes, legacy: TokenHasher | None = None
) -> bytes | None:
    """The payload, or None unless signed for ``context`` by the secret it names (the
    current one or a previous one); ``legacy`` for a document that names none."""
    signature, payload = raw[:SIGNATURE_BYTES], raw[SIGNATURE_BYTES:]
    if len(signature) != SIGNATURE_BYTES:
        return None
    key_id = document_key_id(raw)
    signer = (legacy or hasher) if key_id is None else hasher.signer(key_id)
    if signer is None:
        return None  # another secret's: one this replica does not accept
    return payload if hmac.compare_digest(signature, signer.sign(context + payload)) else None


# ---- opaque payloads ------------------------------------------------------------

MAGIC = b"k1"
_HEADER = len(MAGIC) + KEY_ID_BYTES


def seal(hasher: TokenHasher, context: bytes, payload: bytes) -> bytes:
    """``payload`` signed with the current secret, for ``context``."""
    return MAGIC + hasher.key_id + hasher.sign(context + payload) + payload


def unseal(
    hasher: TokenHasher, context: bytes, blob: bytes, legacy: TokenHasher | None = None
) -> bytes | None:
    """The payload, or None when ``blob`` is not a value signed for ``context`` by the
    current secret or a previous one (unsigned, tampered, moved, or another secret's)."""
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
