"""What both webhook endpoints (TokenReview, SubjectAccessReview) do with a request
before its body means anything: the caller check, the method, content type and
encoding, the size; reading the body within its bound; sending a JSON answer.

Each check refuses as the answer rules say (README): 401 for an unknown caller before
anything else (it learns nothing and costs nothing), 405, 400, 413; a refusal is a
Kubernetes Status (kube_status.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from authn_gateway.edge.callerauth import CALLER_KEY, CERT_NAMES_KEY, CallerAuth
from authn_gateway.kube_status import render_error
from authn_gateway.observe.internal_errors import internal_error
from authn_gateway.observe.metrics import Metrics
from authn_gateway.serve.metrics import ServeMetrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]

#: A refusal before the body is read: (status, message, extra headers).
HeadRefusal = tuple[int, str, list[tuple[bytes, bytes]]]


class TooLarge(Exception):
    pass


@dataclass(slots=True)
class Reply:
    """A refusal: an HTTP status and a Kubernetes Status. (A 200 is its body alone.)"""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class Refusals:
    """A webhook's refusals, counted (authn_gateway_bad_requests_total) as they are made."""

    def __init__(self, metrics: Metrics, where: str) -> None:
        self.metrics = metrics
        self.where = where
        self.serving = metrics.group(ServeMetrics)

    def refused(
        self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
    ) -> Reply:
        self.serving.bad_request(status)
        return Reply(status, render_error(status, message), headers or [])

    def unreadable(self, exc: Exception) -> Reply:
        """A bug of ours before the request was read: a 400 by the answer rules
        (kube-apiserver does not retry it), never a 500; logged once per kind, counted."""
        internal_error(self.where, exc, self.metrics)
        return self.refused(400, "request could not be read (internal error, logged)")


# The request headers the webhook paths read; one pass collects them.
_WANTED = frozenset({b"content-type", b"content-encoding", b"content-length", b"authorization"})


def wanted_headers(scope: Scope) -> dict[bytes, bytes]:
    return {k: bytes(v) for k, v in scope["headers"] if k in _WANTED}


def head_refusal(scope: Scope, callers: CallerAuth, max_body: int) -> HeadRefusal | None:
    """Why the request is refused before its body is read, else None. A caller who
    authenticated is named in the scope (``CALLER_KEY``)."""
    headers = wanted_headers(scope)
    if callers.required:
        caller = callers.identify(scope.get(CERT_NAMES_KEY, ()), headers.get(b"authorization"))
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
    if declared is not None and declared.isdigit() and int(declared) > max_body:
        return 413, f"body larger than {max_body} bytes", []
    return None


async def send_json(
    send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = JSON_HEADERS + [(b"content-length", str(len(body)).encode())] + (extra or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int) -> bytes:
    """The body, never held past ``limit`` bytes (:class:`TooLarge`); ConnectionResetError
    if the client went away."""
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


class RequestGate:
    """Both webhooks' way in: the head's checks (:func:`head_refusal`), then the body
    within its bound, each refusal counted once; a bug of ours there is a 400."""

    def __init__(self, callers: CallerAuth, max_body: int, refusals: Refusals) -> None:
        self.callers = callers
        self.max_body = max_body
        self.refusals = refusals

    def head(self, scope: Scope) -> Reply | None:
        try:
            refused = head_refusal(scope, self.callers, self.max_body)
        except Exception as exc:
            return self.refusals.unreadable(exc)
        return None if refused is None else self.refusals.refused(*refused)

    def whole(self, scope: Scope, body: bytes) -> Reply | None:
        """A request that arrived whole: why it is refused, or None."""
        refusal = self.head(scope)
        if refusal is None and len(body) > self.max_body:
            return self.too_large()
        return refusal

    async def read(self, scope: Scope, receive: Receive) -> bytes | Reply | None:
        """A request that did not arrive whole: refused before its body is read, or its
        body (None: the client went away)."""
        refusal = self.head(scope)
        if refusal is not None:
            return refusal
        try:
            return await read_body(receive, self.max_body)
        except TooLarge:
            return self.too_large()
        except ConnectionResetError:
            return None

    def too_large(self) -> Reply:
        return self.refusals.refused(413, f"body larger than {self.max_body} bytes")
