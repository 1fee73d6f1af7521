"""How strong a secret the gateway's operator generates must be, and the type that says so.

The gateway secret, its previous secrets, the caller tokens and the admin token are
chosen by whoever deploys the gateway, so they can all be 32 random bytes; each one
guards something an attacker can try offline or at line rate (planted Redis entries,
token ids in logs against guessed LDAP passwords, the review port, the admin API).
Backend credentials (a Keystone or LDAP service password, an OAuth client secret) are
set by the IdP's owner: they are only refused when empty (:mod:`backends.settings`).

The estimate reads the string's structure, not only its length: it is the length of a
small code for the string, where each character written as itself costs what its
alphabet holds (decimal 3.3 bits, hex 4, base64 6, other printable text log2 94) and a
pattern costs its parameters. The patterns (:mod:`authn_gateway.secret_patterns`):
back-references (repeats, periods, runs), runs through an alphabet in order (the
keyboard's rows and columns among them), arithmetic progressions of character codes
(every k-th character of an alphabet, and up to four such sequences interleaved),
counters in fixed-width numbers (``000102...1f``, ``00000001...``, base64 of
bytes 0..31), and walks over neighbouring keys of a keyboard. The string's deflate size
bounds the estimate too. ``"0123456789abcdef" * 4`` is 64 hex characters, 256 bits by its
length, but one run through the hex digits and one back-reference: ~25 bits.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator, SecretStr

from authn_gateway.secret_patterns import Patterns
from backends.settings import Secret

MIN_SECRET_BITS = 256
#: What chance structure may cost a random secret. Over 10^6 draws each of hex and
#: base64 of 32 random bytes the worst lost 25 and 21 bits, and one hex draw in 10^6
#: more than 24; the tail falls about eightfold every 4 bits, so at 40 a refused
#: random secret is a ~10^-10 event (docs/decisions.md, "Secret strength from
#: structure"). A generated secret must keep MIN_SECRET_BITS - SLACK_BITS (216) once
#: its structure is counted.
SLACK_BITS = 40
#: A generated secret of 43 base64 characters holds ~31 distinct ones, 64 hex ~16.
MIN_DISTINCT = 10
ADVICE = "use 32 random bytes, e.g. head -c 32 /dev/urandom | base64"
_PLACEHOLDER = re.compile(r"replace|change.?me|example|placeholder", re.IGNORECASE)

#: Only this much of a secret is read for structure; past it the rest counts at its
#: alphabet's rate (a secret file is at most 64 KiB, and 4 KiB already holds ~24,000 bits).
_READ_CHARS = 4096


@dataclass
class Strength:
    """A secret's estimate: bits by its alphabet and length (``nominal``), bits once
    its structure is counted (``bits``), and what the structure was."""

    nominal: float
    bits: float
    distinct: int
    #: Bits saved by each kind of pattern: "repeats", "runs", "in order", "steps",
    #: "counts", "keyboard", "compresses".
    saved: dict[str, float] = field(default_factory=dict)


def _per_char(text: str) -> float:
    if text.isascii() and text.isdigit():
        return math.log2(10)
    if re.fullmatch(r"[0-9a-fA-F]+", text):
        return 4.0
    if re.fullmatch(r"[A-Za-z0-9+/_-]+", text):
        return 6.0
    return math.log2(94)


def measure(value: str) -> Strength:
    """A conservative estimate of the entropy of ``value``, counting the patterns of
    the module's docstring. Base64's padding (one or two ``=`` after base64) is not
    counted; an ``=`` that ends a password is a character like any other."""
    text = _unpadded(value)
    if not text:
        return Strength(0.0, 0.0, 0)
    per_char = _per_char(text)
    read, rest = text[:_READ_CHARS], len(text) - min(len(text), _READ_CHARS)
    strength = Strength(len(text) * per_char, rest * per_char, len(set(text)))
    patterns = Patterns(read, per_char)
    i = 0
    while i < len(read):
        length, cost, kind = patterns.best(i)
        if length:
            strength.bits += cost
            strength.saved[kind] = strength.saved.get(kind, 0.0) + length * per_char - cost
        else:
            length = 1
            strength.bits += per_char
        patterns.seen(i, length)
        i += length
    # Deflate is a description of the string too (of its first _READ_CHARS).
    deflated = _deflated_bits(read) + rest * per_char
    if deflated < strength.bits:
        strength.saved["compresses"] = strength.bits - deflated
        strength.bits = deflated
    return strength


def _unpadded(value: str) -> str:
    text = value.rstrip("=")
    if len(value) - len(text) <= 2 and re.fullmatch(r"[A-Za-z0-9+/_-]*", text):
        return text
    return value


def _deflated_bits(text: str) -> float:
    """The bits of ``text`` deflated (raw, no header or checksum), at zlib's best."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, -15)
    return 8.0 * len(squeeze.compress(text.encode("utf-8", "surrogatepass")) + squeeze.flush())


def secret_weakness(value: str) -> str | None:
    """Why ``value`` is too weak for a secret the operator generates, never quoting it;
    None if it is strong enough. Each reason is said (too few distinct characters, a
    repeated pattern or character, an alphabet in order or in steps, a counter, a
    keyboard walk, too short), and the bits only when they are what falls short."""
    if not value.strip():
        return "must not be empty"
    if _PLACEHOLDER.search(value):
        return f"looks like a placeholder, not a generated secret; {ADVICE}"
    s = measure(value)
    reasons = []
    if s.distinct < MIN_DISTINCT:
        reasons.append(f"too few distinct characters: {s.distinct}")
    if s.bits < MIN_SECRET_BITS - SLACK_BITS:
        reasons += [_SAYS[kind] for kind, saved in sorted(s.saved.items()) if saved >= 8]
    if s.nominal < MIN_SECRET_BITS:
        reasons.append(f"too short: {len(value)} characters")
    if not reasons and s.bits < MIN_SECRET_BITS - SLACK_BITS:
        # Many small patterns, none worth 8 bits alone: the sum is the reason.
        reasons.append("too much structure")
    if not reasons:
        return None
    bits = (
        f": about {s.bits:.0f} bits, {MIN_SECRET_BITS} needed" if s.bits < MIN_SECRET_BITS else ""
    )
    return f"too weak ({'; '.join(reasons)}){bits}; {ADVICE}"


_SAYS = {
    "compresses": "compresses well",
    "counts": "counts up or down in fixed-width numbers",
    "in order": "follows an alphabet in order",
    "keyboard": "walks along the keyboard",
    "repeats": "repeats a pattern",
    "runs": "repeats one character",
    "steps": "steps through an alphabet at a stride or interleaves such sequences",
}


def _strong(value: SecretStr) -> SecretStr:
    weakness = secret_weakness(value.get_secret_value())
    if weakness:
        raise ValueError(weakness)
    return value


#: A :data:`~backends.settings.Secret` (literal, ``env:`` or ``file:``) that must also
#: be strong: the operator generates it.
StrongSecret = Annotated[Secret, AfterValidator(_strong)]
