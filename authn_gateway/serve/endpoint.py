"""The TokenReview endpoint: a raw ASGI handler, and the same review answered at once.

It is the hot path, and starlette's Request/Response objects would cost more than a
cached review. Health, metrics and admin routes are an ordinary starlette app
(:mod:`.ops`). :meth:`ReviewEndpoint.answer_now` is the cache-hit path the HTTP edge
calls before making a task (:mod:`.edge`): the same checks and the same answer, log
line and metrics, for a review the pipeline can answer without awaiting anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from authn_gateway.edge.callerauth import CALLER_KEY, CERT_NAMES_KEY, CallerAuth
from authn_gateway.kube_status import render_error
from authn_gateway.observe.audit import AuditLog
from authn_gateway.observe.internal_errors import internal_error
from authn_gateway.observe.reviewlog import ReviewLog
from authn_gateway.review.pipeline import GATEWAY
from authn_gateway.review.tokenreview import (
    Answer,
    BadReview,
    ReviewRequest,
    parse_review,
    render_verdict,
)
from authn_gateway.serve.gateway import Gateway
from backends.base import Authenticated, Verdict

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
# Cached answers kept rendered (a few hundred bytes each).
RENDERED_ANSWERS = 10_000


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
        self.markers = gateway.markers
        self.metrics = gateway.metrics
        self.max_body = gateway.config.server.max_body_bytes
        self.review_log = review_log
        self.callers = CallerAuth(gateway.config.server)
        audit_to = gateway.config.server.audit_log
        queue_lines = gateway.config.logging.audit_queue_lines
        self.audit_log = AuditLog(audit_to, queue_lines) if audit_to else None
        # Reviews running now; a config reload closes the old gateway once this is 0.
        self.in_flight = 0
        # Answers to cached outcomes, rendered once: (api_version, backend, stale,
        # audiences, id(outcome)) -> (outcome, answer). The outcome is kept and compared
        # by identity, so an id is never mistaken for a later object's.
        self._rendered: dict[tuple[str, str, bool, tuple[str, ...], int], tuple[Any, Answer]] = {}

    def _refusal(self, scope: Scope) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        """Why the request is refused before its body is read (status, message, headers)."""
        headers = _headers(scope)
        if self.callers.required:
            # Before anything else: an unknown caller learns nothing and costs nothing.
            caller = self.callers.identify(
                scope.get(CERT_NAMES_KEY, ()), headers.get(b"authorization")
            )
            if caller is None:
                return 401, "caller not authenticated", [(b"www-authenticate", b"Bearer")]
            scope[CALLER_KEY] = caller
        if scope["method"] != "POST":
            return 405, "method must be POST", [(b"allow", b"POST")]
        content_type = headers.get(b"content-type", b"")
        if (
            content_type != b"application/json"
            and content_type.split(b";", 1)[0].strip().lower() != b"application/json"
        ):
            return 400, "Content-Type must be application/json", []
        encoding = headers.get(b"content-encoding")
        if encoding is not None and encoding.strip().lower() != b"identity":
            return 400, "Content-Encoding is not supported", []
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return 413, f"body larger than {self.max_body} bytes", []
        return None

    def answer_now(self, scope: Scope, body: bytes) -> bytes | None:
        """The answer to a whole request, if it is a review the pipeline answers without
        awaiting (a cache hit); else None, having changed nothing (no metric, no log
        line): the request then goes through :meth:`__call__`, which refuses or asks."""
        if self._refusal(scope) is not None or len(body) > self.max_body:
            return None
        try:
            review = parse_review(body)
        except Exception:
            return None  # BadReview, or a bug of ours: the ASGI path answers (and logs) it
        started = time.perf_counter()
        try:
            verdict = self.pipeline.review_now(review.token, review.audiences)
        except Exception:
            return None  # answered (internal error, counted) by the ASGI path
        if verdict is None:
            return None
        return self._answer(review, verdict, caller_identity(scope), started)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            review = await self._read_review(scope, receive, send)
        except Exception as exc:
            # A bug of ours before the review was read: a request we cannot read is a
            # 400 by the answer rules (kube-apiserver does not retry it), never a 500.
            internal_error(GATEWAY, exc, self.metrics)
            await self._refuse(send, 400, "request could not be read (internal error, logged)")
            return
        if review is None:
            return  # refused, or the client went away

        started = time.perf_counter()
        caller = caller_identity(scope)
        try:
            verdict = await self.pipeline.review(review.token, review.audiences, caller)
        except Exception as exc:
            # Last line of defence: the answer rules never allow a 500.
            verdict = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
        try:
            body = self._answer(review, verdict, caller, started)
        except Exception as exc:
            # Rendering, counting or logging failed: the error answer, rendered alone.
            verdict = Verdict(internal_error(GATEWAY, exc, self.metrics), GATEWAY)
            body = render_verdict(review.api_version, verdict).body
        await _send(send, 200, body)

    async def _read_review(
        self, scope: Scope, receive: Receive, send: Send
    ) -> ReviewRequest | None:
        """The request's review, or None once it was refused (or its client left)."""
        refusal = self._refusal(scope)
        if refusal is not None:
            await self._refuse(send, *refusal)
            return None
        try:
            body = await _read_body(receive, self.max_body)
        except TooLarge:
            await self._refuse(send, 413, f"body larger than {self.max_body} bytes")
            return None
        except ConnectionResetError:
            return None
        try:
            return parse_review(body)
        except BadReview as exc:
            await self._refuse(send, 400, str(exc))
            return None

    def _answer(
        self, review: ReviewRequest, verdict: Verdict, caller: str, started: float
    ) -> bytes:
        """The answer's body; counts and logs the review."""
        outcome = verdict.outcome
        body, answer = self._render(review.api_version, verdict)
        elapsed = time.perf_counter() - started
        self.metrics.review(review.api_version, verdict.backend, answer, elapsed)
        if self.review_log is None and self.audit_log is None:
            return body
        token_id = self.gateway.hasher.token_id(review.token)
        if self.review_log is not None:
            user = (
                outcome.user.username
                if isinstance(outcome, Authenticated)
                else getattr(outcome, "username", None)  # a denied user
            )
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
        return body

    def _render(self, api_version: str, verdict: Verdict) -> Answer:
        if not verdict.cached:
            return render_verdict(api_version, verdict, self.markers)
        outcome = verdict.outcome
        key = (api_version, verdict.backend, verdict.stale, verdict.audiences, id(outcome))
        known = self._rendered.get(key)
        if known is not None and known[0] is outcome:
            return known[1]
        answer = render_verdict(api_version, verdict, self.markers)
        if len(self._rendered) >= RENDERED_ANSWERS:
            self._rendered.clear()  # bounded; the hot set renders itself again at once
        self._rendered[key] = (outcome, answer)
        return answer

    def close_logs(self) -> None:
        if self.review_log is not None:
            self.review_log.flush()
        if self.audit_log is not None:
            self.audit_log.close()

    async def _refuse(
        self, send: Send, status: int, message: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        self.metrics.bad_requests.labels(str(status)).inc()
        await _send(send, status, render_error(status, message), extra)
