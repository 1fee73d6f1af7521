"""How strong a secret the gateway's operator generates must be, and the type that says so.

The gateway secret, its previous secrets, the caller tokens and the admin token are
chosen by whoever deploys the gateway, so they can all be 32 random bytes; each one
guards something an attacker can try offline or at line rate (planted Redis entries,
token ids in logs against guessed LDAP passwords, the review port, the admin API).
Backend credentials (a Keystone or LDAP service password, an OAuth client secret) are
set by the IdP's owner: they are only refused when empty (:mod:`backends.settings`).

The estimate reads the string's structure, not only its length: it is the length of a
small code for the string, as a compressor would write it (LZ77 back-references, which
also catch periods and runs, plus runs through an alphabet in order), where each
character written as itself costs what its alphabet holds (hex 4 bits, base64 6, other
printable text log2 94). ``"0123456789abcdef" * 4`` is 64 hex characters, 256 bits by
its length, but one run through the hex digits and one back-reference: ~25 bits.
"""

from __future__ import annotations

import itertools
import math
import re
import string
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator, SecretStr

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
#: Orders a person (or a generator gone wrong) writes characters in.
_ALPHABETS = (
    string.digits + string.ascii_lowercase,
    string.digits + string.ascii_uppercase,
    string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/",
    string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_",
    "".join(chr(c) for c in range(33, 127)),  # printable ASCII
)
_NEXT: list[dict[str, str]] = [dict(itertools.pairwise(order)) for order in _ALPHABETS]
_PREVIOUS: list[dict[str, str]] = [{b: a for a, b in n.items()} for n in _NEXT]
#: A pattern is worth writing as one from this many characters on: shorter ones come
#: by chance in random text too often to say anything.
_MIN_PATTERN = 4
#: What writing "a pattern starts here" costs, on top of its parameters.
_PATTERN_BITS = 2.0


@dataclass
class Strength:
    """A secret's estimate: bits by its alphabet and length (``nominal``), bits once
    its structure is counted (``bits``), and what the structure was."""

    nominal: float
    bits: float
    distinct: int
    #: Bits saved by each kind of pattern: "repeats", "runs", "in order".
    saved: dict[str, float] = field(default_factory=dict)


def _per_char(text: str) -> float:
    if re.fullmatch(r"[0-9a-fA-F]+", text):
        return 4.0
    if re.fullmatch(r"[A-Za-z0-9+/_-]+", text):
        return 6.0
    return math.log2(94)


def measure(value: str) -> Strength:
    """A conservative estimate of the entropy of ``value``, counting repeats, periods,
    runs and alphabets in order (see the module's docstring). Padding is not counted."""
    text = value.rstrip("=")
    if not text:
        return Strength(0.0, 0.0, 0)
    per_char = _per_char(text)
    read, rest = text[:_READ_CHARS], len(text) - min(len(text), _READ_CHARS)
    strength = Strength(len(text) * per_char, rest * per_char, len(set(text)))
    i, seen = 0, _FourGrams()
    while i < len(read):
        length, cost, kind = _best_pattern(read, i, per_char, seen)
        if length:
            strength.bits += cost
            strength.saved[kind] = strength.saved.get(kind, 0.0) + length * per_char - cost
        else:
            length = 1
            strength.bits += per_char
        for j in range(i, i + length):
            seen.add(read, j)
        i += length
    return strength


class _FourGrams:
    """Where each 4-character string began, for back-references (zlib's hash chains)."""

    _CHAIN = 32

    def __init__(self) -> None:
        self.at: dict[str, list[int]] = {}

    def add(self, text: str, i: int) -> None:
        if i + _MIN_PATTERN <= len(text):
            chain = self.at.setdefault(text[i : i + _MIN_PATTERN], [])
            if len(chain) < self._CHAIN:
                chain.append(i)

    def longest(self, text: str, i: int) -> tuple[int, int]:
        """The longest earlier copy of what starts at ``i``: (its length, distance)."""
        best, distance = 0, 0
        for j in self.at.get(text[i : i + _MIN_PATTERN], ()):
            n = 0
            while i + n < len(text) and text[j + n] == text[i + n]:
                n += 1  # j + n may pass i: a copy of itself, a period or a run
            if n > best:
                best, distance = n, i - j
        return best, distance


def _best_pattern(text: str, i: int, per_char: float, seen: _FourGrams) -> tuple[int, float, str]:
    """The pattern starting at ``i`` that saves the most bits: (length, cost, kind), or
    (0, 0, "") when writing the characters as themselves is as cheap."""
    best: tuple[int, float, str] = (0, 0.0, "")
    saving = 0.0
    length, distance = seen.longest(text, i)
    if length >= _MIN_PATTERN:
        cost = _PATTERN_BITS + math.log2(i + 1) + math.log2(length)
        kind = "runs" if distance == 1 else "repeats"
        if length * per_char - cost > saving:
            best, saving = (length, cost, kind), length * per_char - cost
    length, steps = _ordered_run(text, i)
    if length >= _MIN_PATTERN:
        # Which alphabet and direction (or none: one character over and over), the first
        # character, the length.
        cost = _PATTERN_BITS + math.log2(steps) + per_char + math.log2(length)
        if length * per_char - cost > saving:
            best = (length, cost, "runs" if _is_run(text, i, length) else "in order")
    return best


def _ordered_run(text: str, i: int) -> tuple[int, int]:
    """The longest run from ``i`` of one character repeated or of consecutive characters
    of one alphabet, up or down: (its length, how many such orders there are)."""
    longest = 1
    while i + longest < len(text) and text[i + longest] == text[i]:
        longest += 1
    for step in (*_NEXT, *_PREVIOUS):
        n = 1
        while i + n < len(text) and step.get(text[i + n - 1]) == text[i + n]:
            n += 1
        longest = max(longest, n)
    return longest, 1 + len(_NEXT) + len(_PREVIOUS)


def _is_run(text: str, i: int, length: int) -> bool:
    return text[i : i + length] == text[i] * length


def secret_weakness(value: str) -> str | None:
    """Why ``value`` is too weak for a secret the operator generates, never quoting it;
    None if it is strong enough. Each reason is said (too few distinct characters, a
    repeated pattern or character, an alphabet in order, too short), and the bits only
    when they are what falls short."""
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
    if not reasons:
        return None
    bits = (
        f": about {s.bits:.0f} bits, {MIN_SECRET_BITS} needed" if s.bits < MIN_SECRET_BITS else ""
    )
    return f"too weak ({'; '.join(reasons)}){bits}; {ADVICE}"


_SAYS = {
    "repeats": "repeats a pattern",
    "runs": "repeats one character",
    "in order": "follows an alphabet in order",
}


def _strong(value: SecretStr) -> SecretStr:
    weakness = secret_weakness(value.get_secret_value())
    if weakness:
        raise ValueError(weakness)
    return value


#: A :data:`~backends.settings.Secret` (literal, ``env:`` or ``file:``) that must also
#: be strong: the operator generates it.
StrongSecret = Annotated[Secret, AfterValidator(_strong)]
