"""Shared HTTP plumbing for backends that talk to an IdP over HTTP(S).

One pooled :class:`httpx.AsyncClient` per backend, with the backend's deadlines and
TLS settings, over aiohttp's client (:mod:`backends.wire`), and one place that turns
transport failures into :class:`Unavailable`.
Per-call policy is a transport wrapper under the client: the call budget
(:class:`~backends.budget.BudgetedTransport`) and :class:`ResendIfDropped`.
"""

from __future__ import annotations

import logging
import re
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from http.cookiejar import Cookie, CookieJar
from pathlib import Path
from typing import Annotated

import httpx

from backends.base import BackendConfigError, Rejected, Unavailable
from backends.budget import BudgetedTransport, CallBudget, CallHeldBack
from backends.context import WireTime
from backends.durations import HOUR, count, finite
from backends.settings import Strict, TimeoutSettings
from backends.wire import ANSWERED, BODY_READ, CONNECTING, SENDING, AiohttpWire

log = logging.getLogger(__name__)


class TLSClientSettings(Strict):
    # PEM bundle of the CAs that sign the IdP's certificate; system store when unset.
    ca_file: Path | None = None
    # Turning verification off is for throwaway labs only; the gateway logs a warning.
    verify: bool = True


class PoolSettings(Strict):
    max_connections: Annotated[int, count(le=100_000)] = 100
    # 0 turns keep-alive off. Any other value keeps it on: idle connections, up to
    # max_connections, close after keepalive_expiry_seconds (aiohttp's pool has no
    # separate cap on idle ones).
    max_keepalive_connections: Annotated[int, count(ge=0, le=100_000)] = 20
    # Some IdPs (Keystone behind uWSGI) close every connection; a short expiry keeps
    # the pool from handing out sockets the server already dropped.
    keepalive_expiry_seconds: Annotated[float, finite(ge=0, le=HOUR)] = 5.0


# What a request sent on a connection the server already closed runs into.
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


#: The request extension that carries a review's wire clock (:func:`on_the_wire`).
WIRE_KEY = "authn_gateway.wire_time"


def on_the_wire(
    wire: WireTime | None, extensions: Mapping[str, object] | None = None
) -> dict[str, object] | None:
    """A request's extensions with the review's wire clock added, so
    :class:`TimedOnTheWire` counts its time for that review (None: nothing to add)."""
    if wire is None:
        return dict(extensions) if extensions else None
    return {**(extensions or {}), WIRE_KEY: wire}


class TimedOnTheWire(httpx.AsyncBaseTransport):
    """Adds each request's time on the wire to the review's :class:`WireTime`, the one
    its request carries (:func:`on_the_wire`), from httpcore's trace events (HTTP/1.1)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        wire = request.extensions.get(WIRE_KEY)
        if not isinstance(wire, WireTime):
            return await self._inner.handle_async_request(request)
        outer_trace = request.extensions.get("trace")
        wire.requests += 1

        async def trace(event: str, info: dict[str, object]) -> None:
            if event in (CONNECTING, SENDING) and wire.pending is None:
                wire.pending = time.perf_counter()
            elif event == BODY_READ and wire.pending is not None:
                wire.add(wire.pending, time.perf_counter())
                wire.pending = None
            if outer_trace is not None:
                await outer_trace(event, info)

        request.extensions["trace"] = trace
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


class ResendIfDropped(httpx.AsyncBaseTransport):
    """Resend a request once, only in the case the resend exists for.

    uWSGI's http-socket (a usual way to serve Keystone) answers HTTP/1.1 without
    "Connection: close" and then closes. A request that reuses the idle socket before
    the FIN arrives is reset or gets no answer (15 of 100 back-to-back requests against
    the test Keystone). That case, and only it, is resent: the request went out on a
    *pooled* connection (httpcore's trace shows no new connection), it failed with a
    reset or a drop, and *no byte of an answer* came back (the response headers never
    arrived). The resend goes on a fresh connection, at most once, and only if the
    budget grants it a call. A reset on a fresh connection, a timeout or a refused
    connection is the server's failure and is never resent.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport, budget: CallBudget | None) -> None:
        self._inner = inner
        self._budget = budget
        self.resends = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        outer_trace = request.extensions.get("trace")
        seen: set[str] = set()

        async def trace(event: str, info: dict[str, object]) -> None:
            seen.add(event)
            if outer_trace is not None:
                await outer_trace(event, info)

        request.extensions["trace"] = trace
        try:
            return await self._inner.handle_async_request(request)
        except _DROPPED:
            if CONNECTING in seen or ANSWERED in seen:
                raise
            if self._budget is not None and not await self._budget.acquire(0.0):
                raise
            self.resends += 1
            seen.clear()
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


#: The most of an IdP's answer the gateway reads. Identity answers are kilobytes (a
#: Keystone token without its catalog, a userinfo document, a page of GitLab groups);
#: reading without bound would let a broken or hostile IdP (or a proxy's error page)
#: take the gateway's memory.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


class AnswerRefused(httpx.TransportError):
    """An IdP answer the gateway will not read: larger than :data:`MAX_ANSWER_BYTES`, or
    compressed although the request asked for none (a compressed body has no bound on
    what it inflates to). :func:`transport_failure` maps it to Unavailable; it is never
    resent."""


class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, limit: int, request: httpx.Request) -> None:
        self._inner = inner
        self._limit = limit
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self._inner:
            read += len(chunk)
            if read > self._limit:
                raise AnswerRefused(
                    f"answer larger than {self._limit} bytes", request=self._request
                )
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedAnswers(httpx.AsyncBaseTransport):
    """Asks for uncompressed answers and reads at most ``limit`` bytes of each."""

    def __init__(self, inner: httpx.AsyncBaseTransport, limit: int = MAX_ANSWER_BYTES) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        coding = response.headers.get("content-encoding", "identity").strip().lower()
        declared = response.headers.get("content-length", "")
        refusal = None
        if coding not in ("identity", ""):  # an empty header decodes as nothing, in httpx too
            refusal = f"compressed answer (Content-Encoding {coding[:20]!r}) to a request for none"
        elif declared.isdigit() and int(declared) > self._limit:
            refusal = f"answer larger than {self._limit} bytes (Content-Length)"
        if refusal is not None:
            await response.aclose()
            raise AnswerRefused(refusal, request=request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _CappedStream(response.stream, self._limit, request)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class KeepsNoCookies(CookieJar):
    """A cookie jar that stores nothing, for clients shared by every review.

    An httpx client keeps the cookies its answers set and sends them with every later
    request to that host. One client validates everyone's tokens, so a cookie set in
    answer to one user's call (GitLab's API, for one, authenticates a ``_gitlab_session``
    cookie) would travel with the next user's token. A validation call carries its own
    credential and nothing else.
    """

    def extract_cookies(self, response: object, request: object) -> None:
        return None

    def set_cookie(self, cookie: Cookie) -> None:
        return None


class _NoCookies(httpx.Cookies):
    """The cookies of an :class:`IdPClient`: none, and none read from answers."""

    def __init__(self) -> None:
        super().__init__(KeepsNoCookies())

    def extract_cookies(self, response: httpx.Response) -> None:
        # httpx builds a urllib request and response pair for every answer to offer
        # its Set-Cookie headers to the jar (a tenth of a call's CPU in a cProfile),
        # which KeepsNoCookies would then drop.
        return None


class IdPClient(httpx.AsyncClient):
    """The backends' httpx client: as httpx's, with a cookie store that keeps nothing
    and does no work per answer (see :class:`KeepsNoCookies` for why none is kept)."""

    _none = _NoCookies()

    @property
    def cookies(self) -> httpx.Cookies:
        return self._none

    @cookies.setter
    def cookies(self, cookies: object) -> None:
        # httpx's constructor sets them; an IdP client keeps none.
        return None


def pooled_wire(verify: ssl.SSLContext | bool, pool: PoolSettings) -> AiohttpWire:
    """The connection pool a backend's requests go out through."""
    return AiohttpWire(
        verify,
        max_connections=pool.max_connections,
        keepalive_expiry=pool.keepalive_expiry_seconds,
        # aiohttp keeps every idle connection up to max_connections for the expiry;
        # it has no separate cap on idle ones, so 0 (no keep-alive) is the one value
        # of max_keepalive_connections that changes how it pools.
        keepalive=pool.max_keepalive_connections > 0,
    )


def make_client(
    base_url: str,
    timeouts: TimeoutSettings,
    tls: TLSClientSettings,
    pool: PoolSettings | None = None,
    headers: dict[str, str] | None = None,
    budget: CallBudget | None = None,
    resend_if_dropped: bool = False,
) -> httpx.AsyncClient:
    """The backend's client; with ``budget``, every request not sent with
    ``extensions=PAID_BY_REVIEW`` takes from it (a refusal raises ``CallHeldBack``)."""
    pool = pool or PoolSettings()
    verify: ssl.SSLContext | bool = tls.verify
    if tls.verify and tls.ca_file is not None:
        try:
            verify = ssl.create_default_context(cafile=str(tls.ca_file))
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise BackendConfigError(f"tls.ca_file: cannot load {tls.ca_file}: {reason}") from None
    transport: httpx.AsyncBaseTransport = pooled_wire(verify, pool)
    transport = BoundedAnswers(transport)
    # Innermost but for the bound, so it sees every request actually written, resends
    # included.
    transport = TimedOnTheWire(transport)
    if resend_if_dropped:
        # A resend is one more request to the IdP: it takes from the budget itself.
        transport = ResendIfDropped(transport, budget)
    if budget is not None:
        transport = BudgetedTransport(transport, budget)
    return IdPClient(
        base_url=base_url,
        timeout=httpx.Timeout(
            timeouts.total_seconds,
            connect=timeouts.connect_seconds,
            read=timeouts.read_seconds,
        ),
        transport=transport,
        headers=headers,
        # An IdP never needs to redirect a validation call; following one could leak
        # the token to another host.
        follow_redirects=False,
        trust_env=False,
    )


def header_safe(token: str) -> bool:
    """Whether ``token`` can travel in an HTTP header as it is: visible ASCII, no spaces.

    RFC 6750 bearer tokens (and GitLab's, Keystone's) are a subset. kube-apiserver passes
    on any text a client sent, with bytes that are not UTF-8 turned into U+FFFD, and
    httpx cannot encode anything but ASCII into a header.
    """
    return token.isascii() and token.isprintable() and " " not in token


def unsendable(token: str) -> Rejected | None:
    """A refusal for a token no HTTP IdP can be sent, hence none can have issued; else None."""
    if header_safe(token):
        return None
    # Never the IdP's fault, so a plain refusal: it must not count against the breaker.
    return Rejected("token cannot be sent in an HTTP header (not visible ASCII)", "unsendable")


def transport_failure(exc: httpx.HTTPError) -> Unavailable:
    """Map an httpx exception to a short, secret-free reason."""
    if isinstance(exc, CallHeldBack):
        return exc.outcome
    if isinstance(exc, AnswerRefused):
        return Unavailable(f"IdP sent an unreadable answer: {exc}")
    if isinstance(exc, httpx.TimeoutException):
        return Unavailable("timed out", timed_out=True)
    if isinstance(exc, httpx.ConnectError):
        return Unavailable("connection failed")
    if isinstance(exc, httpx.RemoteProtocolError):
        return Unavailable("connection dropped")
    return Unavailable(f"transport error ({type(exc).__name__})")


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


def server_failure(
    backend_kind: str, response: httpx.Response, max_retry_after: float
) -> Unavailable:
    """A status that means the IdP could not answer (5xx, 429). A 429's wait is capped at
    ``max_retry_after`` (the backend's ``breaker.max_retry_after_seconds``)."""
    if response.status_code == 429:
        wait = retry_after_seconds(
            response, cap=max_retry_after, cap_name="breaker.max_retry_after_seconds"
        )
        return Unavailable("rate limited by IdP (429)", retry_after=wait)
    return Unavailable(f"{backend_kind} answered {response.status_code}")
