"""Finite numbers for settings: durations, rates and counts, and their whole forms.

Every duration and rate field of the config is one of these: finite (``.inf``, ``.nan``
and ``1e400`` are refused with a line naming the field) and below a ceiling chosen for
its kind, so that no accepted value overflows where it becomes an int (uvicorn's
shutdown grace, Redis TTLs in milliseconds) or turns every review into an internal
error (an infinite timeout). The ceilings are documented in config/gateway.yaml.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Any

import annotated_types
import limits
from pydantic import BeforeValidator, Field

MINUTE = 60.0
HOUR = 60 * MINUTE
DAY = 24 * HOUR

#: One call, one request phase, one wait for an answer: kube-apiserver gives a review
#: 30 s at most, so 5 minutes is past anything that can still be useful.
TIMEOUT_MAX = 5 * MINUTE
#: Polls, refreshes, windows, backoffs, grace periods.
INTERVAL_MAX = DAY
#: How long something is kept: cache TTLs, stale limits, denial lengths.
AGE_MAX = 30 * DAY
#: Calls per second, either way (to an IdP, from a caller), and entries, lines, calls:
#: a billion is past any use (the benchmarks set it to mean "no limit") and far from
#: any overflow.
RATE_MAX = 1e9
COUNT_MAX = 1_000_000_000

YEAR = 366 * DAY

#: The longest time any whole-number form may hold (in Redis or uvicorn).
WHOLE_MAX_SECONDS = YEAR


def finite(*, le: float, gt: float | None = None, ge: float | None = None) -> Any:
    """The constraint of a float field (seconds, a share, a queue length): finite, and
    within ``(gt, le]`` or ``[ge, le]``."""
    return Field(gt=gt, ge=ge, le=le, allow_inf_nan=False)


class Whole(annotated_types.GroupedMetadata):
    """The constraints of an int field: ``[ge, le]``, and a value no int can be (an
    infinity, NaN, or an integer too long to read, which safe_yaml reads as infinity)
    said as what the field takes, not as pydantic's "Input should be a finite number"."""

    def __init__(self, *, ge: int, le: int) -> None:
        self.ge, self.le = ge, le

    def __iter__(self) -> Iterator[Any]:
        yield BeforeValidator(self._not_infinite)
        yield annotated_types.Ge(self.ge)
        yield annotated_types.Le(self.le)

    def _not_infinite(self, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            if value > 0:
                raise ValueError(f"must be a whole number at most {self.le}")
            if value < 0:
                raise ValueError(f"must be a whole number at least {self.ge}")
            raise ValueError(f"must be a whole number from {self.ge} to {self.le}")
        return value


def count(*, le: int = COUNT_MAX, ge: int = 1) -> Any:
    """The constraint of an int field: every one has a ceiling (:class:`Whole`)."""
    return Whole(ge=ge, le=le)


Timeout = Annotated[float, finite(gt=0, le=TIMEOUT_MAX)]
#: A wait that may be none at all (0).
Wait = Annotated[float, finite(ge=0, le=TIMEOUT_MAX)]
Interval = Annotated[float, finite(gt=0, le=INTERVAL_MAX)]
#: A lifetime that may be 0 (off).
Age = Annotated[float, finite(ge=0, le=AGE_MAX)]


def per_second(rate: str | float) -> float:
    """``"50/second"``, ``"3000/minute"`` or a plain number per second."""
    if isinstance(rate, int | float):
        return float(rate)
    try:
        item = limits.parse(rate)
        return float(item.amount / item.get_expiry())
    except (ValueError, OverflowError):
        # limits' own message quotes the text; a rate is never secret, but it may be long.
        raise ValueError("must be a number or a rate such as 50/second, 3000/minute") from None


#: Calls per second: a number, or limits' notation such as "3000/minute".
Rate = Annotated[
    float,
    BeforeValidator(lambda v: per_second(v) if isinstance(v, str) else v),
    finite(gt=0, le=RATE_MAX),
]


def whole_seconds(value: float, *, at_least: int = 0) -> int:
    """``value`` as whole seconds, clamped to ``[at_least, WHOLE_MAX_SECONDS]`` first:
    ``int()`` of an infinity raises, and of a huge float makes a number no API takes."""
    if math.isnan(value):
        return at_least
    return int(min(max(value, float(at_least)), WHOLE_MAX_SECONDS))


def whole_ms(value: float, *, at_least: int = 1) -> int:
    """``value`` seconds as whole milliseconds (Redis PX, PEXPIRE), clamped like
    :func:`whole_seconds`."""
    if math.isnan(value):
        return at_least
    return int(min(max(value * 1000, float(at_least)), WHOLE_MAX_SECONDS * 1000))
