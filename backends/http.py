"""Shared HTTP plumbing for backends that talk to an IdP over HTTP(S).

One pooled :class:`httpx.AsyncClient` per backend, with the backend's deadlines and
TLS settings, over aiohttp's client (:mod:`backends.wire`), and one place that turns
transport failures and the IdP's "cannot answer" statuses into :class:`Unavailable`.
Per-call policy is a transport wrapper under the client (:mod:`backends.transports`,
and the call budget's :class:`~backends.budget.BudgetedTransport`); a 429's wait is
read by :mod:`backends.retry_after`.
"""

from __future__ import annotations

import ssl
from http.cookiejar import Cookie, CookieJar
from pathlib import Path
from typing import Annotated

import httpx

from backends.base import BackendConfigError, Rejected, Unavailable
from backends.budget import BudgetedTransport, CallBudget, CallHeldBack
from backends.durations import HOUR, count, finite
from backends.files import CA_BUNDLE_BYTES, FileRefused, read_pem, shown
from backends.retry_after import retry_after_seconds
from backends.settings import FilePath, Strict, TimeoutSettings
from backends.transports import AnswerRefused, BoundedAnswers, ResendIfDropped, TimedOnTheWire
from backends.wire import AiohttpWire


class TLSClientSettings(Strict):
    # PEM bundle of the CAs that sign the IdP's certificate; system store when unset.
    ca_file: FilePath | None = None
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


def ca_bundle(ca_file: Path, field: str = "tls.ca_file") -> str:
    """The PEM text of ``ca_file``, checked to hold CAs ssl takes. A file that is
    missing, not a regular file, past :data:`CA_BUNDLE_BYTES` or holds no certificate is
    one config error line naming the ``field`` (never a traceback or a hang in
    check-config, nor a failure found at the first connection)."""
    try:
        pem = read_pem(ca_file, CA_BUNDLE_BYTES)
    except FileRefused as exc:
        raise BackendConfigError(f"{field}: {exc}") from None
    if "-----BEGIN CERTIFICATE-----" not in pem:
        # Said in words (ssl's are "no start line"); and cadata="" would mean no cadata
        # at all: the system store, silently.
        raise BackendConfigError(f"{field}: {shown(ca_file)}: holds no PEM certificate")
    _trusting(pem, ca_file, field)
    return pem


def ca_context(ca_file: Path, field: str = "tls.ca_file") -> ssl.SSLContext:
    """A client TLS context that trusts the CAs in ``ca_file``, and only those
    (:func:`ca_bundle` says which files are refused)."""
    return _trusting(ca_bundle(ca_file, field), ca_file, field)


def _trusting(pem: str, ca_file: Path, field: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cadata=pem)
    except (ssl.SSLError, ValueError) as exc:
        raise BackendConfigError(
            f"{field}: {shown(ca_file)}: not a PEM CA bundle ({ssl_reason(exc)})"
        ) from None


def ssl_reason(exc: Exception) -> str:
    """What OpenSSL said, without where in _ssl.c: its own words, never the file's."""
    reason = getattr(exc, "reason", None)
    if isinstance(exc, ssl.SSLError) and not reason and len(exc.args) > 1:
        reason = str(exc.args[1]).split(" (_ssl.c:")[0]
    return str(reason or type(exc).__name__)


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
        verify = ca_context(tls.ca_file)
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
