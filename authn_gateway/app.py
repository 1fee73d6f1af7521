"""The HTTP surface: the TokenReview endpoint, plus health, metrics and admin routes.

The review endpoint is a raw ASGI handler: it is the hot path, and starlette's
Request/Response objects would cost more than a cached review. Everything else is
an ordinary starlette app.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from backends.base import Authenticated, Unavailable

from .audit import AuditLog
from .breaker import Override
from .callerauth import CALLER_KEY, CERT_NAMES_KEY, CallerAuth
from .gateway import Gateway
from .internal_errors import internal_error
from .pipeline import GATEWAY, Verdict
from .reviewlog import ReviewLog
from .tokenreview import (
    BadReview,
    parse_review,
    render_authenticated,
    render_bad_request,
    render_unauthenticated,
)

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]


class TooLarge(Exception):
    pass


# The request headers the review path reads; one pass collects them.
_WANTED = frozenset({b"content-type", b"content-encoding", b"content-length", b"authorization"})


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k: bytes(v) for k, v in scope["headers"] if k in _WANTED}


async def _send(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = JSON_HEADERS + [(b"content-length", str(len(body)).encode())] + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive: Receive, limit: int) -> bytes:
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        # The usual case: the whole body in one message.
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise TooLarge
        return body
    return await _read_chunks(message, receive, limit)


async def _read_chunks(message: Message, receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise ConnectionResetError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


def caller_identity(scope: Scope) -> str:
    """Who is calling: the TLS client identity when there is one, else the source address."""
    identity = scope.get(CALLER_KEY)
    if identity:
        return str(identity)
    client = scope.get("client")
    return client[0] if client else "unknown"


class ReviewEndpoint:
    """POST <review_path>: TokenReview in, TokenReview out (see the answer rules in README)."""

    def __init__(self, gateway: Gateway, review_log: ReviewLog | None) -> None:
        self.gateway = gateway
        self.pipeline = gateway.pipeline
        self.metrics = gateway.metrics
        self.max_body = gateway.config.server.max_body_bytes
        self.review_log = review_log
        self.callers = CallerAuth(gateway.config.server)
        audit_to = gateway.config.server.audit_log
        self.audit_log = AuditLog(audit_to) if audit_to else None
        # Reviews running now; a config reload closes the old gateway once this is 0.
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        if self.callers.required:
            # Before anything else: an unknown caller learns nothing and costs nothing.
            caller = self.callers.identify(
                scope.get(CERT_NAMES_KEY, ()), headers.get(b"authorization")
            )
            if caller is None:
                await self._refuse(
                    send, 401, "caller not authenticated", [(b"www-authenticate", b"Bearer")]
                )
                return
            scope[CALLER_KEY] = caller
        if scope["method"] != "POST":
            await self._refuse(send, 405, "method must be POST", [(b"allow", b"POST")])
            return
        content_type = headers.get(b"content-type", b"")
        if (
            content_type != b"application/json"
            and content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
            await self._refuse(send, 400, "Content-Type must be application/json")
            return
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() != b"identity":
            await self._refuse(send, 400, "Content-Encoding is not supported")
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._refuse(send, 413, f"body larger than {self.max_body} bytes")
            return
        try:
            body = await _read_body(receive, self.max_body)
        except TooLarge:
            await self._refuse(send, 413, f"body larger than {self.max_body} bytes")
            return
        except ConnectionResetError:
            return
        try:
            review = parse_review(body)
        except BadReview as exc:
            await self._refuse(send, 400, str(exc))
            return

        started = time.perf_counter()
        caller = caller_identity(scope)
        try:
            verdict = await self.pipeline.review(review.token, review.audiences, caller)
        except Exception as exc:
            # Last line of defence: the answer rules never allow a 500.
            verdict = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
        outcome = verdict.outcome
        if isinstance(outcome, Authenticated):
            answer = "authenticated"
            body = render_authenticated(review.api_version, outcome.user, verdict.audiences)
        elif isinstance(outcome, Unavailable):
            answer = "unavailable"
            # Names the backend so operators can see who failed; carries no secrets.
            body = render_unauthenticated(
                review.api_version, f"{verdict.backend}: {outcome.reason}"
            )
        else:
            answer = "rejected"
            body = render_unauthenticated(review.api_version)
        await _send(send, 200, body)

        elapsed = time.perf_counter() - started
        self.metrics.review(review.api_version, verdict.backend, answer, elapsed)
        if self.review_log is None and self.audit_log is None:
            return
        token_id = self.gateway.hasher.token_id(review.token)
        if self.review_log is not None:
            user = outcome.user.username if isinstance(outcome, Authenticated) else None
            self.review_log.write(
                token=token_id,
                answer=answer,
                backend=verdict.backend,
                ms=round(elapsed * 1000, 2),
                cached=verdict.cached,
                stale=verdict.stale,
                user=user,
                reason=None if isinstance(outcome, Authenticated) else outcome.reason,
                caller=caller,
            )
        if self.audit_log is not None:
            self.audit_log.write(
                caller=caller,
                backend=verdict.backend,
                answer=answer,
                outcome=outcome,
                token_id=token_id,
                stale=verdict.stale,
            )

    def close_logs(self) -> None:
        if self.review_log is not None:
            self.review_log.flush()
        if self.audit_log is not None:
            self.audit_log.close()

    async def _refuse(
        self, send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.metrics.bad_requests.labels(str(status)).inc()
        await _send(send, status, render_bad_request(message), extra)


def ops_app(gateway: Gateway) -> Starlette:
    """/healthz, /readyz, /metrics and (when enabled) /admin/breakers."""

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(_: Request) -> Response:
        if gateway.ready:
            return PlainTextResponse("ready")
        return PlainTextResponse("not ready", status_code=503)

    async def metrics(_: Request) -> Response:
        gateway.metrics.cache_entries.set(len(gateway.state.cache_store()))
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]
    if gateway.config.admin.enabled:
        routes += admin_routes(gateway)
    return Starlette(routes=routes)


def admin_routes(gateway: Gateway) -> list[Route]:
    token = gateway.config.admin.token
    assert token is not None
    expected = f"Bearer {token.get_secret_value()}".encode()

    def allowed(request: Request) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    async def list_breakers(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"message": "unauthorized"}, status_code=401)
        return JSONResponse(
            {name: g.breaker.state for name, g in gateway.pipeline.backends.items()}
        )

    async def set_breaker(request: Request) -> Response:
        if not allowed(request):
            return JSONResponse({"message": "unauthorized"}, status_code=401)
        name = request.path_params["backend"]
        guarded = gateway.pipeline.backends.get(name)
        if guarded is None:
            return JSONResponse({"message": "no such backend"}, status_code=404)
        action = request.path_params["action"]
        overrides = {
            "force-open": Override.FORCED_OPEN,
            "force-closed": Override.FORCED_CLOSED,
            "release": Override.NONE,
        }
        if action not in overrides:
            return JSONResponse(
                {"message": "action must be force-open, force-closed or release"}, status_code=400
            )
        guarded.breaker.force(overrides[action])
        return JSONResponse({name: guarded.breaker.state})

    return [
        Route("/admin/breakers", list_breakers),
        Route("/admin/breakers/{backend}/{action}", set_breaker, methods=["POST"]),
    ]


class GatewayApp:
    """The ASGI application: review path first, then everything else, and the lifespan."""

    def __init__(self, gateway: Gateway) -> None:
        self._install(gateway)

    def _install(self, gateway: Gateway) -> None:
        self.gateway = gateway
        log_reviews = gateway.config.logging.reviews
        self.review_log = ReviewLog(gateway.config.logging.format) if log_reviews else None
        self.review_path = gateway.config.server.review_path
        self.review = ReviewEndpoint(gateway, self.review_log)
        self.ops = ops_app(gateway)

    def swap(self, gateway: Gateway) -> ReviewEndpoint:
        """Serve new requests with ``gateway`` (already started). Returns the old review
        endpoint: its reviews may still be running, see ``in_flight``."""
        old = self.review
        self._install(gateway)
        return old

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == self.review_path:
            review = self.review
            review.in_flight += 1
            try:
                await review(scope, receive, send)
            finally:
                review.in_flight -= 1
            return
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        await self.ops(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.gateway.start()
                except Exception as exc:
                    log.exception("start-up failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.gateway.close()
                self.review.close_logs()
                await send({"type": "lifespan.shutdown.complete"})
                return
