"""How long an IdP asked us to stay away: ``Retry-After`` or else ``RateLimit-Reset``,
read strictly and capped (:func:`retry_after_seconds`), the one place either is read."""

from __future__ import annotations

import logging
import re
import time
from datetime import UTC, datetime

import httpx

log = logging.getLogger(__name__)


# RFC 9110 section 5.6.7: IMF-fixdate, and the obsolete RFC 850 and asctime forms a
# recipient must still accept. ASCII digits only (re.ASCII): "\d" would take "٣".
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
_HTTP_DATES = (
    re.compile(
        rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?P<d>\d\d) (?P<m>{_MONTHS}) (?P<y>\d{{4}}) "
        r"(?P<t>\d\d:\d\d:\d\d) GMT",
        re.ASCII,
    ),
    re.compile(
        rf"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (?P<d>\d\d)-"
        rf"(?P<m>{_MONTHS})-(?P<y>\d\d) (?P<t>\d\d:\d\d:\d\d) GMT",
        re.ASCII,
    ),
    re.compile(
        rf"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?P<m>{_MONTHS}) (?P<d>[ \d]\d) "
        r"(?P<t>\d\d:\d\d:\d\d) (?P<y>\d{4})",
        re.ASCII,
    ),
)
_DIGITS = re.compile(r"\d+", re.ASCII)
# Past this many digits a delay is "very long" either way; retry_after_seconds caps it,
# and int() refuses strings over 4300 digits.
_MAX_DIGITS = 12


def _integer(value: str) -> int | None:
    if not _DIGITS.fullmatch(value):
        return None
    return int(value) if len(value) <= _MAX_DIGITS else 10**_MAX_DIGITS


def http_date(value: str) -> float | None:
    """An HTTP date (RFC 9110 section 5.6.7) as Unix time, or None if it is not one."""
    for form in _HTTP_DATES:
        m = form.fullmatch(value)
        if m is None:
            continue
        year = int(m["y"])
        if year < 100:
            # RFC 850's two-digit year: the most recent year with those digits that is
            # not more than 50 years in the future (RFC 9110).
            this_year = datetime.now(UTC).year
            year += this_year - this_year % 100
            if year > this_year + 50:
                year -= 100
        hour, minute, second = (int(x) for x in m["t"].split(":"))
        try:
            when = datetime(
                year, _MONTHS.split("|").index(m["m"]) + 1, int(m["d"]), hour, minute,
                second, tzinfo=UTC,
            )  # fmt: skip
        except ValueError:  # 31 Feb, 25:00:00
            return None
        return when.timestamp()
    return None


def retry_after_seconds(
    response: httpx.Response, *, cap: float, cap_name: str, now: float | None = None
) -> float | None:
    """Seconds to stay away, from ``Retry-After`` or else ``RateLimit-Reset``, at most ``cap``.

    The one place the gateway reads either header: the breaker path (through
    :func:`server_failure`) and the jwt key fetch both take their waits from here, so
    no answer, from the IdP or whatever sits in front of it, can shut a path for years.
    ``cap_name`` is the setting ``cap`` comes from, for the log line that says a wait
    was cut.

    Parsed strictly: ``Retry-After`` is delay-seconds (ASCII digits) or an HTTP date;
    ``RateLimit-Reset`` is digits, a Unix time when larger than 10^9 (GitLab), else a
    delay (the IETF draft). Anything else is ignored with a warning. Never raises.
    """
    asked = _requested_wait(response, time.time() if now is None else now)
    if asked is None or asked <= cap:
        return asked
    log.warning("IdP asked to wait %.0fs; waiting %s (%gs) instead", asked, cap_name, cap)
    return cap


def _requested_wait(response: httpx.Response, now: float) -> float | None:
    value = response.headers.get("retry-after")
    if value is not None:
        value = value.strip()
        seconds = _integer(value)
        if seconds is not None:
            return float(seconds)
        when = http_date(value)
        if when is not None:
            return max(0.0, when - now)
        _ignored("Retry-After", value, "delay-seconds nor an HTTP date")
    reset = response.headers.get("ratelimit-reset")
    if reset is not None:
        reset = reset.strip()
        number = _integer(reset)
        if number is not None:
            return max(0.0, number - now) if number > 1_000_000_000 else float(number)
        _ignored("RateLimit-Reset", reset, "whole seconds nor a Unix time")
    return None


def _ignored(header: str, value: str, expected: str) -> None:
    # The IdP's own header, not a secret; cut short all the same.
    log.warning("IdP sent a %s that is neither %s (%r); ignored", header, expected, value[:40])
