"""The HTTP/1.1 wire under the backends' httpx clients: aiohttp's client.

httpx stays the backends' client (requests, auth flows, the transport wrappers of
:mod:`backends.http`); this transport replaces httpcore, h11 and anyio underneath it,
which cost 2.27 M instructions per IdP call against aiohttp's 0.29 M
(docs/decisions.md, "The IdP call goes out through aiohttp, under httpx").

What the wrappers above rely on is kept:

- every aiohttp exception is classified here, where it happens, into the httpx
  exception of the same meaning: a refused connection is a ``ConnectError``, a reset
  a ``ReadError``, a close without an answer a ``RemoteProtocolError``, a timeout
  the ``ConnectTimeout`` or ``ReadTimeout`` of its phase;
- aiohttp's own resend of an idempotent request after a drop is turned off
  (:func:`_never_resend`): :class:`~backends.transports.ResendIfDropped` makes the one
  resend there is, on a pooled connection only, paid from the call budget;
- a connection is reused only when its last answer arrived whole and nothing came
  after it (:mod:`backends.one_answer`): an answer belongs to exactly one request;
- the request's ``trace`` extension gets httpcore's event names, so
  :class:`~backends.transports.TimedOnTheWire` and ``ResendIfDropped`` see when a connection
  was made, when a request went out, when its answer's headers came in and when its
  body had all arrived.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx
from yarl import URL

from backends.one_answer import TESTED_AIOHTTP_MINORS, guarded_connector, untested_aiohttp

log = logging.getLogger(__name__)

#: httpcore's trace events, which the wrappers in backends.http listen for.
CONNECTING = "connection.connect_tcp.started"
SENDING = "http11.send_request_headers.started"
ANSWERED = "http11.receive_response_headers.complete"
BODY_READ = "http11.receive_response_body.complete"

#: The longest header line an answer may have. h11 allowed a 16 KiB head; aiohttp's
#: default of 8190 bytes a line would refuse a long X-Subject-Token or Link header
#: that worked before.
MAX_HEADER_LINE = 16 * 1024

Trace = Callable[[str, dict[str, object]], Awaitable[None]]


class _Dropped(aiohttp.ClientError):
    """A reset or a close on a connection, re-raised as a type aiohttp does not resend."""

    def __init__(self, cause: aiohttp.ClientError) -> None:
        super().__init__(str(cause))
        self.cause = cause


async def _never_resend(
    request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
) -> aiohttp.ClientResponse:
    """aiohttp resends an idempotent request once after any ``ClientOSError`` or
    ``ServerDisconnectedError``, on a fresh connection too and without the budget. Raised
    as :class:`_Dropped`, such a failure reaches the httpx wrappers, which decide."""
    try:
        return await handler(request)
    except aiohttp.ClientConnectorError:
        raise  # not resent by aiohttp either: a connection that was never made
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as exc:
        raise _Dropped(exc) from exc


def _tracer(event: str) -> Callable[[Any, SimpleNamespace, object], Awaitable[None]]:
    async def send(_session: Any, context: SimpleNamespace, _params: object) -> None:
        trace: Trace | None = context.trace_request_ctx
        if trace is not None:
            await trace(event, {})

    return send


def _trace_config() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_connection_create_start.append(_tracer(CONNECTING))
    config.on_connection_reuseconn.append(_tracer(SENDING))
    config.on_request_end.append(_tracer(ANSWERED))
    return config


def _classified(exc: BaseException, request: httpx.Request, reading_body: bool) -> httpx.HTTPError:
    """The httpx exception for an aiohttp failure, by type and by phase."""
    cause = exc.cause if isinstance(exc, _Dropped) else exc
    message = str(cause) or type(cause).__name__
    if isinstance(cause, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(cause, TimeoutError):  # aiohttp's socket read timeout, or a bare one
        return httpx.ReadTimeout(message, request=request)
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(cause, aiohttp.ServerDisconnectedError):
        # No answer, or a body cut short by the close.
        return httpx.RemoteProtocolError(message, request=request)
    if isinstance(cause, aiohttp.ClientOSError):
        return httpx.ReadError(message, request=request)
    if isinstance(cause, (aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        # A malformed answer (status line, headers, chunked framing) or a body shorter
        # than its Content-Length.
        return httpx.RemoteProtocolError(message, request=request)
    if reading_body:
        return httpx.ReadError(message, request=request)
    return httpx.TransportError(f"{type(cause).__name__}: {message}", request=request)


class _Body(httpx.AsyncByteStream):
    """The answer's body, read as it arrives; :data:`BODY_READ` when it all has."""

    def __init__(
        self, response: aiohttp.ClientResponse, request: httpx.Request, trace: Trace | None
    ) -> None:
        self._response = response
        self._request = request
        self._trace = trace

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _classified(exc, self._request, reading_body=True) from None
            if not chunk:
                if self._trace is not None:
                    await self._trace(BODY_READ, {})
                return
            yield chunk

    async def aclose(self) -> None:
        # Back to the pool when the whole body came off the wire; closed otherwise (an
        # answer refused for its size, a read cut short): OneAnswerHandler.should_close.
        self._response.release()


class AiohttpWire(httpx.AsyncBaseTransport):
    """An httpx transport that sends each request with one pooled aiohttp session.

    The session is made on the first request, inside the event loop that uses it.
    ``max_connections`` bounds the pool; idle connections close after
    ``keepalive_expiry`` seconds, or at once when ``keepalive`` is false.
    """

    def __init__(
        self,
        verify: ssl.SSLContext | bool,
        max_connections: int,
        keepalive_expiry: float,
        keepalive: bool = True,
    ) -> None:
        self._ssl: ssl.SSLContext | bool = verify
        if verify is True:
            # The system's trust store, as the reference config says (httpx had used
            # certifi's bundle): a private CA goes in tls.ca_file or the image's store.
            self._ssl = ssl.create_default_context()
        self._max_connections = max_connections
        self._keepalive_expiry = keepalive_expiry
        self._keepalive = keepalive and keepalive_expiry > 0
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        untested = untested_aiohttp()
        if untested is not None:
            log.warning(
                "aiohttp %s is not a release the IdP wire is tested with (%s): install "
                "the version pyproject.toml pins",
                untested,
                ", ".join(f"{m}.x" for m in TESTED_AIOHTTP_MINORS),
            )
        connector = guarded_connector(
            ssl=self._ssl,
            limit=self._max_connections,
            keepalive_timeout=self._keepalive_expiry if self._keepalive else None,
            force_close=not self._keepalive,
        )
        return aiohttp.ClientSession(
            connector=connector,
            # httpx above keeps the cookies (none, see KeepsNoCookies), the redirects
            # (none) and the decoding (BoundedAnswers refuses compressed answers).
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
            trace_configs=[_trace_config()],
            middlewares=(_never_resend,),
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            self._session = self._open()
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        pool, connect = timeouts.get("pool"), timeouts.get("connect")
        timeout = aiohttp.ClientTimeout(
            total=None,
            # Waiting for a pooled connection and making one, as httpx's pool and
            # connect timeouts together.
            connect=None if pool is None or connect is None else pool + connect,
            sock_connect=connect,
            sock_read=timeouts.get("read"),
        )
        body = await request.aread()
        trace: Trace | None = request.extensions.get("trace")
        try:
            response = await self._session.request(
                request.method,
                URL(str(request.url), encoded=True),
                headers=request.headers.multi_items(),
                data=body or None,
                allow_redirects=False,
                timeout=timeout,
                trace_request_ctx=trace,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _classified(exc, request, reading_body=False) from None
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, request, trace),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode("latin-1", "replace"),
            },
        )

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
