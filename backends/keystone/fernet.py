"""A fernet token's one spelling, as Keystone reads it.

Keystone issues a fernet token as url-safe base64 with its padding stripped. To
validate one it pads it again by its length (``TokenFormatter.restore_padding``) and
hands it to ``cryptography``'s Fernet, which decodes it with ``base64.urlsafe_b64decode``:
that skips characters outside the alphabet, takes ``+/`` for ``-_`` and ignores
non-zero trailing bits. So Keystone accepts one token in many spellings (Keystone 22:
padded, with more ``=``, in the standard alphabet, with ``!!!!`` or ``....`` inserted,
with other trailing bits; ``tests/process/test_keystone.py``), and all of them are
one credential: :func:`canonical_fernet` gives the spelling Keystone issued.
"""

from __future__ import annotations

import base64
import binascii
import re

from backends.jws import is_canonical_segment

#: Every fernet token starts with this version byte; its first base64 character is "g".
FERNET_VERSION = 0x80
# The first character a base64 decoder does not skip.
_FIRST_DIGIT = re.compile(r"[A-Za-z0-9+/_-]", re.ASCII)


def canonical_fernet(token: str) -> str:
    """``token`` as Keystone issues the fernet token it decodes to, or ``token`` itself
    when it decodes to none (a JWS token, anything else: its own spelling stands).
    Cheap for the tokens Keystone issues (one regex pass) and for JWTs (one search)."""
    if is_canonical_segment(token):
        return token  # as issued: url-safe, unpadded, trailing bits zero
    first = _FIRST_DIGIT.search(token)
    if first is None or first.group() != "g":
        return token  # decodes to no version byte 0x80: no fernet token
    try:
        # What Keystone does: pad by the length as sent, then Python's lax decoder.
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return token
    if not raw or raw[0] != FERNET_VERSION:
        return token
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
