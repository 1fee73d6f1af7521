"""Every Retry-After the gateway honours goes through one helper, which parses strictly
and caps (``backends/retry_after.py`` ``retry_after_seconds``). Listed cases, a property over
arbitrary header bytes, and the jwt key fetch against the fake issuer over real sockets:
one 429 asking for ten years holds key fetches back no longer than the cap."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.base import Authenticated
from backends.retry_after import retry_after_seconds
from tests.support.fakes.issuer import JWKS_PATH, FakeIssuer
from tests.support.jwt_backend import jwt_settings, running

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z

CAP = 300.0

NO_CAP = 1e13  # above anything the parser returns: the listed cases see the parse alone


def throttled(**headers: bytes) -> httpx.Response:
    return httpx.Response(
        429, headers=[(k.replace("_", "-").encode(), v) for k, v in headers.items()]
    )


def wait(response: httpx.Response, cap: float = NO_CAP) -> float | None:
    return retry_after_seconds(response, cap=cap, cap_name="test.cap", now=NOW)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"30", 30.0),
        (b" 7 ", 7.0),
        (b"315360000", 315360000.0),
        (b"9" * 5000, 1e12),  # past int()'s 4300-digit limit: "very long"
        (b"Fri, 15 Jan 2027 08:00:30 GMT", 30.0),  # IMF-fixdate
        (b"Friday, 15-Jan-27 08:00:30 GMT", 30.0),  # RFC 850
        (b"Fri Jan 15 08:00:30 2027", 30.0),  # asctime
        (b"Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past: no wait
    ],
)
def test_retry_after_is_delay_seconds_or_an_http_date(value: bytes, seconds: float) -> None:
    assert wait(throttled(retry_after=value)) == seconds


@pytest.mark.parametrize(
    "value",
    [b"1e20", b"-5", b"30.5", b"0x10", b"\xd9\xa3", b"\xc2\xb2", b"soon", b"",
     b"Fri, 31 Feb 2027 08:00:30 GMT", b"Fri, 15 Jan 2027 08:00:30 +0100", b"nan", b"inf"],
)  # fmt: skip
def test_a_retry_after_that_does_not_parse_is_ignored(
    value: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    assert wait(throttled(retry_after=value)) is None
    assert "Retry-After that is neither delay-seconds nor an HTTP date" in caplog.text


def test_ratelimit_reset_is_a_unix_time_or_a_delay_and_only_digits() -> None:
    at = str(int(NOW) + 40).encode()
    assert wait(throttled(ratelimit_reset=at)) == 40.0
    assert wait(throttled(ratelimit_reset=b"12")) == 12.0
    assert wait(throttled(ratelimit_reset=b"1e20")) is None
    # Retry-After first; one that does not parse falls through to RateLimit-Reset.
    assert wait(throttled(retry_after=b"5", ratelimit_reset=b"12")) == 5.0
    assert wait(throttled(retry_after=b"soon", ratelimit_reset=b"12")) == 12.0


@pytest.mark.parametrize(
    "headers",
    [
        {"retry_after": b"315360000"},
        {"retry_after": b"Fri, 01 Jan 2100 00:00:00 GMT"},
        {"ratelimit_reset": str(int(NOW) + 315360000).encode()},
        {"retry_after": b"9" * 5000},
    ],
)
def test_a_wait_of_years_is_cut_to_the_cap_and_says_so(
    headers: dict[str, bytes], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        assert wait(throttled(**headers), cap=CAP) == CAP
    assert "waiting test.cap (300s) instead" in caplog.text


header_bytes = st.one_of(
    st.binary(max_size=80),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(min_value=-(10**20), max_value=10**40).map(lambda n: str(n).encode()),
    st.from_regex(rb"\A[ \t]*[0-9]{0,30}[ \t]*\Z"),
)

caps = st.floats(min_value=0.001, max_value=1e9, allow_nan=False)


@given(retry_after=st.none() | header_bytes, reset=st.none() | header_bytes, cap=caps)
def test_any_header_bytes_give_no_wait_or_one_within_the_cap(
    retry_after: bytes | None, reset: bytes | None, cap: float
) -> None:
    headers: dict[str, bytes] = {}
    if retry_after is not None:
        headers["retry_after"] = retry_after
    if reset is not None:
        headers["ratelimit_reset"] = reset
    seconds = wait(throttled(**headers), cap=cap)
    assert seconds is None or 0.0 <= seconds <= cap, (headers, cap, seconds)


@given(n=st.integers(min_value=0, max_value=10**30), cap=caps)
def test_delay_seconds_are_honoured_up_to_the_cap(n: int, cap: float) -> None:
    asked = float(n) if len(str(n)) <= 12 else 1e12
    assert wait(throttled(retry_after=str(n).encode()), cap=cap) == min(asked, cap)


@given(
    when=st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(9999, 12, 31), timezones=st.just(UTC)
    ),
    cap=caps,
)
def test_http_dates_are_honoured_up_to_the_cap(when: datetime, cap: float) -> None:
    when = when.replace(microsecond=0)
    value = when.strftime("%a, %d %b %Y %H:%M:%S GMT").encode()
    expected = min(max(0.0, when.timestamp() - NOW), cap)
    assert wait(throttled(retry_after=value), cap=cap) == pytest.approx(expected)


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    fake = FakeIssuer().start_in_thread()
    try:
        yield fake
    finally:
        fake.stop()


async def until(condition: Any, seconds: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, what
        await asyncio.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.parametrize(
    ("status", "retry_after"),
    [(429, "315360000"), (503, "Fri, 01 Jan 2100 00:00:00 GMT")],
)
async def test_an_issuer_asking_for_ten_years_holds_key_fetches_back_only_to_the_cap(
    issuer: FakeIssuer, caplog: pytest.LogCaptureFixture, status: int, retry_after: str
) -> None:
    issuer.configure(status=status, retry_after=retry_after)
    keys = {"min_refresh_seconds": 0.2, "max_backoff_seconds": 1.0}
    caplog.set_level(logging.WARNING)
    async with running(jwt_settings(issuer, keys=keys)) as backend:
        assert backend.keys.current() is None
        assert issuer.stats().calls >= 1
        assert "waiting keys.max_backoff_seconds (1s) instead" in caplog.text
        issuer.configure(status=None, retry_after=None)
        # No review asks: the background refresh alone fetches again, after the cap.
        took = await until(lambda: backend.keys.current() is not None, 3.0, "never refetched")
        assert 0.5 <= took <= 2.0, took
        assert issuer.path_calls(JWKS_PATH) == 1
        outcome = await backend.authenticate(issuer.mint(issuer.claims()))
        assert isinstance(outcome, Authenticated), outcome


async def test_a_retry_after_within_the_cap_is_honoured_in_full(issuer: FakeIssuer) -> None:
    issuer.configure(status=429, retry_after=2)
    keys = {"min_refresh_seconds": 0.2, "max_backoff_seconds": 30.0}
    async with running(jwt_settings(issuer, keys=keys)) as backend:
        calls = issuer.stats().calls
        issuer.configure(status=None, retry_after=None)
        await asyncio.sleep(1.2)
        # Asked for 2 s, more than the back-off's 0.2: nothing yet, a review included.
        await backend.keys.refresh()
        assert issuer.stats().calls == calls
        took = await until(lambda: backend.keys.current() is not None, 3.0, "never refetched")
        assert took <= 2.0, took
