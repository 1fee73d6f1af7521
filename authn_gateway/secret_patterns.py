"""The patterns a secret's strength estimate looks for (:mod:`.secret_strength`), each
with what writing it costs in bits: the estimate parses the string left to right and
writes, at each position, the pattern that saves the most over writing its characters
as themselves.

- **Back-references** (LZ77, as zlib's hash chains find them): an earlier copy of 4 or
  more characters, which also covers periods and runs ("repeats", "runs").
- **An alphabet in order**, up or down: digits and letters, the base64 alphabets,
  printable ASCII, and the keyboard's rows and columns ("in order").
- **Arithmetic progressions** of positions in one of those alphabets: every k-th
  character (``ADGJ...``: the base64 alphabet every 3rd), and up to :data:`MAX_LAG`
  such sequences interleaved (``aAbBcC...``, ``a0b1c2...``) ("steps").
- **Counters**: fixed-width numbers (2 to 8 digits of base 10, 16 or 64) each a constant
  step from the one before: ``000102...1f`` (``bytes(range(32)).hex()``),
  ``00000001000200030004``, ``00010203...39``, base64 of bytes 0..31 ("counts").
- **Keyboard walks**: each key a neighbour of the one before on a US QWERTY keyboard,
  shifted or not (``1qaz2wsx``, ``qazxswedc``) ("keyboard").

Each pattern is worth writing from :data:`MIN_PATTERN` characters on; what a pattern
costs is its parameters (which alphabet or step, its first characters, its length),
so that chance structure in random text saves little (docs/decisions.md).

Every table is built once per string in linear time: a pattern's length at a position
is then a lookup.
"""

from __future__ import annotations

import itertools
import math
import string

#: A pattern is worth writing as one from this many characters on: shorter ones come
#: by chance in random text too often to say anything.
MIN_PATTERN = 4
#: What writing "a pattern starts here" costs, on top of its parameters.
PATTERN_BITS = 2.0
#: Interleaved progressions: at most this many sequences.
MAX_LAG = 4

B64 = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
B64_URL = string.ascii_uppercase + string.ascii_lowercase + string.digits + "-_"

#: A US QWERTY keyboard: each row unshifted and shifted, and where its first key is
#: (in key widths from the left of the number row).
KEY_ROWS = (
    ("`1234567890-=", "~!@#$%^&*()_+", 0.0),
    ("qwertyuiop[]\\", "QWERTYUIOP{}|", 1.5),
    ("asdfghjkl;'", 'ASDFGHJKL:"', 1.75),
    ("zxcvbnm,./", "ZXCVBNM<>?", 2.25),
)


def _columns(shifted: bool) -> str:
    """The keyboard read down its columns, left to right: ``1qaz2wsx3edc...`` (each row
    below the number row starts half a key or more to the right: q is under 1 and 2)."""
    numbers, *letters = [str(row[1 if shifted else 0]) for row in KEY_ROWS]
    return "".join(
        numbers[col] + "".join(row[col - 1] for row in letters if col - 1 < len(row))
        for col in range(1, len(numbers))
    )


#: Orders a person (or a generator gone wrong) writes characters in.
ORDERS = (
    string.digits + string.ascii_lowercase,
    string.digits + string.ascii_uppercase,
    B64,
    B64_URL,
    "".join(chr(c) for c in range(33, 127)),  # printable ASCII
    "".join(row[0] for row in KEY_ROWS),  # the keyboard, row by row
    "".join(row[1] for row in KEY_ROWS),
    _columns(shifted=False),
    _columns(shifted=True),
)
#: The orders whose every k-th character, or k interleaved such sequences, is looked
#: for: the alphabets a generator writes in (not printable ASCII or the keyboard, whose
#: many characters would find chance progressions in a random password).
STEP_ORDERS = ORDERS[:4]
_NEXT: list[dict[str, str]] = [dict(itertools.pairwise(order)) for order in ORDERS]
_PREVIOUS: list[dict[str, str]] = [{b: a for a, b in n.items()} for n in _NEXT]
#: Digits of fixed-width numbers, each with its base.
NUMERALS = (
    string.digits,
    string.digits + "abcdef",
    string.digits + "ABCDEF",
    B64,
    B64_URL,
)
WIDTHS = range(2, 9)


def _neighbours() -> dict[str, frozenset[str]]:
    """Each key's neighbours on the keyboard (left, right, and the keys touching it in
    the rows above and below), shifted or not, and itself in the other shift."""
    where: dict[str, tuple[int, float]] = {}
    for r, (plain, shifted, offset) in enumerate(KEY_ROWS):
        for x, (a, b) in enumerate(zip(plain, shifted, strict=True)):
            where[a] = where[b] = (r, offset + x)
    near: dict[str, set[str]] = {c: set() for c in where}
    for a, (ra, xa) in where.items():
        for b, (rb, xb) in where.items():
            if a == b:
                continue
            same_key = (ra, xa) == (rb, xb)
            beside = ra == rb and abs(xa - xb) == 1
            touching = abs(ra - rb) == 1 and abs(xa - xb) <= 1
            if same_key or beside or touching:
                near[a].add(b)
    return {c: frozenset(n) for c, n in near.items()}


NEIGHBOURS = _neighbours()


class Patterns:
    """The patterns of one string (``text``, each character at ``per_char`` bits when
    written as itself): :meth:`best` at a position, :meth:`seen` as the parse moves on."""

    _CHAIN = 32

    def __init__(self, text: str, per_char: float) -> None:
        self.text = text
        self.per_char = per_char
        self.at: dict[str, list[int]] = {}
        #: At each position, the patterns other than back-references that start there.
        self.starting: list[list[tuple[int, float, str]]] = [[] for _ in text]
        self._ordered()
        self._progressions()
        self._counters()
        self._walks()

    def seen(self, i: int, length: int) -> None:
        """The parse wrote ``text[i : i + length]``: back-references may point there."""
        text = self.text
        for j in range(i, i + length):
            if j + MIN_PATTERN <= len(text):
                chain = self.at.setdefault(text[j : j + MIN_PATTERN], [])
                if len(chain) < self._CHAIN:
                    chain.append(j)

    def best(self, i: int) -> tuple[int, float, str]:
        """The pattern starting at ``i`` that saves the most bits: (length, cost,
        kind), or (0, 0, "") when writing the characters as themselves is as cheap."""
        best: tuple[int, float, str] = (0, 0.0, "")
        # A pattern must save a character's worth: one that saves less is as likely
        # chance, and taking it may cut short a better one starting inside it.
        saving = self.per_char
        length = self._longest_copy(i)
        if length >= MIN_PATTERN:
            cost = PATTERN_BITS + math.log2(i + 1) + math.log2(length)
            if length * self.per_char - cost > saving:
                best = (length, cost, self._kind(i, length, "repeats"))
                saving = length * self.per_char - cost
        for length, cost, kind in self.starting[i]:
            if length * self.per_char - cost > saving:
                best, saving = (length, cost, kind), length * self.per_char - cost
        return best

    def _add(self, i: int, length: int, cost: float, kind: str) -> None:
        if length >= MIN_PATTERN and length * self.per_char > cost:
            self.starting[i].append((length, cost, kind))

    def _ordered(self) -> None:
        """Runs of one character, and of consecutive characters of one order, up or
        down: which order and direction (or none), the first character, the length."""
        text = self.text
        choices = PATTERN_BITS + math.log2(1 + 2 * len(ORDERS)) + self.per_char
        same = _runs_from([a == b for a, b in itertools.pairwise(text)] + [False])
        longest = [1 + n for n in same]
        for step in (*_NEXT, *_PREVIOUS):
            runs = _runs_from([step.get(a) == b for a, b in itertools.pairwise(text)] + [False])
            longest = [max(a, 1 + b) for a, b in zip(longest, runs, strict=True)]
        for i, length in enumerate(longest):
            self._add(i, length, choices + math.log2(length), self._kind(i, length, "in order"))

    def _progressions(self) -> None:
        """``lag`` interleaved arithmetic progressions of positions in an order (each
        character the same step from the one ``lag`` before as that one was from its
        own): which order and lag, the first 2 * lag characters, the length."""
        text = self.text
        choices = PATTERN_BITS + math.log2(len(STEP_ORDERS) * MAX_LAG)
        for order in STEP_ORDERS:
            first = min(self.per_char, math.log2(len(order)))
            for lag, runs in enumerate(_progressions(text, order), start=1):
                for i in range(len(text) - 2 * lag):
                    if runs[i + 2 * lag] >= lag:  # each sequence takes a step
                        length = 2 * lag + runs[i + 2 * lag]
                        cost = choices + 2 * lag * first + math.log2(length)
                        self._add(i, length, cost, self._step_kind(i, length, lag, order))

    def _step_kind(self, i: int, length: int, lag: int, order: str) -> str:
        """What a progression is said as: a period when every step is 0, an alphabet in
        order when it is one sequence of steps of 1 (around the end of the alphabet:
        ``...xyz012``), else steps."""
        text = self.text
        if text[i : i + length - lag] == text[i + lag : i + length]:
            return self._kind(i, length, "repeats")
        step = (order.index(text[i + 1]) - order.index(text[i])) % len(order)
        return "in order" if lag == 1 and step in (1, len(order) - 1) else "steps"

    def _counters(self) -> None:
        """Fixed-width numbers each the same step from the one before: which digits and
        width, the first two numbers, how many."""
        choices = PATTERN_BITS + math.log2(len(NUMERALS) * len(WIDTHS))
        for digits in NUMERALS:
            for width in WIDTHS:
                first = 2 * width * math.log2(len(digits))
                for i, more in enumerate(_counters(self.text, digits, width)):
                    if more:
                        count = 2 + more
                        cost = choices + first + math.log2(count)
                        self._add(i, count * width, cost, "counts")

    def _walks(self) -> None:
        """Keys each a neighbour of the one before: the first key, then which neighbour
        each next one is (log2 of the previous key's neighbours)."""
        text = self.text
        flags, bits = [], [0.0]
        for a, b in itertools.pairwise(text):
            near = NEIGHBOURS.get(a)
            flags.append(near is not None and b in near)
            bits.append(bits[-1] + (math.log2(len(near)) if near else 0.0))
        flags.append(False)
        for i, steps in enumerate(_runs_from(flags)):
            if steps:
                length = 1 + steps
                cost = PATTERN_BITS + self.per_char + bits[i + steps] - bits[i]
                self._add(i, length, cost + math.log2(length), "keyboard")

    def _kind(self, i: int, length: int, kind: str) -> str:
        """``kind``, or "runs" when the pattern is one character over and over."""
        return "runs" if self.text[i : i + length] == self.text[i] * length else kind

    def _longest_copy(self, i: int) -> int:
        """The length of the longest earlier copy of what starts at ``i``."""
        text = self.text
        best = 0
        for j in self.at.get(text[i : i + MIN_PATTERN], ()):
            n = 0
            while i + n < len(text) and text[j + n] == text[i + n]:
                n += 1  # j + n may pass i: a copy of itself, a period or a run
            best = max(best, n)
        return best


def _runs_from(flags: list[bool], stride: int = 1) -> list[int]:
    """For each position, how many flags in a row are set from it on, every ``stride``."""
    runs = [0] * (len(flags) + stride)
    for j in range(len(flags) - 1, -1, -1):
        runs[j] = runs[j + stride] + 1 if flags[j] else 0
    return runs[: len(flags)]


def _progressions(text: str, order: str) -> list[list[int]]:
    """For each lag k (1 to :data:`MAX_LAG`): at each position j, how many characters in
    a row from j on continue k interleaved arithmetic progressions of positions in
    ``order`` (each the same step from the one k before as that one was from its own)."""
    n = len(order)
    place = {c: p for p, c in enumerate(order)}
    idx = [place.get(c, -1) for c in text]
    lags = []
    for k in range(1, MAX_LAG + 1):
        flags = [
            j >= 2 * k
            and min(idx[j], idx[j - k], idx[j - 2 * k]) >= 0
            and (idx[j] - 2 * idx[j - k] + idx[j - 2 * k]) % n == 0
            for j in range(len(text))
        ]
        lags.append(_runs_from(flags))
    return lags


def _counters(text: str, digits: str, width: int) -> list[int]:
    """At each position, how many ``width``-digit numbers in ``digits`` (the base is its
    length) in a row from there on are each the same step from the one before, beyond
    the first two (0: no counter starts there)."""
    base = len(digits)
    value = {c: v for v, c in enumerate(digits)}
    inside = _runs_from([c in value for c in text])
    numbers: list[int | None] = [None] * len(text)
    for j in range(len(text) - width + 1):
        if inside[j] >= width:
            number = 0
            for c in text[j : j + width]:
                number = number * base + value[c]
            numbers[j] = number
    modulus = base**width
    flags = []
    for j in range(len(text)):
        if inside[j] < 3 * width:
            flags.append(False)
            continue
        first, second, third = numbers[j], numbers[j + width], numbers[j + 2 * width]
        assert first is not None and second is not None and third is not None
        step = second - first
        flags.append((third - second - step) % modulus == 0 and step % modulus != 0)
    return _runs_from(flags, width)
