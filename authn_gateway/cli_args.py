"""Numbers on the command line: each numeric flag of every subcommand (``serve --port``,
``admin --timeout``, ``admin deny --seconds``, ``admin force-open --seconds``) is parsed
by one of these, finite and bounded like the config field or API value it stands for.
A value past them is one line naming the flag (argparse puts ``argument --seconds:``
before the reason), never a traceback: ``--seconds 99999999999999999999999999`` was
"unexpected TypeError" once the request was encoded."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: Digits a whole number may have on the command line: the bounds are far below.
_DIGITS = 12


def whole(low: int, high: int, unit: str = "") -> Callable[[str], int]:
    """An argparse ``type``: a whole number from ``low`` to ``high`` (``unit``, if any,
    named in the message: "of seconds")."""
    words = f"must be a whole number{f' of {unit}' if unit else ''} from {low} to {high}"

    def parse(text: str) -> int:
        digits = text.strip().removeprefix("-")
        if not (digits.isascii() and digits.isdigit() and len(digits) <= _DIGITS):
            raise argparse.ArgumentTypeError(words)
        value = int(text.strip())
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(words)
        return value

    return parse


def seconds(high: float) -> Callable[[str], float]:
    """An argparse ``type``: seconds above 0 and at most ``high``; finite (``nan``,
    ``inf`` and ``1e400`` are past it)."""
    words = f"must be above 0 and at most {high:g} seconds"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(words) from None
        if not (math.isfinite(value) and 0 < value <= high):
            raise argparse.ArgumentTypeError(words)
        return value

    return parse
