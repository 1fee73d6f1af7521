"""The transport wrappers under a backend's httpx client (:func:`backends.http.make_client`
stacks them): each request's time on the wire for its review (:class:`TimedOnTheWire`),
the one resend of a request a closing server dropped (:class:`ResendIfDropped`), and the
bound on what an answer may hold (:class:`BoundedAnswers`). Per-call policy lives here,
as httpx's transports hold it, not in the backends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping

import httpx

from backends.budget import CallBudget
from backends.context import WireTime
from backends.wire import ANSWERED, BODY_READ, CONNECTING, SENDING

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
