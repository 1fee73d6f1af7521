"""A compact JWS (``header.payload.signature``) and its one canonical spelling.

RFC 7515 section 2 encodes each segment as base64url *without* padding. Decoders
are laxer: PyJWT accepts ``=`` padding on any segment (and before 2.15 it also
skipped characters outside the alphabet), and Go's decoders ignore non-zero trailing
bits. The signing input is the header and payload as sent, so those two cannot be
re-spelled without breaking the signature, but the signature segment can: one JWT
then has several spellings, which must not mean several token ids (a denial by
token id is bypassed by adding ``==``).

So: :func:`is_canonical_segment` is the strict rule the jwt backend applies (a
token spelled any other way is refused), and :func:`canonical_spelling` is what the
gateway's token ids are computed from. It maps every spelling a lax decoder would
read as the same segments to the one canonical spelling, whichever backend (jwt,
introspection, an IdP's own verifier) ends up reading the token.
"""

from __future__ import annotations

import base64
import binascii
import re

_SEGMENT = re.compile(r"[A-Za-z0-9_-]*", re.ASCII)
# A canonical last character leaves the unused low bits zero: 4 of them when the
# segment's length is 2 (mod 4), 2 when it is 3 (mod 4).
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_ALPHABET_BYTES = _ALPHABET.encode("ascii")
_LAST_OF_2 = frozenset(_ALPHABET[::16])
_LAST_OF_3 = frozenset(_ALPHABET[::4])
# What a lax decoder skips: anything outside both base64 alphabets, padding included.
_SKIPPED = re.compile(r"[^A-Za-z0-9+/_-]", re.ASCII)
_TO_URLSAFE = str.maketrans("+/", "-_")


def _tail_is_canonical(segment: str) -> bool:
    rest = len(segment) % 4
    if rest == 0:
        return True
    if rest == 1:
        return False  # no byte string encodes to this length
    return segment[-1] in (_LAST_OF_2 if rest == 2 else _LAST_OF_3)


def _tail_ok(token: str, start: int, end: int) -> bool:
    """:func:`_tail_is_canonical` for ``token[start:end]``, without copying it."""
    rest = (end - start) % 4
    if rest == 0:
        return True
    return rest != 1 and token[end - 1] in (_LAST_OF_2 if rest == 2 else _LAST_OF_3)


def is_canonical_segment(segment: str) -> bool:
    """Base64url, no padding, no other character, unused trailing bits zero."""
    return _SEGMENT.fullmatch(segment) is not None and _tail_is_canonical(segment)


def _canonical_segment(segment: str) -> str | None:
    """The canonical spelling of what a lax decoder reads ``segment`` as; None if nothing."""
    core = _SKIPPED.sub("", segment).translate(_TO_URLSAFE)
    if len(core) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(core + "=" * (-len(core) % 4))
    except (binascii.Error, ValueError):
        return None
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def is_canonical(token: str) -> bool:
    """Three segments, each canonical base64url (:func:`is_canonical_segment`)."""
    if not token.isascii() or token.encode("ascii").translate(None, _ALPHABET_BYTES) != b"..":
        return False
    first, last = token.index("."), token.rindex(".")
    return (
        _tail_ok(token, 0, first)
        and _tail_ok(token, first + 1, last)
        and _tail_ok(token, last + 1, len(token))
    )


def canonical_spelling(token: str) -> str:
    """``token`` spelled canonically if it reads as a compact JWS, else ``token`` itself.

    On every review that logs a token id, so the usual cases stay cheap: a token that
    is three canonical segments, or plainly not three segments, costs one pass in C
    (about 1 us for a 780-character JWT, docs/decisions.md); only a JWS spelled some
    other way is decoded and re-encoded.
    """
    if token.count(".") != 2 or is_canonical(token):
        return token  # not a compact JWS (one pass in C), or already canonical
    parts = [_canonical_segment(s) for s in token.split(".")]
    if any(p is None for p in parts):
        return token
    return ".".join(p for p in parts if p is not None)
