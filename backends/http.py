"""Shared HTTP plumbing for backends that talk to an IdP over HTTP(S).

One pooled :class:`httpx.AsyncClient` per backend, with the backend's deadlines and
TLS settings, and one place that turns transport failures into :class:`Unavailable`.
Per-call policy is a transport wrapper under the client: the call budget
(:class:`~backends.budget.BudgetedTransport`) and :class:`ResendIfDropped`.
"""

from __future__ import annotations

import email.utils
import ssl
import time
from pathlib import Path

import httpx
from pydantic import Field

from .base import BackendConfigError, Unavailable
from .budget import BudgetedTransport, CallBudget, CallHeldBack
from .settings import Strict, TimeoutSettings


class TLSClientSettings(Strict):
    # PEM bundle of the CAs that sign the IdP's certificate; system store when unset.
    ca_file: Path | None = None
    # Turning verification off is for throwaway labs only; the gateway logs a warning.
    verify: bool = True


class PoolSettings(Strict):
    max_connections: int = Field(default=100, ge=1)
    max_keepalive_connections: int = Field(default=20, ge=0)
    # Some IdPs (Keystone behind uWSGI) close every connection; a short expiry keeps
    # the pool from handing out sockets the server already dropped.
    keepalive_expiry_seconds: float = Field(default=5.0, ge=0)


# What a request sent on a connection the server already closed runs into.
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class ResendIfDropped(httpx.AsyncBaseTransport):
    """Send; once more if the server had silently closed the pooled connection.

    uWSGI's http-socket (a usual way to serve Keystone) answers HTTP/1.1 without
    "Connection: close" and then closes. A request that reuses the socket before the
    FIN arrives is reset or gets no answer (15 of 100 back-to-back requests here). Once
    more is enough: the dead socket has left the pool, and older idle ones are checked
    before reuse. Timeouts and refused connections are the IdP's and are not resent.
    """

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except _DROPPED:
            return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


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
    transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport(
        verify=verify,
        limits=httpx.Limits(
            max_connections=pool.max_connections,
            max_keepalive_connections=pool.max_keepalive_connections,
            keepalive_expiry=pool.keepalive_expiry_seconds,
        ),
        trust_env=False,
    )
    if resend_if_dropped:
        transport = ResendIfDropped(transport)
    if budget is not None:
        # Outside the resend: a resent request is the same call, paid once.
        transport = BudgetedTransport(transport, budget)
    return httpx.AsyncClient(
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


def transport_failure(exc: httpx.HTTPError) -> Unavailable:
    """Map an httpx exception to a short, secret-free reason."""
    if isinstance(exc, CallHeldBack):
        return exc.outcome
    if isinstance(exc, httpx.TimeoutException):
        return Unavailable("timed out")
    if isinstance(exc, httpx.ConnectError):
        return Unavailable("connection failed")
    if isinstance(exc, httpx.RemoteProtocolError):
        return Unavailable("connection dropped")
    return Unavailable(f"transport error ({type(exc).__name__})")


def retry_after_seconds(response: httpx.Response, now: float | None = None) -> float | None:
    """Seconds to stay away, from ``Retry-After`` (delta or HTTP date) or ``RateLimit-Reset``."""
    now = time.time() if now is None else now
    value = response.headers.get("retry-after")
    if value:
        value = value.strip()
        if value.isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, when.timestamp() - now)
    reset = response.headers.get("ratelimit-reset")
    if reset and reset.strip().isdigit():
        # GitLab sends a Unix time here; small numbers are deltas (IETF draft form).
        seconds = float(reset)
        return max(0.0, seconds - now) if seconds > 1_000_000_000 else seconds
    return None


def server_failure(backend_kind: str, response: httpx.Response) -> Unavailable:
    """A status that means the IdP could not answer (5xx, 429)."""
    if response.status_code == 429:
        return Unavailable("rate limited by IdP (429)", retry_after=retry_after_seconds(response))
    return Unavailable(f"{backend_kind} answered {response.status_code}")
